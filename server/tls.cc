#include "server/tls.h"

#include <fstream>
#include <sstream>

#include "grpcpp/security/server_credentials.h"

namespace fusedserve {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("--" + flag + ": cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError("--" + flag + ": '" + path + "' is not a PEM file");
  }
  return ss.str();
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
  absl::StatusOr<std::string> cert = ReadPem(o.cert_path, "tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(o.key_path, "tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.client_ca_path.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(o.client_ca_path, "tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace fusedserve
