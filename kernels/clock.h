// FastNow(): absl::Now() read from the system clock (clock_gettime through
// the vDSO). The FusedOp path reads the clock about 20 times a request for
// its stage histograms and deadlines; on the H200 host's VM absl::Now()
// costs 136 ns a read against 39 for this (fused_op_host_bench), and 70-88
// against 30-36 on the 2-core machine. Same clock, same absl::Time: mixes
// with deadlines from gRPC (system_clock) and with absl::Now().
#pragma once

#include <chrono>

#include "absl/time/time.h"

namespace fusedserve {

inline absl::Time FastNow() { return absl::FromChrono(std::chrono::system_clock::now()); }

}  // namespace fusedserve
