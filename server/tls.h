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

// INVALID_ARGUMENT for an incomplete combination, NOT_FOUND for unreadable files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsOptions& options);

}  // namespace fusedserve
