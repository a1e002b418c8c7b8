// libFuzzer target, structured: the input bytes choose an op, a dtype and a
// small shape, build a valid request (MakeRandomRequest), then apply a list
// of mutations a confused or hostile client could make (dims changed with the
// data resized to match, inputs dropped, added or retyped, index values
// rewritten, attributes of the wrong kind or value, NaN/Inf payloads). Unlike
// raw protobuf bytes, nearly every input gets past the byte-length check, so
// the shape, index and attribute rules and the backend are what get fuzzed.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "tests/fuzz/fuzz_common.h"

namespace fusedserve {
namespace {

int64_t SmallDim(FuzzedDataProvider& in) { return in.ConsumeIntegralInRange<int64_t>(1, 9); }

// A dimension as a hostile client might send it.
int64_t AnyDim(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return 0;
    case 1:
      return -in.ConsumeIntegralInRange<int64_t>(1, 3);
    case 2:
      return std::numeric_limits<int64_t>::max();
    case 3:
      return int64_t{1} << in.ConsumeIntegralInRange(20, 62);
    case 4:
      return int64_t{1} << in.ConsumeIntegralInRange(8, 22);  // realistic large sizes
    default:
      return SmallDim(in);
  }
}

double AnyDouble(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 6)) {
    case 0:
      return std::nan("");
    case 1:
      return INFINITY;
    case 2:
      return -INFINITY;
    case 3:
      return 0.0;
    case 4:
      return -in.ConsumeFloatingPoint<double>();
    default:
      return in.ConsumeFloatingPoint<double>();
  }
}

void Mutate(FuzzedDataProvider& in, v1::FusedOpRequest& p) {
  static const char* kNames[] = {"x",         "weight",   "residual", "bias",    "q",           "k",          "v",
                                 "positions", "seq_lens", "lengths",  "k_cache", "v_cache",     "gate_up",    "down",
                                 "eps",       "theta",    "scale",    "causal",  "approximate", "activation", ""};
  auto name = [&] { return std::string(kNames[in.ConsumeIntegralInRange<size_t>(0, std::size(kNames) - 1)]); };
  auto tensor = [&]() -> v1::Tensor* {
    if (p.inputs().empty()) return nullptr;
    auto it = p.mutable_inputs()->begin();
    std::advance(it, in.ConsumeIntegralInRange<size_t>(0, p.inputs_size() - 1));
    return &it->second;
  };
  // Keeps the byte length consistent with dtype and shape (up to realistic
  // request sizes, 4M elements), so that validation looks further than the
  // length check and a few-MiB tensor with a huge dim (a [2^20, 1] linear
  // input) reaches the cost bounds and the backend.
  auto fit = [&](v1::Tensor* t) {
    int64_t n = 1;
    for (int64_t d : t->shape()) {
      if (d < 1 || d > (int64_t{1} << 22) || n * d > (int64_t{1} << 22)) return;
      n *= d;
    }
    const int size =
        t->dtype() == v1::I64 || t->dtype() == v1::F32 || t->dtype() == v1::I32 ? (t->dtype() == v1::I64 ? 8 : 4) : 2;
    t->mutable_data()->resize(static_cast<size_t>(n * size), '\x3c');
  };
  switch (in.ConsumeIntegralInRange(0, 11)) {
    case 0: {  // change one dim
      v1::Tensor* t = tensor();
      if (t == nullptr || t->shape_size() == 0) return;
      t->set_shape(in.ConsumeIntegralInRange(0, t->shape_size() - 1), AnyDim(in));
      if (in.ConsumeBool()) fit(t);
      return;
    }
    case 1: {  // add or drop a dim
      v1::Tensor* t = tensor();
      if (t == nullptr) return;
      if (in.ConsumeBool() || t->shape_size() == 0) {
        t->add_shape(SmallDim(in));
      } else {
        t->mutable_shape()->RemoveLast();
      }
      fit(t);
      return;
    }
    case 2:  // drop an input
      p.mutable_inputs()->erase(name());
      return;
    case 3: {  // add an input (a copy of another, or empty)
      v1::Tensor* t = tensor();
      (*p.mutable_inputs())[name()] = t != nullptr && in.ConsumeBool() ? *t : v1::Tensor();
      return;
    }
    case 4: {  // retype a tensor
      v1::Tensor* t = tensor();
      if (t == nullptr) return;
      t->set_dtype(static_cast<v1::DType>(in.ConsumeIntegralInRange(-1, 7)));
      if (in.ConsumeBool()) fit(t);
      return;
    }
    case 5: {  // overwrite payload bytes (index values, NaNs, anything)
      v1::Tensor* t = tensor();
      if (t == nullptr || t->data().empty()) return;
      std::string bytes = in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(1, 16));
      const size_t at = in.ConsumeIntegralInRange<size_t>(0, t->data().size() - 1);
      for (size_t i = 0; i < bytes.size() && at + i < t->data().size(); ++i) (*t->mutable_data())[at + i] = bytes[i];
      return;
    }
    case 6: {  // set an index tensor to chosen values
      v1::Tensor* t = tensor();
      if (t == nullptr) return;
      const int n = in.ConsumeIntegralInRange(1, 6);
      t->set_dtype(in.ConsumeBool() ? v1::I64 : v1::I32);
      t->clear_shape();
      t->add_shape(n);
      std::string data;
      for (int i = 0; i < n; ++i) {
        const int64_t v = in.ConsumeIntegralInRange<int64_t>(-2, 12);
        if (t->dtype() == v1::I64) {
          data.append(reinterpret_cast<const char*>(&v), 8);
        } else {
          const int32_t v32 = static_cast<int32_t>(v);
          data.append(reinterpret_cast<const char*>(&v32), 4);
        }
      }
      t->set_data(data);
      return;
    }
    case 7: {  // truncate or extend data
      v1::Tensor* t = tensor();
      if (t == nullptr) return;
      t->mutable_data()->resize(in.ConsumeIntegralInRange<size_t>(0, t->data().size() + 8));
      return;
    }
    case 8: {  // attribute of any kind and value
      v1::AttrValue& a = (*p.mutable_attrs())[name()];
      switch (in.ConsumeIntegralInRange(0, 4)) {
        case 0:
          a.set_f(AnyDouble(in));
          break;
        case 1:
          a.set_i(in.ConsumeIntegral<int64_t>());
          break;
        case 2:
          a.set_s(in.ConsumeRandomLengthString(12));
          break;
        case 3:
          a.set_b(in.ConsumeBool());
          break;
        default:
          a.Clear();
          break;
      }
      return;
    }
    case 9:
      p.mutable_attrs()->erase(name());
      return;
    case 10:
      p.set_op(in.ConsumeBool() ? in.ConsumeRandomLengthString(16)
                                : AllOpSpecs()[in.ConsumeIntegralInRange<size_t>(0, AllOpSpecs().size() - 1)].name);
      return;
    default: {  // float payload of NaN/Inf
      v1::Tensor* t = tensor();
      if (t == nullptr || t->dtype() != v1::F32 || t->data().size() < 4) return;
      const float v = in.ConsumeBool() ? std::nanf("") : INFINITY;
      std::memcpy(t->mutable_data()->data(), &v, 4);
      return;
    }
  }
}

}  // namespace
}  // namespace fusedserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusedserve;
  FuzzedDataProvider in(data, size);
  const std::vector<OpSpec>& specs = AllOpSpecs();
  const std::string op = specs[in.ConsumeIntegralInRange<size_t>(0, specs.size() - 1)].name;
  const DType dt = std::array<DType, 3>{DType::kF32, DType::kF16, DType::kBF16}[in.ConsumeIntegralInRange(0, 2)];
  std::vector<int64_t> key;
  const size_t dims = op == "attention_decode"                 ? 5
                      : (op == "rope" || op == "attention")    ? 4
                      : (op == "linear" || op == "swiglu_mlp") ? 3
                                                               : 2;
  for (size_t i = 0; i < dims; ++i) key.push_back(in.ConsumeIntegralInRange<int64_t>(1, 9));
  if (op == "rope" || op == "attention" || op == "attention_decode") {
    // Head dims even and Hq a multiple of Hkv, so the start is valid.
    const size_t d = dims - 1, hq = dims - 3, hkv = dims - 2;
    key[d] *= 2;
    key[hq] = key[hkv] * in.ConsumeIntegralInRange<int64_t>(1, 3);
  }
  OpRequest base = MakeRandomRequest(op, dt, key, in.ConsumeIntegral<uint32_t>());
  if (op == "linear" && in.ConsumeBool()) {
    base.inputs["bias"] = HostTensor::FromFloat(dt, {key[1]}, std::vector<float>(key[1], 0.5f));
  }
  v1::FusedOpRequest p = OpRequestToProto(base);
  const int mutations = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < mutations; ++i) Mutate(in, p);
  absl::StatusOr<OpRequest> r = ValidateFusedOp(p, fuzz::FuzzLimits());
  if (!r.ok()) {
    fuzz::Require(mutations > 0, "an unmutated MakeRandomRequest request validates");
    fuzz::Require(fuzz::IsValidationCode(r.status().code()),
                  "validation fails only with INVALID_ARGUMENT or RESOURCE_EXHAUSTED");
    return 0;
  }
  fuzz::CheckValidated(*r);
  return 0;
}
