// Minimal timestamped logging to stderr (this Abseil release has no absl/log).
#pragma once

#include <string>

namespace fusedserve {

void LogInfo(const std::string& message);
void LogWarning(const std::string& message);
void LogError(const std::string& message);

}  // namespace fusedserve
