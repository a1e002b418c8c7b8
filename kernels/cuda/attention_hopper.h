// Hopper (sm_90a) flash-attention prefill (kernels/cuda/sm90a/
// attention_hopper.cu): the same problem as LaunchAttentionPrefill's
// mma.sync kernel (packed varlen, GQA, causal or not, D 64/128, bf16/fp16)
// on wgmma fed by TMA. Plain header: no CUDA driver or gRPC types.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"

namespace fusedserve::cuda {

// True when the current device is compute capability 9.0 (the kernel is
// built for sm_90a only); queried once per device and cached.
bool HopperAttentionAvailable();

// Whether the Hopper kernel covers this problem's dtype and head dim.
bool HopperAttentionSupports(DType dtype, int D);

// Kernel knobs. `stages`: K/V shared-memory stages (2 or 3). `sched` 0: each
// key tile's S, softmax and P V in sequence; 1: the softmax of tile j runs
// while the tensor cores do S(j+1) and P(j-1)V (FlashAttention-3's
// intra-warpgroup pipelining); 2: that plus ping-pong between the two
// consumer warpgroups. `stage_o`: O leaves through shared memory as
// coalesced 16-byte row stores (where it fits: not D=128 with 3 stages)
// instead of 4-byte stores from the accumulators. `q_bufs` 2: a second Q
// buffer, so the next query tile's Q loads during this tile's last key
// tiles instead of after its last S (H200, B=4 S=2048: o1 264.5-267.1 us
// instead of 279.4-279.7; 1-4% slower at S >= 4096 or few tiles, so a
// tuning candidate and the default only where it wins).
struct HopperKnobs {
  int stages = 2;
  int sched = 2;
  bool stage_o = true;
  int q_bufs = 1;
};
// Built: stages 2 with sched 1-2 either way and sched 0 staged; stages 3
// with sched 1 staged; two Q buffers with stages 2, sched 1-2, staged.
bool HopperAttentionBuilt(const HopperKnobs& c);
// Validates like LaunchAttentionPrefill; the caller checks availability.
CudaStatus LaunchAttentionHopper(const AttentionParams& p, const HopperKnobs& c, cudaStream_t stream);

}  // namespace fusedserve::cuda
