// libFuzzer target: raw bytes -> v1::FusedOpRequest::ParseFromArray ->
// ValidateFusedOp -> (if valid) the properties of fuzz_common.h. The server
// does exactly this with every FusedOp message it receives that its wire
// codec (server/fused_op_wire.h) leaves to protobuf; the codec itself is
// checked against protobuf on every input: a body it takes, protobuf parses
// too, and both give the same request or the same error code.
//
// With FUSEDSERVE_FUZZ_WRITE_SEEDS=DIR set, start-up writes one valid request
// per op and dtype into DIR (run_fuzz.sh seeds the corpus that way).
#include <fstream>

#include "google/protobuf/stubs/logging.h"
#include "server/fused_op_wire.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

void WriteSeeds(const std::string& dir) {
  using namespace fusedserve;
  int n = 0;
  for (const OpSpec& spec : AllOpSpecs()) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      std::vector<int64_t> key = {3, 8};
      if (spec.name == "rope" || spec.name == "attention") key = {4, 4, 2, 8};
      if (spec.name == "linear" || spec.name == "swiglu_mlp") key = {2, 8, 4};
      if (spec.name == "attention_decode") key = {2, 5, 4, 2, 8};
      const OpRequest r = MakeRandomRequest(spec.name, dt, key, static_cast<uint64_t>(n));
      v1::FusedOpRequest p;
      p.set_op(r.op);
      for (const auto& [name, t] : r.inputs) TensorToProto(t, &(*p.mutable_inputs())[name]);
      for (const auto& [name, v] : r.attrs) {
        v1::AttrValue& a = (*p.mutable_attrs())[name];
        if (const double* f = std::get_if<double>(&v)) a.set_f(*f);
        if (const std::string* s = std::get_if<std::string>(&v)) a.set_s(*s);
        if (const bool* b = std::get_if<bool>(&v)) a.set_b(*b);
      }
      std::ofstream(dir + "/seed_" + spec.name + "_" + std::to_string(n++), std::ios::binary) << p.SerializeAsString();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in string fields is logged per parse; that would dominate
  // the run time. The parse still fails, which is all the server sees.
  google::protobuf::SetLogHandler(nullptr);
  if (const char* dir = std::getenv("FUSEDSERVE_FUZZ_WRITE_SEEDS")) WriteSeeds(dir);
  return 0;
}

namespace {

// The wire codec on the same bytes, cut into two slices at a data-chosen
// point; compared with protobuf's verdict (`parsed`, `r`).
void CheckWireCodec(const uint8_t* data, size_t size, bool parsed, const absl::StatusOr<fusedserve::OpRequest>* r) {
  using namespace fusedserve;
  const size_t cut = size == 0 ? 0 : data[0] % (size + 1);
  std::vector<grpc::Slice> slices;
  if (cut > 0) slices.emplace_back(data, cut);
  if (size > cut) slices.emplace_back(data + cut, size - cut);
  const grpc::ByteBuffer body(slices.data(), slices.size());
  WireFusedOp wire;
  if (!ParseFusedOpWire(body, &wire)) return;  // left to protobuf
  fuzz::Require(parsed, "the wire codec takes only bodies protobuf parses");
  absl::StatusOr<OpRequest> w = ValidateWireFusedOp(wire, fuzz::FuzzLimits());
  fuzz::Require(w.ok() == r->ok(), "the wire codec and protobuf agree on validity");
  if (!w.ok()) {
    fuzz::Require(w.status().code() == r->status().code(), "the same error code either way");
    return;
  }
  fuzz::Require(w->op == (*r)->op && w->attrs == (*r)->attrs && w->inputs.size() == (*r)->inputs.size(),
                "the same op and attributes either way");
  for (const auto& [name, t] : w->inputs) {
    const auto it = (*r)->inputs.find(name);
    fuzz::Require(it != (*r)->inputs.end() && it->second.dtype == t.dtype && it->second.shape == t.shape &&
                      it->second.data == t.data,
                  "the same tensors either way");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fusedserve::v1::FusedOpRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) {
    CheckWireCodec(data, size, false, nullptr);
    return 0;
  }
  absl::StatusOr<fusedserve::OpRequest> r = fusedserve::ValidateFusedOp(request, fusedserve::fuzz::FuzzLimits());
  CheckWireCodec(data, size, true, &r);
  if (!r.ok()) {
    fusedserve::fuzz::Require(fusedserve::fuzz::IsValidationCode(r.status().code()),
                              "validation fails only with INVALID_ARGUMENT or RESOURCE_EXHAUSTED");
    fusedserve::fuzz::Require(!r.status().message().empty(), "a validation error says why");
    return 0;
  }
  fusedserve::fuzz::CheckValidated(*r);
  return 0;
}
