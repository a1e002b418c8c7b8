// TLS and mutual TLS on the gRPC port, with certificates generated for the
// test by the openssl command line tool (a throwaway CA, a server certificate
// for localhost/127.0.0.1 and a client certificate).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "server/validation.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::ServerProcess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the server binary with `flags` until it exits (killed after 20 s);
// its exit code (-1 if killed) and its output.
int RunServer(const std::string& flags, std::string* output) {
  const char* bin = std::getenv("FUSEDSERVE_BIN");
  if (bin == nullptr) return -2;
  char tmpl[] = "/tmp/fusedserve-tls-out-XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  const std::string cmd = "timeout -s KILL 20 " + std::string(bin) +
                          " --device=cpu --listen=127.0.0.1:0 --metrics_listen= --tuning_cache= " + flags + " >" +
                          tmpl + " 2>&1";
  const int status = std::system(cmd.c_str());
  *output = ReadFile(tmpl);
  unlink(tmpl);
  return WIFEXITED(status) && WEXITSTATUS(status) != 137 ? WEXITSTATUS(status) : -1;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/fusedserve-tls-XXXXXX";
    dir_ = new std::string(mkdtemp(tmpl));
    {
      std::ofstream script(*dir_ + "/make-certs.sh");
      script << "set -e\n"
             << "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
                "-subj /CN=fusedserve-test-ca\n"
             << "for who in server client; do\n"
             << "  openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj /CN=localhost\n"
             << "  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n'"
                " > $who.ext\n"
             << "  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 2 "
                "-extfile $who.ext\n"
             << "done\n";
    }
    ok_ = std::system(("cd " + *dir_ + " && bash make-certs.sh >/dev/null 2>&1").c_str()) == 0;
  }
  static void TearDownTestSuite() {
    std::system(("rm -rf " + *dir_).c_str());
    delete dir_;
  }
  void SetUp() override {
    if (!ok_) GTEST_SKIP() << "openssl could not generate test certificates";
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }

  static std::shared_ptr<grpc::ChannelCredentials> Tls(bool with_client_cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadFile(Path("ca.pem"));
    if (with_client_cert) {
      o.pem_private_key = ReadFile(Path("client.key"));
      o.pem_cert_chain = ReadFile(Path("client.pem"));
    }
    return grpc::SslCredentials(o);
  }

  static grpc::Status CallRmsNorm(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = v1::FusedServe::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::FusedOpResponse resp;
    return stub->FusedOp(&ctx, OpRequestToProto(MakeRandomRequest("rms_norm", DType::kF32, {2, 8}, 1)), &resp);
  }

  static std::string* dir_;
  static bool ok_;
};
std::string* TlsTest::dir_ = nullptr;
bool TlsTest::ok_ = false;

TEST_F(TlsTest, TlsServesTlsClientsOnly) {
  std::unique_ptr<ServerProcess> server =
      ServerProcess::Start({"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("server.key")}, 60, Tls(false));
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(CallRmsNorm(server->channel()).ok());
  grpc::Status plain = CallRmsNorm(server->NewChannel(nullptr));
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  // /metrics on 127.0.0.1 is private: no warning.
  EXPECT_EQ(server->Log().find("plain HTTP"), std::string::npos) << server->Log();
}

// Plain /metrics on a routable address beside a TLS gRPC port is logged.
TEST_F(TlsTest, PlainMetricsOnRoutableAddressIsWarned) {
  std::unique_ptr<ServerProcess> server =
      ServerProcess::Start({"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("server.key"),
                            "--metrics_listen=0.0.0.0:" + std::to_string(testing::FreePort())},
                           60, Tls(false));
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server->Log().find("gRPC uses TLS but /metrics is plain HTTP on 0.0.0.0:"), std::string::npos)
      << server->Log();
}

// A key of another certificate used to surface as "cannot listen on ...".
TEST_F(TlsTest, KeyOfAnotherCertificateIsNamed) {
  std::string out;
  EXPECT_EQ(RunServer("--tls_cert=" + Path("server.pem") + " --tls_key=" + Path("client.key"), &out), 1);
  EXPECT_NE(out.find("--tls_key: the private key in '" + Path("client.key") +
                     "' does not match the certificate in --tls_cert '" + Path("server.pem") + "'"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("cannot listen"), std::string::npos) << out;
}

TEST_F(TlsTest, UnparseableTlsFilesAreNamed) {
  std::string out;
  // A certificate where the key belongs.
  EXPECT_EQ(RunServer("--tls_cert=" + Path("server.pem") + " --tls_key=" + Path("client.pem"), &out), 1);
  EXPECT_NE(out.find("--tls_key: '" + Path("client.pem") + "' holds no usable PEM private key"), std::string::npos)
      << out;
  // A key where the certificate belongs.
  EXPECT_EQ(RunServer("--tls_cert=" + Path("server.key") + " --tls_key=" + Path("server.key"), &out), 1);
  EXPECT_NE(out.find("--tls_cert: '" + Path("server.key") + "' holds no PEM certificate"), std::string::npos) << out;
}

// TLS files are read through ReadRegularFile: a FIFO is refused at once
// instead of blocking start-up forever.
TEST_F(TlsTest, FifoAsKeyIsRefused) {
  const std::string fifo = Path("key.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string out;
  EXPECT_EQ(RunServer("--tls_cert=" + Path("server.pem") + " --tls_key=" + fifo, &out), 1);
  EXPECT_NE(out.find("--tls_key: " + fifo + " is a FIFO"), std::string::npos) << out;
  unlink(fifo.c_str());
}

TEST_F(TlsTest, MutualTlsRequiresClientCertificate) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(
      {"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("server.key"), "--tls_client_ca=" + Path("ca.pem")}, 60,
      Tls(true));
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(CallRmsNorm(server->channel()).ok());
  grpc::Status anonymous = CallRmsNorm(server->NewChannel(Tls(false)));
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAVAILABLE) << anonymous.error_message();
}

TEST_F(TlsTest, IncompleteTlsFlagsStopStartup) {
  const char* bin = std::getenv("FUSEDSERVE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string cmd = std::string(bin) + " --device=cpu --listen=127.0.0.1:0 --metrics_listen= --tuning_cache= " +
                          "--tls_cert=" + Path("server.pem") + " >/dev/null 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace fusedserve
