// The op vocabulary shared by the server, the backends, the batcher and the
// tuner: a request is an op name, named input tensors and named attributes.
// OpSpec lists, per op, its inputs, attributes with defaults and outputs; it
// is the single source of truth for validation and GetServerInfo.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "kernels/tensor.h"

namespace fusedserve {

using AttrValue = std::variant<double, int64_t, std::string, bool>;
using Attrs = std::map<std::string, AttrValue>;
using TensorMap = std::map<std::string, HostTensor>;

// A validated op call: every required input present with consistent shapes,
// every attribute present (defaults filled in) and of the right kind.
struct OpRequest {
  std::string op;
  TensorMap inputs;
  Attrs attrs;

  const HostTensor& in(const std::string& name) const { return inputs.at(name); }
  bool has(const std::string& name) const { return inputs.count(name) != 0; }
  double f(const std::string& name) const { return std::get<double>(attrs.at(name)); }
  bool b(const std::string& name) const { return std::get<bool>(attrs.at(name)); }
  const std::string& s(const std::string& name) const { return std::get<std::string>(attrs.at(name)); }
};

struct AttrSpec {
  std::string name;
  AttrValue default_value;           // also fixes the attribute's kind
  std::vector<std::string> choices;  // allowed values for string attributes
};

struct OpSpec {
  std::string name;
  std::vector<std::string> inputs;           // required
  std::vector<std::string> optional_inputs;  // may be absent
  std::vector<std::string> index_inputs;     // I32/I64 inputs (positions, lengths)
  std::vector<AttrSpec> attrs;
  std::vector<std::string> outputs;
};

// All ops, in the order of the README's op table.
const std::vector<OpSpec>& AllOpSpecs();
// nullptr when the op is unknown.
const OpSpec* FindOpSpec(const std::string& op);

// The dims an op's kernel config depends on; the first is always the token
// (row) count, which the tuning cache rounds up to a power-of-two bucket.
//   norms {M,H}  softmax {M,N}  silu_and_mul {M,I}  gelu {M,last}
//   rope {T,Hq,Hkv,D}  linear {M,N,K}  swiglu_mlp {M,D,I}
//   attention {T,Hq,Hkv,D}  attention_decode {B,L,Hq,Hkv,D}
std::vector<int64_t> TuningKey(const OpRequest& request);

// A valid request for (op, dtype, TuningKey) with fresh random inputs (seeded):
// values in [-1, 1) (weights near 1 for norms), positions 0..T-1, one
// sequence for attention, lengths = L for decode. Attributes at defaults
// (linear: activation "none"). Used by tests, benchmarks and the autotuner.
// What a validated request will cost, from its shapes alone, before anything
// runs: the server bounds it (server/validation.h) so that a small request
// cannot ask for a huge output, intermediate or amount of work. Doubles, so
// no product of client-chosen dims can overflow.
struct OpCost {
  double output_bytes = 0;  // the response's tensors, in the request's dtype
  // Working memory of the most demanding backend: fp32 copies of inputs and
  // outputs (CPU reference) or device buffers (CUDA), plus intermediates
  // such as swiglu_mlp's [M, 2I] activations.
  double scratch_bytes = 0;
  double flops = 0;  // a multiply-add counts 2
};
OpCost EstimateCost(const OpRequest& request);

// The softmax scale of attention / attention_decode: the "scale" attribute,
// or 1/sqrt(head dim) when it is 0 (its default).
double AttentionScale(const OpRequest& r);

OpRequest MakeRandomRequest(const std::string& op, DType dtype, const std::vector<int64_t>& key, uint64_t seed);

// Returns the tuned config string for (op, dtype, TuningKey), or "" to use
// the op's default config. Supplied by the warm-up layer (tuning cache) to
// the CUDA backend; the CPU backend has nothing to tune.
using ConfigLookup = std::function<std::string(const std::string& op, DType dtype, const std::vector<int64_t>& key)>;

// Activation epilogue of linear.
enum class Activation { kNone, kGeluErf, kGeluTanh, kSilu };
Activation ParseActivation(const std::string& s);  // from a validated attribute

}  // namespace fusedserve
