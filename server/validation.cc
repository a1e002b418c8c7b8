#include "server/validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace fusedserve {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

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

namespace {

// Checks dtype, shape and byte length; the bytes are copied, or taken from
// `take` (the same tensor's mutable bytes) when given.
absl::StatusOr<HostTensor> ConvertTensor(const v1::Tensor& t, const std::string& name, const ValidationLimits& limits,
                                         std::string* take) {
  if (t.dtype() == v1::DTYPE_UNSPECIFIED || !v1::DType_IsValid(t.dtype())) {
    return Invalid(absl::StrCat("input '", name, "': dtype must be one of F32, F16, BF16, I32, I64 (got ",
                                static_cast<int>(t.dtype()), ")"));
  }
  HostTensor out;
  out.dtype = FromProtoDType(t.dtype());
  if (t.shape_size() > 8) {
    return Invalid(absl::StrCat("input '", name, "': rank ", t.shape_size(), " exceeds the maximum of 8"));
  }
  int64_t numel = 1;
  for (int i = 0; i < t.shape_size(); ++i) {
    const int64_t d = t.shape(i);
    if (d < 1) {
      return Invalid(absl::StrCat("input '", name, "': dimension ", i, " is ", d, ", must be >= 1"));
    }
    if (d > limits.max_tensor_elements || numel > limits.max_tensor_elements / d) {
      return Invalid(absl::StrCat("input '", name, "': shape ", ShapeStr({t.shape().begin(), t.shape().end()}),
                                  " has more than ", limits.max_tensor_elements, " elements (the server's limit)"));
    }
    numel *= d;
  }
  out.shape.assign(t.shape().begin(), t.shape().end());
  const int64_t expect = numel * static_cast<int64_t>(DTypeSize(out.dtype));
  if (static_cast<int64_t>(t.data().size()) != expect) {
    return Invalid(absl::StrCat("input '", name, "': data has ", t.data().size(), " bytes, expected ", expect, " (",
                                numel, " elements of ", DTypeName(out.dtype), " for shape ", ShapeStr(out.shape), ")"));
  }
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
  out->set_data(t.data);
}

void TensorToProto(HostTensor&& t, v1::Tensor* out) {
  out->set_dtype(ToProtoDType(t.dtype));
  for (int64_t d : t.shape) out->add_shape(d);
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

namespace {

// Checks that `t` has rank `rank` and, where expect[i] >= 0, dim i == expect[i].
absl::Status CheckShape(const OpRequest& r, const std::string& name, std::vector<int64_t> expect) {
  const HostTensor& t = r.in(name);
  bool ok = t.rank() == static_cast<int>(expect.size());
  for (size_t i = 0; ok && i < expect.size(); ++i) ok = expect[i] < 0 || expect[i] == t.shape[i];
  if (ok) return absl::OkStatus();
  std::vector<std::string> parts;
  for (int64_t e : expect) parts.push_back(e < 0 ? "*" : absl::StrCat(e));
  return Invalid(absl::StrCat(r.op, ": input '", name, "' has shape ", ShapeStr(t.shape), ", expected [",
                              absl::StrJoin(parts, ","), "]"));
}

absl::Status CheckRankAtLeast(const OpRequest& r, const std::string& name, int rank) {
  const HostTensor& t = r.in(name);
  if (t.rank() >= rank) return absl::OkStatus();
  return Invalid(absl::StrCat(r.op, ": input '", name, "' has rank ", t.rank(), ", expected at least ", rank));
}

absl::Status CheckIndexValues(const OpRequest& r, const std::string& name, int64_t lo, int64_t hi) {
  for (int64_t v : r.in(name).ToInt64()) {
    if (v < lo || v > hi) {
      return Invalid(
          absl::StrCat(r.op, ": input '", name, "' has value ", v, ", expected within [", lo, ", ", hi, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShapes(OpRequest& r) {
  const std::string& op = r.op;
  if (op == "rms_norm" || op == "add_rms_norm" || op == "add_rms_norm_silu" || op == "layer_norm") {
    if (auto s = CheckRankAtLeast(r, "x", 1); !s.ok()) return s;
    const int64_t H = r.in("x").dim(-1);
    if (auto s = CheckShape(r, "weight", {H}); !s.ok()) return s;
    if (r.has("residual") && r.in("residual").shape != r.in("x").shape) {
      return Invalid(absl::StrCat(op, ": input 'residual' has shape ", ShapeStr(r.in("residual").shape),
                                  ", expected the shape of 'x' ", ShapeStr(r.in("x").shape)));
    }
    if (r.has("bias")) return CheckShape(r, "bias", {H});
    return absl::OkStatus();
  }
  if (op == "softmax" || op == "gelu") return CheckRankAtLeast(r, "x", 1);
  if (op == "silu_and_mul") {
    if (auto s = CheckRankAtLeast(r, "x", 1); !s.ok()) return s;
    if (r.in("x").dim(-1) % 2 != 0) {
      return Invalid(
          absl::StrCat(op, ": input 'x' last dimension is ", r.in("x").dim(-1), ", expected an even number (2*I)"));
    }
    return absl::OkStatus();
  }
  if (op == "rope") {
    if (auto s = CheckRankAtLeast(r, "q", 3); !s.ok()) return s;
    const HostTensor& q = r.in("q");
    if (auto s = CheckShape(r, "q", {-1, -1, -1}); !s.ok()) return s;
    const int64_t T = q.dim(0), D = q.dim(2);
    if (D % 2 != 0) return Invalid(absl::StrCat(op, ": head dim of 'q' is ", D, ", expected an even number"));
    if (auto s = CheckShape(r, "k", {T, -1, D}); !s.ok()) return s;
    if (auto s = CheckShape(r, "positions", {T}); !s.ok()) return s;
    return CheckIndexValues(r, "positions", 0, std::numeric_limits<int32_t>::max());
  }
  if (op == "linear") {
    if (auto s = CheckShape(r, "x", {-1, -1}); !s.ok()) return s;
    const int64_t K = r.in("x").dim(1);
    if (auto s = CheckShape(r, "weight", {-1, K}); !s.ok()) return s;
    if (r.has("bias")) return CheckShape(r, "bias", {r.in("weight").dim(0)});
    return absl::OkStatus();
  }
  if (op == "swiglu_mlp") {
    if (auto s = CheckShape(r, "x", {-1, -1}); !s.ok()) return s;
    const int64_t D = r.in("x").dim(1);
    if (auto s = CheckShape(r, "gate_up", {-1, D}); !s.ok()) return s;
    if (r.in("gate_up").dim(0) % 2 != 0) {
      return Invalid(absl::StrCat(op, ": input 'gate_up' has ", r.in("gate_up").dim(0),
                                  " rows, expected an even number (2*I: gate rows then up rows)"));
    }
    return CheckShape(r, "down", {D, r.in("gate_up").dim(0) / 2});
  }
  if (op == "attention" || op == "attention_decode") {
    const bool decode = op == "attention_decode";
    if (auto s = CheckShape(r, "q", {-1, -1, -1}); !s.ok()) return s;
    const HostTensor& q = r.in("q");
    const int64_t rows = q.dim(0), Hq = q.dim(1), D = q.dim(2);
    const std::string kn = decode ? "k_cache" : "k", vn = decode ? "v_cache" : "v";
    if (decode) {
      if (auto s = CheckShape(r, kn, {rows, -1, -1, D}); !s.ok()) return s;
    } else {
      if (auto s = CheckShape(r, kn, {rows, -1, D}); !s.ok()) return s;
    }
    if (r.in(vn).shape != r.in(kn).shape) {
      return Invalid(absl::StrCat(op, ": input '", vn, "' has shape ", ShapeStr(r.in(vn).shape),
                                  ", expected the shape of '", kn, "' ", ShapeStr(r.in(kn).shape)));
    }
    const int64_t Hkv = r.in(kn).dim(-2);
    if (Hq % Hkv != 0) {
      return Invalid(absl::StrCat(op, ": q heads (", Hq, ") must be a multiple of kv heads (", Hkv, ")"));
    }
    if (decode) {
      if (auto s = CheckShape(r, "lengths", {rows}); !s.ok()) return s;
      return CheckIndexValues(r, "lengths", 1, r.in(kn).dim(1));
    }
    if (auto s = CheckShape(r, "seq_lens", {-1}); !s.ok()) return s;
    if (auto s = CheckIndexValues(r, "seq_lens", 1, rows); !s.ok()) return s;
    int64_t total = 0;
    for (int64_t v : r.in("seq_lens").ToInt64()) total += v;
    if (total != rows) {
      return Invalid(absl::StrCat(op, ": input 'seq_lens' sums to ", total, ", expected T = ", rows, " (rows of 'q')"));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status CheckInputName(const OpSpec& spec, const std::string& name) {
  auto listed = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), name) != v.end(); };
  if (listed(spec.inputs) || listed(spec.optional_inputs)) return absl::OkStatus();
  std::vector<std::string> all = spec.inputs;
  all.insert(all.end(), spec.optional_inputs.begin(), spec.optional_inputs.end());
  return Invalid(absl::StrCat(spec.name, ": unexpected input '", ClientText(name),
                              "' (expected: ", absl::StrJoin(all, ", "), ")"));
}

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
  // Range checks.
  if (r.attrs.count("eps")) {
    const double eps = r.f("eps");
    if (!(eps > 0) || !std::isfinite(eps) || eps > 1) {
      return Invalid(absl::StrCat(r.op, ": attribute 'eps' is ", eps, ", expected 0 < eps <= 1"));
    }
  }
  if (r.attrs.count("theta")) {
    const double theta = r.f("theta");
    if (!(theta > 0) || !std::isfinite(theta)) {
      return Invalid(absl::StrCat(r.op, ": attribute 'theta' is ", theta, ", expected a finite value > 0"));
    }
  }
  if (r.attrs.count("scale")) {
    const double scale = r.f("scale");
    if (!(scale >= 0) || !std::isfinite(scale)) {
      return Invalid(absl::StrCat(r.op, ": attribute 'scale' is ", scale, ", expected a finite value > 0"));
    }
    r.attrs["scale"] = AttentionScale(r);  // the default (0) made explicit
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateOpRequest(OpRequest& r) {
  const OpSpec* spec = FindOpSpec(r.op);
  if (spec == nullptr) {
    std::vector<std::string> names;
    for (const OpSpec& s : AllOpSpecs()) names.push_back(s.name);
    return Invalid(
        absl::StrCat("unknown op '", ClientText(r.op), "' (expected one of: ", absl::StrJoin(names, ", "), ")"));
  }
  auto listed = [](const std::vector<std::string>& v, const std::string& n) {
    return std::find(v.begin(), v.end(), n) != v.end();
  };
  for (const std::string& name : spec->inputs) {
    if (!r.has(name)) return Invalid(absl::StrCat(r.op, ": missing input '", name, "'"));
  }
  std::optional<DType> float_dtype;
  std::string first_float;
  for (const auto& [name, t] : r.inputs) {
    if (auto s = CheckInputName(*spec, name); !s.ok()) return s;
    if (listed(spec->index_inputs, name)) {
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
  if (auto s = CheckShapes(r); !s.ok()) return s;
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
  const OpSpec* spec = FindOpSpec(r.op);
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
