#include "telemetry/log.h"

#include <cstdio>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fusedserve {
namespace {

void Log(const char* level, const std::string& message) {
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::fprintf(stderr, "%s %s fusedserve: %s\n", ts.c_str(), level, message.c_str());
  std::fflush(stderr);
}

}  // namespace

void LogInfo(const std::string& message) { Log("I", message); }
void LogWarning(const std::string& message) { Log("W", message); }
void LogError(const std::string& message) { Log("E", message); }

}  // namespace fusedserve
