// Server credentials for the gRPC port: plaintext by default, TLS with a
// certificate and key, mutual TLS when a client CA bundle is also given.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"

namespace fusedserve {

struct TlsOptions {
  std::string cert_path;       // PEM certificate chain; empty = plaintext
  std::string key_path;        // PEM private key of cert_path
  std::string client_ca_path;  // PEM CA bundle; set = clients must present a certificate it signed
};

// Every file is read as a regular file of at most 4 MiB (a FIFO or device
// is refused, never read), and OpenSSL checks that the certificate and key
// parse and that the key is the certificate's. INVALID_ARGUMENT for an
// incomplete combination or bad TLS material, the file's own error (e.g.
// NOT_FOUND) otherwise; every message names the flag and the path.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsOptions& options);

}  // namespace fusedserve
