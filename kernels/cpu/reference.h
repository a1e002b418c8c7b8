// CPU reference implementations of every op: plain loops, fp32 inputs and
// outputs, fp32 (or wider) accumulation. This is the oracle the CUDA kernels
// are tested against and the CPU backend of the server; it favours clarity
// over speed. All tensors are dense row-major; shapes in the comments.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/op.h"

namespace fusedserve::cpu {

using FloatOutputs = std::map<std::string, std::vector<float>>;

// What an op's CPU entry (OpSpec::run_cpu) gets: the request, its fp32
// outputs (zeroed, sized by OutputShapes), and the pieces it runs in. Work
// goes in pieces of rows (tokens, or sequences for decode) of about 5e7
// flops each, with the stop check polled between them: a cancelled or
// expired request stops within tens of milliseconds.
struct OpCall {
  const OpRequest& r;
  FloatOutputs& out;
  double flops;  // EstimateCost(r).flops
  const StopCheck& stop;

  std::vector<float> In(const std::string& name) const { return r.in(name).ToFloat(); }
  float* Out(const std::string& name) const { return out.at(name).data(); }
  // Calls body(begin, end) over [0, rows) in pieces; stop's status if it fires.
  absl::Status ForEachChunk(int64_t rows, const std::function<void(int64_t, int64_t)>& body) const;
};

// The reference outputs (fp32, by name) of a validated request.
absl::StatusOr<FloatOutputs> RunReference(const OpRequest& r, const StopCheck& stop);

// y = x / sqrt(mean(x^2) + eps) * weight.     x, y [M,H]; weight [H]
void RmsNorm(const float* x, const float* weight, int64_t M, int64_t H, float eps, float* y);

// residual_out = x + residual; y = RmsNorm(residual_out).   all [M,H]
void AddRmsNorm(const float* x, const float* residual, const float* weight, int64_t M, int64_t H, float eps, float* y,
                float* residual_out);

// y = silu(RmsNorm(x + residual)).   all [M,H]
void AddRmsNormSilu(const float* x, const float* residual, const float* weight, int64_t M, int64_t H, float eps,
                    float* y);

// y = (x - mean) / sqrt(var + eps) * weight + bias (biased variance).  x, y [M,H]
void LayerNorm(const float* x, const float* weight, const float* bias, int64_t M, int64_t H, float eps, float* y);

// Row softmax, max-subtracted.   x, y [M,N]
void Softmax(const float* x, int64_t M, int64_t N, float* y);

// y = silu(x[:, :I]) * x[:, I:].   x [M,2I]; y [M,I]
void SiluAndMul(const float* x, int64_t M, int64_t I, float* y);

// Elementwise GELU: erf form, or the tanh approximation.   x, y [n]
void Gelu(const float* x, int64_t n, bool tanh_approx, float* y);

// LLaMA rotate-half RoPE: for pair (i, i + D/2), angle = pos * theta^(-2i/D).
// q, q_out [T,Hq,D]; k, k_out [T,Hkv,D]; positions [T]
void Rope(const float* q, const float* k, const int64_t* positions, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
          double theta, float* q_out, float* k_out);

// y = act(x . weight^T + bias).   x [M,K]; weight [N,K]; bias [N] or nullptr; y [M,N]
void Linear(const float* x, const float* weight, const float* bias, int64_t M, int64_t K, int64_t N, Activation act,
            float* y);

// y = down(silu(x . gate^T) * (x . up^T)) where gate_up = [gate; up].
// x [M,D]; gate_up [2I,D]; down [D,I]; y [M,D]
void SwigluMlp(const float* x, const float* gate_up, const float* down, int64_t M, int64_t D, int64_t I, float* y);

// Attention over packed variable-length sequences (B sequences, seq_lens sum
// to T), GQA: q head h reads kv head h / (Hq/Hkv). Causal masks keys after the
// query's position within its own sequence.
// q, o [T,Hq,D]; k, v [T,Hkv,D]; seq_lens [B]
void Attention(const float* q, const float* k, const float* v, const int64_t* seq_lens, int64_t B, int64_t T,
               int64_t Hq, int64_t Hkv, int64_t D, bool causal, float scale, float* o);

// Attention computing only the output rows [row_begin, row_end) (each still
// reads every key of its sequence that it attends to): lets a caller split a
// long prefill into pieces and check for cancellation between them.
void AttentionRows(const float* q, const float* k, const float* v, const int64_t* seq_lens, int64_t B, int64_t T,
                   int64_t Hq, int64_t Hkv, int64_t D, bool causal, float scale, int64_t row_begin, int64_t row_end,
                   float* o);

// One query token per sequence over that sequence's first lengths[b] cache rows.
// q, o [B,Hq,D]; k_cache, v_cache [B,L,Hkv,D]; lengths [B] (1..L)
void AttentionDecode(const float* q, const float* k_cache, const float* v_cache, const int64_t* lengths, int64_t B,
                     int64_t L, int64_t Hq, int64_t Hkv, int64_t D, float scale, float* o);

// The greedy token: the lowest index of the largest logit; NaN counts as
// lower than every number (the rule of the CUDA argmax, kernels/cuda/argmax.h).
int32_t GreedyToken(const float* logits, int64_t vocab);

}  // namespace fusedserve::cpu
