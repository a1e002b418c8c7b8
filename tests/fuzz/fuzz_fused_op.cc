// libFuzzer target: raw bytes -> v1::FusedOpRequest::ParseFromArray ->
// ValidateFusedOp -> (if valid) the properties of fuzz_common.h. The server
// does exactly this with every FusedOp message it receives.
//
// With FUSEDSERVE_FUZZ_WRITE_SEEDS=DIR set, start-up writes one valid request
// per op and dtype into DIR (run_fuzz.sh seeds the corpus that way).
#include <fstream>

#include "google/protobuf/stubs/logging.h"
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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fusedserve::v1::FusedOpRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<fusedserve::OpRequest> r = fusedserve::ValidateFusedOp(request, fusedserve::fuzz::FuzzLimits());
  if (!r.ok()) {
    fusedserve::fuzz::Require(fusedserve::fuzz::IsValidationCode(r.status().code()),
                              "validation fails only with INVALID_ARGUMENT or RESOURCE_EXHAUSTED");
    fusedserve::fuzz::Require(!r.status().message().empty(), "a validation error says why");
    return 0;
  }
  fusedserve::fuzz::CheckValidated(*r);
  return 0;
}
