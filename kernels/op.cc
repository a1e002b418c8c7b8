// The op table and the generic code over OpSpecs (see op.h for the design).
#include "kernels/op.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/backend.h"
#include "kernels/ops/ops.h"

namespace fusedserve {

const std::vector<OpSpec>& AllOpSpecs() {
  static const std::vector<OpSpec>* specs = [] {
    auto* all = new std::vector<OpSpec>;
    // The table: one line per family, in the README's op-table order.
    for (auto family : {ops::NormOps, ops::SoftmaxOps, ops::ActivationOps, ops::RopeOps, ops::LinearOps,
                        ops::SwigluMlpOps, ops::AttentionOps}) {
      for (OpSpec& s : family()) all->push_back(std::move(s));
    }
    for (size_t i = 0; i < all->size(); ++i) (*all)[i].id = static_cast<int>(i);
    return all;
  }();
  return *specs;
}

const OpSpec* FindOpSpec(const std::string& op) {
  // The names inline in one contiguous table, scanned in order: a FusedOp
  // request's first lookup meets cold caches, where this is a few adjacent
  // lines against a hash map's hash code, bucket and node (fused_op_host_bench
  // "cold" rows: ~0.7 us on the 2-core machine).
  struct Entry {
    const OpSpec* spec;
    uint32_t size;  // of the name; kLong: longer than `name` holds (compared through spec->name)
    char name[20];
  };
  constexpr uint32_t kLong = ~0u;
  static const std::vector<Entry>* table = [] {
    auto* t = new std::vector<Entry>;
    for (const OpSpec& s : AllOpSpecs()) {
      Entry e{&s, static_cast<uint32_t>(s.name.size()), {}};
      if (s.name.size() > sizeof(e.name)) e.size = kLong;
      std::memcpy(e.name, s.name.data(), std::min(s.name.size(), sizeof(e.name)));
      t->push_back(e);
    }
    return t;
  }();
  for (const Entry& e : *table) {
    if (e.size == kLong ? e.spec->name == op : e.size == op.size() && std::memcmp(e.name, op.data(), op.size()) == 0)
      return e.spec;
  }
  return nullptr;
}

bool OpSpec::is_index(const std::string& input) const {
  for (const std::string& n : index_inputs) {
    if (n == input) return true;
  }
  return false;
}

Activation ParseActivation(const std::string& s) {
  if (s == "gelu") return Activation::kGeluErf;
  if (s == "gelu_tanh") return Activation::kGeluTanh;
  if (s == "silu") return Activation::kSilu;
  return Activation::kNone;
}

OutputShapeList OutputShapes(const OpRequest& r) { return r.spec->output_shapes(r); }

std::vector<int64_t> TuningKey(const OpRequest& r) { return r.spec->tuning_key(r); }

namespace {

double Numel(const std::vector<int64_t>& shape) {
  double n = 1;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

double InputElems(const OpRequest& r) {
  double n = 0;
  for (const auto& [name, t] : r.inputs) n += Numel(t.shape);
  return n;
}

}  // namespace

OpCost EstimateCost(const OpRequest& r) {
  OpCost c;
  const double elem = static_cast<double>(DTypeSize(RequestDType(r)));
  double out_elems = 0;
  for (const auto& [name, shape] : OutputShapes(r)) out_elems += Numel(shape);
  c.output_bytes = out_elems * elem;
  // fp32 copies of every input and output, and the outputs in the request dtype.
  c.elements = InputElems(r) + out_elems;
  c.scratch_bytes = 4 * c.elements + c.output_bytes;
  r.spec->add_cost(r, &c);
  return c;
}

DType RequestDType(const OpRequest& r) {
  for (const auto& [name, t] : r.inputs) {
    if (IsFloat(t.dtype)) return t.dtype;
  }
  return DType::kF32;
}

double AttentionScale(const OpRequest& r) {
  const double s = r.f("scale");
  return s != 0.0 ? s : 1.0 / std::sqrt(static_cast<double>(r.in("q").dim(-1)));
}

OpRequest MakeRandomRequest(const std::string& op, DType dtype, const std::vector<int64_t>& key, uint64_t seed) {
  std::mt19937_64 rng(seed);
  OpRequest r;
  r.op = op;
  r.spec = FindOpSpec(op);
  for (const AttrSpec& a : r.spec->attrs) r.attrs[a.name] = a.default_value;
  for (InputDesc& in : r.spec->inputs_for_key(key)) {
    if (r.spec->is_index(in.name)) {
      r.inputs[in.name] = HostTensor::FromInt64(DType::kI64, std::move(in.shape), in.values);
      continue;
    }
    std::uniform_real_distribution<float> dist(in.lo, in.hi);
    std::vector<float> v(static_cast<size_t>(Numel(in.shape)));
    for (float& x : v) x = dist(rng);
    r.inputs[in.name] = HostTensor::FromFloat(dtype, std::move(in.shape), v);
  }
  if (r.spec->resolve_attrs) r.spec->resolve_attrs(r);
  return r;
}

}  // namespace fusedserve
