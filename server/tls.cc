#include "server/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdint>
#include <memory>
#include <string>

#include "grpcpp/security/server_credentials.h"
#include "warmup/regular_file.h"

namespace fusedserve {
namespace {

// Certificate chains and CA bundles are kilobytes; a system CA bundle ~200 KiB.
constexpr int64_t kMaxPemBytes = int64_t{4} << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// The oldest queued OpenSSL error as text (and clears the queue).
std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no details";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

BioPtr MemBio(const std::string& text) { return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size()))); }

// Never prompts on a terminal for an encrypted key's pass phrase: fails instead.
int NoPassphrase(char*, int, int, void*) { return 0; }

absl::StatusOr<PkeyPtr> ParseKey(const std::string& pem, const std::string& path) {
  BioPtr bio = MemBio(pem);
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        "--tls_key: '" + path +
        "' holds no usable PEM private key (encrypted keys are not supported): " + OpenSslError());
  }
  return key;
}

absl::StatusOr<X509Ptr> ParseLeaf(const std::string& pem, const std::string& path) {
  BioPtr bio = MemBio(pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError("--tls_cert: '" + path + "' holds no PEM certificate: " + OpenSslError());
  }
  return cert;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxPemBytes);
  if (!text.ok()) return absl::Status(text.status().code(), "--" + flag + ": " + std::string(text.status().message()));
  if (text->find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError("--" + flag + ": '" + path + "' is not a PEM file");
  }
  return text;
}

// A certificate chain and its private key, read and checked.
struct TlsPem {
  std::string cert_chain;
  std::string key;
};

absl::StatusOr<TlsPem> LoadTlsPem(const TlsOptions& o) {
  TlsPem pem;
  absl::StatusOr<std::string> cert = ReadPem(o.cert_path, "tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(o.key_path, "tls_key");
  if (!key.ok()) return key.status();
  absl::StatusOr<X509Ptr> leaf = ParseLeaf(*cert, o.cert_path);
  if (!leaf.ok()) return leaf.status();
  absl::StatusOr<PkeyPtr> pkey = ParseKey(*key, o.key_path);
  if (!pkey.ok()) return pkey.status();
  // Without this check gRPC only fails to bind and reports "cannot listen".
  if (X509_check_private_key(leaf->get(), pkey->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("--tls_key: the private key in '" + o.key_path +
                                      "' does not match the certificate in --tls_cert '" + o.cert_path +
                                      "' (the key belongs to another certificate)");
  }
  pem.cert_chain = *std::move(cert);
  pem.key = *std::move(key);
  return pem;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsOptions& o) {
  if (o.cert_path.empty() && o.key_path.empty()) {
    if (!o.client_ca_path.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key (mutual TLS is TLS)");
    }
    return grpc::InsecureServerCredentials();
  }
  if (o.cert_path.empty() || o.key_path.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls_cert and --tls_key");
  }
  absl::StatusOr<TlsPem> pem = LoadTlsPem(o);
  if (!pem.ok()) return pem.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({pem->key, pem->cert_chain});
  if (!o.client_ca_path.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(o.client_ca_path, "tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace fusedserve
