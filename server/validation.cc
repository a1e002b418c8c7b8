#include "server/validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/ops/ops.h"

namespace fusedserve {
namespace {

using ops::Invalid;
using ops::ShapeStr;

}  // namespace

std::string ClientText(absl::string_view s) {
  constexpr size_t kMax = 64;
  if (s.size() <= kMax) return absl::CHexEscape(s);
  return absl::StrCat(absl::CHexEscape(s.substr(0, kMax)), "...(", s.size(), " bytes)");
}

DType FromProtoDType(v1::DType d) {
  switch (d) {
    case v1::F16:
      return DType::kF16;
    case v1::BF16:
      return DType::kBF16;
    case v1::I32:
      return DType::kI32;
    case v1::I64:
      return DType::kI64;
    default:
      return DType::kF32;
  }
}

v1::DType ToProtoDType(DType d) {
  switch (d) {
    case DType::kF32:
      return v1::F32;
    case DType::kF16:
      return v1::F16;
    case DType::kBF16:
      return v1::BF16;
    case DType::kI32:
      return v1::I32;
    case DType::kI64:
      return v1::I64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::Status CheckWireTensor(int dtype, const int64_t* dims, int rank, size_t data_bytes, const std::string& name,
                             const ValidationLimits& limits) {
  if (dtype == v1::DTYPE_UNSPECIFIED || !v1::DType_IsValid(dtype)) {
    return Invalid(absl::StrCat("input '", name, "': dtype must be one of F32, F16, BF16, I32, I64 (got ", dtype, ")"));
  }
  const DType dt = FromProtoDType(static_cast<v1::DType>(dtype));
  if (rank > 8) return Invalid(absl::StrCat("input '", name, "': rank ", rank, " exceeds the maximum of 8"));
  int64_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = dims[i];
    if (d < 1) {
      return Invalid(absl::StrCat("input '", name, "': dimension ", i, " is ", d, ", must be >= 1"));
    }
    if (d > limits.max_tensor_elements || numel > limits.max_tensor_elements / d) {
      return Invalid(absl::StrCat("input '", name, "': shape ", ShapeStr({dims, dims + rank}), " has more than ",
                                  limits.max_tensor_elements, " elements (the server's limit)"));
    }
    numel *= d;
  }
  const int64_t expect = numel * static_cast<int64_t>(DTypeSize(dt));
  if (static_cast<int64_t>(data_bytes) != expect) {
    return Invalid(absl::StrCat("input '", name, "': data has ", data_bytes, " bytes, expected ", expect, " (", numel,
                                " elements of ", DTypeName(dt), " for shape ", ShapeStr({dims, dims + rank}), ")"));
  }
  return absl::OkStatus();
}

namespace {

// Checks dtype, shape and byte length; the bytes are copied, or taken from
// `take` (the same tensor's mutable bytes) when given.
absl::StatusOr<HostTensor> ConvertTensor(const v1::Tensor& t, const std::string& name, const ValidationLimits& limits,
                                         std::string* take) {
  if (absl::Status s = CheckWireTensor(t.dtype(), t.shape().data(), t.shape_size(), t.data().size(), name, limits);
      !s.ok()) {
    return s;
  }
  HostTensor out;
  out.dtype = FromProtoDType(t.dtype());
  out.shape.assign(t.shape().begin(), t.shape().end());
  if (take != nullptr) {
    out.data.swap(*take);
  } else {
    out.data = t.data();
  }
  return out;
}

}  // namespace

absl::StatusOr<HostTensor> TensorFromProto(const v1::Tensor& t, const std::string& name,
                                           const ValidationLimits& limits) {
  return ConvertTensor(t, name, limits, nullptr);
}

absl::StatusOr<HostTensor> TakeTensorFromProto(v1::Tensor& t, const std::string& name, const ValidationLimits& limits) {
  return ConvertTensor(t, name, limits, t.mutable_data());
}

void TensorToProto(const HostTensor& t, v1::Tensor* out) {
  out->set_dtype(ToProtoDType(t.dtype));
  for (int64_t d : t.shape) out->add_shape(d);
  const std::string_view bytes = t.bytes();
  out->set_data(bytes.data(), bytes.size());
}

void TensorToProto(HostTensor&& t, v1::Tensor* out) {
  out->set_dtype(ToProtoDType(t.dtype));
  for (int64_t d : t.shape) out->add_shape(d);
  t.Own();
  out->set_data(std::move(t.data));
}

v1::FusedOpRequest OpRequestToProto(const OpRequest& r) {
  v1::FusedOpRequest p;
  p.set_op(r.op);
  for (const auto& [name, t] : r.inputs) TensorToProto(t, &(*p.mutable_inputs())[name]);
  for (const auto& [name, v] : r.attrs) {
    v1::AttrValue& a = (*p.mutable_attrs())[name];
    if (const double* f = std::get_if<double>(&v)) a.set_f(*f);
    if (const int64_t* i = std::get_if<int64_t>(&v)) a.set_i(*i);
    if (const std::string* s = std::get_if<std::string>(&v)) a.set_s(*s);
    if (const bool* b = std::get_if<bool>(&v)) a.set_b(*b);
  }
  return p;
}

absl::Status CheckInputName(const OpSpec& spec, const std::string& name) {
  auto listed = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), name) != v.end(); };
  if (listed(spec.inputs) || listed(spec.optional_inputs)) return absl::OkStatus();
  std::vector<std::string> all = spec.inputs;
  all.insert(all.end(), spec.optional_inputs.begin(), spec.optional_inputs.end());
  return Invalid(absl::StrCat(spec.name, ": unexpected input '", ClientText(name),
                              "' (expected: ", absl::StrJoin(all, ", "), ")"));
}

namespace {

absl::Status CheckAttrs(OpRequest& r, const OpSpec& spec) {
  for (const auto& [name, value] : r.attrs) {
    bool known = false;
    for (const AttrSpec& a : spec.attrs) known |= a.name == name;
    if (!known) {
      std::vector<std::string> names;
      for (const AttrSpec& a : spec.attrs) names.push_back(a.name);
      return Invalid(absl::StrCat(r.op, ": unknown attribute '", ClientText(name),
                                  "' (expected one of: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
    }
  }
  for (const AttrSpec& a : spec.attrs) {
    auto it = r.attrs.find(a.name);
    if (it == r.attrs.end()) {
      r.attrs[a.name] = a.default_value;
      continue;
    }
    AttrValue& v = it->second;
    // An integer is accepted where a float is expected.
    if (std::holds_alternative<double>(a.default_value) && std::holds_alternative<int64_t>(v)) {
      v = static_cast<double>(std::get<int64_t>(v));
    }
    if (v.index() != a.default_value.index()) {
      static const char* kKinds[] = {"float (f)", "int (i)", "string (s)", "bool (b)"};
      return Invalid(absl::StrCat(r.op, ": attribute '", a.name, "' must be a ", kKinds[a.default_value.index()]));
    }
    if (!a.choices.empty()) {
      const std::string& s = std::get<std::string>(v);
      bool found = false;
      for (const std::string& c : a.choices) found |= c == s;
      if (!found) {
        return Invalid(absl::StrCat(r.op, ": attribute '", a.name, "' is \"", ClientText(s),
                                    "\", expected one of: ", absl::StrJoin(a.choices, ", ")));
      }
    }
  }
  // Ranges, then the defaults that depend on shapes made explicit.
  if (auto s = spec.check_attrs(r); !s.ok()) return s;
  if (spec.resolve_attrs) spec.resolve_attrs(r);
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateOpRequest(OpRequest& r) {
  // Resolved once (Validate did it, unless a caller changed the op since).
  if (r.spec == nullptr || r.spec->name != r.op) r.spec = FindOpSpec(r.op);
  const OpSpec* spec = r.spec;
  if (spec == nullptr) {
    std::vector<std::string> names;
    for (const OpSpec& s : AllOpSpecs()) names.push_back(s.name);
    return Invalid(
        absl::StrCat("unknown op '", ClientText(r.op), "' (expected one of: ", absl::StrJoin(names, ", "), ")"));
  }
  for (const std::string& name : spec->inputs) {
    if (!r.has(name)) return Invalid(absl::StrCat(r.op, ": missing input '", name, "'"));
  }
  std::optional<DType> float_dtype;
  std::string first_float;
  for (const auto& [name, t] : r.inputs) {
    if (auto s = CheckInputName(*spec, name); !s.ok()) return s;
    if (spec->is_index(name)) {
      if (t.dtype != DType::kI32 && t.dtype != DType::kI64) {
        return Invalid(
            absl::StrCat(r.op, ": input '", name, "' has dtype ", DTypeName(t.dtype), ", expected I32 or I64"));
      }
    } else if (!IsFloat(t.dtype)) {
      return Invalid(
          absl::StrCat(r.op, ": input '", name, "' has dtype ", DTypeName(t.dtype), ", expected F32, F16 or BF16"));
    } else if (!float_dtype) {
      float_dtype = t.dtype;
      first_float = name;
    } else if (*float_dtype != t.dtype) {
      return Invalid(absl::StrCat(r.op, ": input '", name, "' has dtype ", DTypeName(t.dtype), " but '", first_float,
                                  "' has ", DTypeName(*float_dtype), "; float inputs must share one dtype"));
    }
  }
  if (auto s = spec->check_shapes(r); !s.ok()) return s;
  return CheckAttrs(r, *spec);
}

absl::Status CheckOpCost(const OpRequest& r, const ValidationLimits& limits) {
  const OpCost c = EstimateCost(r);
  if (c.output_bytes > limits.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: the outputs would take %.4g bytes, more than one response may carry (%.4g bytes, "
                        "--max_message_bytes)",
                        r.op, c.output_bytes, limits.max_output_bytes));
  }
  if (c.output_bytes + c.scratch_bytes > limits.max_op_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: needs %.4g bytes of outputs and working memory, more than the server's limit of %.4g bytes per "
        "request (--max_op_bytes)",
        r.op, c.output_bytes + c.scratch_bytes, limits.max_op_bytes));
  }
  if (c.flops > limits.max_op_flops) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: needs %.4g FLOPs of work, more than the server's limit of %.4g per request "
                        "(--max_op_flops)",
                        r.op, c.flops, limits.max_op_flops));
  }
  return absl::OkStatus();
}

namespace {

// ValidateFusedOp and TakeValidatedFusedOp: `mutable_request` is the same
// message as `request` when its bytes may be taken, else nullptr.
absl::StatusOr<OpRequest> Validate(const v1::FusedOpRequest& request, v1::FusedOpRequest* mutable_request,
                                   const ValidationLimits& limits) {
  OpRequest r;
  r.op = request.op();
  const OpSpec* spec = r.spec = FindOpSpec(r.op);
  if (spec == nullptr) {
    OpRequest probe;
    probe.op = r.op;
    return ValidateOpRequest(probe);  // unknown-op message
  }
  // Names first: a client string reaches a message only through ClientText.
  for (const auto& [name, t] : request.inputs()) {
    if (auto s = CheckInputName(*spec, name); !s.ok()) return s;
  }
  for (const auto& [name, t] : request.inputs()) {
    absl::StatusOr<HostTensor> ht = mutable_request != nullptr
                                        ? TakeTensorFromProto((*mutable_request->mutable_inputs())[name], name, limits)
                                        : TensorFromProto(t, name, limits);
    if (!ht.ok()) return absl::InvalidArgumentError(absl::StrCat(r.op, ": ", ht.status().message()));
    r.inputs.emplace(name, *std::move(ht));
  }
  for (const auto& [name, v] : request.attrs()) {
    switch (v.value_case()) {
      case v1::AttrValue::kF:
        r.attrs[name] = v.f();
        break;
      case v1::AttrValue::kI:
        r.attrs[name] = static_cast<int64_t>(v.i());
        break;
      case v1::AttrValue::kS:
        r.attrs[name] = v.s();
        break;
      case v1::AttrValue::kB:
        r.attrs[name] = v.b();
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(r.op, ": attribute '", ClientText(name), "' has no value set"));
    }
  }
  if (auto s = ValidateOpRequest(r); !s.ok()) return s;
  if (auto s = CheckOpCost(r, limits); !s.ok()) return s;
  return r;
}

}  // namespace

absl::StatusOr<OpRequest> ValidateFusedOp(const v1::FusedOpRequest& request, const ValidationLimits& limits) {
  return Validate(request, nullptr, limits);
}

absl::StatusOr<OpRequest> TakeValidatedFusedOp(v1::FusedOpRequest& request, const ValidationLimits& limits) {
  return Validate(request, &request, limits);
}

}  // namespace fusedserve
