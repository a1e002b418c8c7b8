// The op vocabulary and the op registry: what an op is, in one place.
//
// A request is an op name, named input tensors and named attributes. Each op
// is described once, by an OpSpec: its vocabulary (inputs, attributes with
// defaults, outputs), its rules (shape and attribute checks), what it costs
// (output shapes, flops, working memory), how it is tuned (the tuning key,
// its dim names and buckets, a small key for smoke runs), how the batcher
// merges it (RowLayout), the inputs of a random request for a tuning key
// (tests, benchmarks and the autotuner build from the same description), and
// its CPU reference entry. The layers read these fields instead of testing
// the op name.
//
// Where it lives:
//   kernels/op.h, op.cc          OpSpec, the generic code over it (EstimateCost,
//                                MakeRandomRequest, ...) and AllOpSpecs(): the
//                                one table of ops, in the README's op-table order.
//   kernels/ops/<family>.cc      each family's OpSpecs (norm.cc: four ops), with
//                                the CPU entry calling kernels/cpu/reference.h.
//   kernels/cuda/<family>_op.cc  the family's CUDA entry (CudaOp: dispatch and
//                                tuning candidates, kernels/cuda/dispatch.h),
//                                listed by op name in the CUDA table and found
//                                by OpSpec::id (kernels/ cannot depend on CUDA).
// Adding an op touches its family's files, AllOpSpecs and the CUDA table.
//
// A request is resolved to its OpSpec once, by validation (or by
// MakeRandomRequest): OpRequest::spec. Code past validation reads r.spec and
// never searches by name; FindOpSpec is for names from elsewhere (flags,
// envelope and cache files) and for the FusedOp request's op name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace fusedserve {

using AttrValue = std::variant<double, int64_t, std::string, bool>;
using Attrs = std::map<std::string, AttrValue>;
using TensorMap = std::map<std::string, HostTensor>;

struct OpSpec;
namespace cpu {
struct OpCall;  // kernels/cpu/reference.h
}

// A validated op call: every required input present with consistent shapes,
// every attribute present (defaults filled in) and of the right kind.
struct OpRequest {
  std::string op;
  const OpSpec* spec = nullptr;  // set by validation (and MakeRandomRequest)
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
  // The inputs' and outputs' elements, set before OpSpec::add_cost runs
  // (a memory-bound op's flops are a handful per element).
  double elements = 0;
};

// How the batcher lines an op's inputs up with rows (tokens).
struct RowLayout {
  // View every concatenated input as [numel / last, last] (row-wise ops, whose
  // result does not depend on the leading dims' structure).
  bool flatten = false;
  // Inputs concatenated along dim 0 (the rest must be byte-identical).
  std::vector<std::string> concat;
  // The input whose dim 0 (or flattened rows) counts toward max_rows.
  std::string primary;
};

// One input of the request an op builds for a tuning key.
struct InputDesc {
  InputDesc(std::string n, std::vector<int64_t> s, bool tok = false, float l = -1.0f, float h = 1.0f)
      : name(std::move(n)), shape(std::move(s)), token(tok), lo(l), hi(h) {}
  std::string name;
  std::vector<int64_t> shape;
  bool token = false;           // the leading dim is the token dim (the tuner tiles it)
  float lo = -1.0f, hi = 1.0f;  // float inputs: uniform in [lo, hi)
  std::vector<int64_t> values;  // index inputs: the values
};

using OutputShapeList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

struct OpSpec {
  // ---- vocabulary (validation, GetServerInfo) ----
  std::string name;
  std::vector<std::string> inputs;           // required
  std::vector<std::string> optional_inputs;  // may be absent
  std::vector<std::string> index_inputs;     // I32/I64 inputs (positions, lengths)
  std::vector<AttrSpec> attrs;
  std::vector<std::string> outputs;

  // ---- tuning ----
  // Names of the TuningKey dims ("M", "H"); the first is the token (row)
  // count. The dims in bucket_dims are rounded up to a power of two by the
  // tuning cache (the token dim; decode's cache length too).
  std::vector<std::string> key_dims;
  std::vector<int> bucket_dims = {0};

  // ---- scheduling ----
  RowLayout layout;
  // One pass over memory (norms, softmax, activations, rope): a small request
  // may run inline on the gRPC thread (server/scheduler.h RunsInline).
  bool memory_bound = false;

  // ---- rules and facts, one function each (all set unless noted) ----
  // Shapes and index values, once the generic checks (names, dtypes) passed.
  absl::Status (*check_shapes)(const OpRequest& r) = nullptr;
  // Attribute ranges, once every attribute is present and of its kind.
  absl::Status (*check_attrs)(const OpRequest& r) = nullptr;
  // Makes shape-dependent defaults explicit (attention's scale 0 -> 1/sqrt(D)).
  // May be null.
  void (*resolve_attrs)(OpRequest& r) = nullptr;
  OutputShapeList (*output_shapes)(const OpRequest& r) = nullptr;
  // The dims the op's kernel config depends on (key_dims).
  std::vector<int64_t> (*tuning_key)(const OpRequest& r) = nullptr;
  // Rules on a key from a file beyond rank and range (GQA ratio). May be null.
  absl::Status (*check_key)(const std::vector<int64_t>& key) = nullptr;
  // A small key of the same kind (token dim 1, other dims capped) for a quick
  // functional run.
  std::vector<int64_t> (*small_key)(const std::vector<int64_t>& key) = nullptr;
  // The inputs of a valid request for a key: random values in [lo, hi),
  // positions 0..T-1, one sequence for attention, lengths = L for decode.
  std::vector<InputDesc> (*inputs_for_key)(const std::vector<int64_t>& key) = nullptr;
  // Flops and intermediates beyond EstimateCost's generic bytes (fp32
  // copies of inputs and outputs).
  void (*add_cost)(const OpRequest& r, OpCost* cost) = nullptr;
  // The CPU reference (kernels/cpu/reference.h).
  absl::Status (*run_cpu)(const cpu::OpCall& call) = nullptr;

  int id = -1;  // position in AllOpSpecs() (set by the table)

  bool is_index(const std::string& input) const;  // listed in index_inputs
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

OpCost EstimateCost(const OpRequest& request);

// The softmax scale of attention / attention_decode: the "scale" attribute,
// or 1/sqrt(head dim) when it is 0 (its default).
double AttentionScale(const OpRequest& r);

// A valid request for (op, dtype, TuningKey) with fresh random inputs (seeded)
// as the op's inputs_for_key describes them; attributes at their defaults,
// shape-dependent ones resolved. Used by tests, benchmarks and the autotuner.
OpRequest MakeRandomRequest(const std::string& op, DType dtype, const std::vector<int64_t>& key, uint64_t seed);

// Returns the tuned config string for (op, dtype, TuningKey), or "" to use
// the op's default config. Supplied by the warm-up layer (tuning cache) to
// the CUDA backend; the CPU backend has nothing to tune.
using ConfigLookup = std::function<std::string(const std::string& op, DType dtype, const std::vector<int64_t>& key)>;

// Activation epilogue of linear.
enum class Activation { kNone, kGeluErf, kGeluTanh, kSilu };
Activation ParseActivation(const std::string& s);  // from a validated attribute

}  // namespace fusedserve
