// The generic GPU op test: every op of the registry (AllOpSpecs) x every
// float dtype x its cases in tests/gpu/op_cases.h (the benchmarks' list),
// through the op's CUDA entry (RunCudaOp), against its CPU reference entry
// (cpu::RunReference).
//
// Per case: fresh random inputs (MakeRandomRequest, seed printed), the
// reference once, then EVERY candidate config of the op (CudaCandidates)
// plus "" and a malformed string (both must fall back to the default), each
// run on outputs poisoned with 0xFF bytes (NaN in every float dtype) and on
// poisoned scratch, compared by ||got - ref|| / ||ref||. The bound is the
// op's for the dtype or twice the error of the reference merely rounded to
// the dtype, whichever is larger (fp16 softmax over 262144 columns lands in
// fp16's subnormals, where rounding alone costs more than 2e-3). Model
// shapes run at a few small token counts. Memory-bound ops also run with
// every pointer one element past 16-byte alignment (the scalar fallback).
// Per-op edge cases beyond shapes (epilogues, varlen attention, the
// same-precision attention rule) stay in compute_test.cc. Skips without a GPU.
#include "kernels/op.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/dispatch.h"
#include "tests/gpu/op_cases.h"
#include "tests/gpu/poisoned_scratch.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

constexpr DType kDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

// Relative error bound of an op at a dtype: bf16/fp16 outputs are rounded
// (2^-9 / 2^-12 relative); GEMMs accumulate in another order than the
// reference; swiglu_mlp rounds its intermediate too; attention rounds its
// probabilities.
double Tolerance(const OpSpec& spec, DType dt) {
  if (dt == DType::kF32)
    return spec.memory_bound || spec.name == "attention" || spec.name == "attention_decode" ? 1e-5 : 5e-5;
  const double base = dt == DType::kF16 ? 2e-3 : 1e-2;
  if (spec.name == "swiglu_mlp") return 1.5 * base;
  if (spec.name == "attention" || spec.name == "attention_decode") return 1.5e-2;
  return base;
}

float RoundTo(DType dt, float v) {
  if (dt == DType::kF16) return HalfToFloat(FloatToHalf(v));
  if (dt == DType::kBF16) return Bf16ToFloat(FloatToBf16(v));
  return v;
}

// Seed base for the run: FUSEDSERVE_TEST_SEED or random (printed either way).
uint64_t NextSeed() {
  static uint64_t seed = [] {
    const char* env = std::getenv("FUSEDSERVE_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("[ seed ] FUSEDSERVE_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed++;
}

// Device allocations freed at scope exit. Alloc(bytes, offset) returns a
// pointer `offset` bytes past a 256-byte aligned allocation.
class DeviceMem {
 public:
  ~DeviceMem() {
    for (void* p : ptrs_) cudaFree(p);
  }
  void* Alloc(size_t bytes, size_t offset) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes + offset + 16) != cudaSuccess) return nullptr;
    ptrs_.push_back(p);
    return static_cast<char*>(p) + offset;
  }

 private:
  std::vector<void*> ptrs_;
};

size_t Bytes(const DeviceTensor& t) { return static_cast<size_t>(t.numel()) * DTypeSize(t.dtype); }

int SmCount() {
  static const int n = [] {
    cudaDeviceProp prop{};
    return cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.multiProcessorCount : 0;
  }();
  return n;
}

// The kernels run on a non-blocking stream, as in the backend (and so with
// programmatic dependent launch between consecutive calls).
cudaStream_t TestStream() {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
  }();
  return stream;
}

int g_configs_checked = 0;

// Runs every candidate config of (op, dtype, key) and compares each with the
// reference. `attrs` override the request's defaults; `misalign` offsets every
// float device pointer by one element (the scalar path).
void CheckOp(const std::string& op, DType dt, const std::vector<int64_t>& key, const Attrs& attrs, bool misalign) {
  const uint64_t seed = NextSeed();
  std::string shape;
  for (int64_t d : key) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  SCOPED_TRACE(op + " " + DTypeName(dt) + " key " + shape + " seed " + std::to_string(seed) +
               (misalign ? " misaligned" : ""));
  OpRequest r = MakeRandomRequest(op, dt, key, seed);
  for (const auto& [name, value] : attrs) r.attrs[name] = value;
  absl::StatusOr<cpu::FloatOutputs> ref = cpu::RunReference(r, StopCheck());
  ASSERT_TRUE(ref.ok()) << ref.status();

  DeviceMem mem;
  DeviceTensorMap in, out;
  for (const auto& entry : r.inputs) {
    const std::string& name = entry.first;
    DeviceTensor d = DeviceInput(r, name);
    const bool index = d.dtype == DType::kI32;  // index inputs stay aligned
    std::string bytes(d.numel() * DTypeSize(d.dtype), '\0');
    WriteDeviceInput(r, name, bytes.data());
    d.data = mem.Alloc(bytes.size(), misalign && !index ? DTypeSize(d.dtype) : 0);
    ASSERT_NE(d.data, nullptr);
    ASSERT_EQ(cudaMemcpy(d.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    in[name] = d;
  }
  std::map<std::string, double> tolerance;
  for (const auto& [name, shape_out] : OutputShapes(r)) {
    DeviceTensor d{dt, shape_out, nullptr};
    d.data = mem.Alloc(Bytes(d), misalign ? DTypeSize(dt) : 0);
    ASSERT_NE(d.data, nullptr);
    out[name] = d;
    std::vector<float> rounded = ref->at(name);
    for (float& v : rounded) v = RoundTo(dt, v);
    tolerance[name] = std::max(Tolerance(*r.spec, dt), 2.0 * RelErrorNorm(rounded, ref->at(name)));
  }

  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // uploads complete before the stream reads them
  std::vector<std::string> configs = CudaCandidates(op, dt, TuningKey(r));
  ASSERT_FALSE(configs.empty());
  configs.push_back("");          // no tuned config: the default
  configs.push_back("t3.bogus");  // unparsable: the default
  PoisonedScratch scratch;
  for (const std::string& cfg : configs) {
    SCOPED_TRACE("config '" + cfg + "'");
    const cudaStream_t stream = TestStream();
    for (const auto& [name, d] : out) ASSERT_EQ(cudaMemsetAsync(d.data, 0xFF, Bytes(d), stream), cudaSuccess);
    DispatchContext ctx;
    ctx.stream = stream;
    ctx.sm_count = SmCount();
    ctx.scratch = &scratch;
    ctx.config = [&cfg](const std::string&, DType, const std::vector<int64_t>&) { return cfg; };
    bool handled = false;
    const CudaStatus s = RunCudaOp(r, in, out, ctx, &handled);
    ASSERT_TRUE(handled);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    for (const auto& [name, d] : out) {
      HostTensor h;
      h.dtype = d.dtype;
      h.shape = d.shape;
      h.data.resize(Bytes(d));
      ASSERT_EQ(cudaMemcpy(h.data.data(), d.data, h.data.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      const double err = RelErrorNorm(h.ToFloat(), ref->at(name));
      EXPECT_LE(err, tolerance[name]) << name;  // NaN (unwritten output) fails too
    }
    ++g_configs_checked;
  }
}

// The keys a case runs at: its own, or for a model shape a few small token
// counts (decode: a few sequences of 300 cached tokens).
std::vector<std::vector<int64_t>> KeysOf(const testing::OpCase& c) {
  if (!c.bench) return {c.key};
  std::vector<std::vector<int64_t>> keys;
  for (int64_t m : {1, 3}) {
    std::vector<int64_t> k = c.key;
    k[0] = m;
    if (c.op == "attention_decode") k[1] = 300;
    keys.push_back(k);
  }
  return keys;
}

class OpTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    g_configs_checked = 0;
  }
  void TearDown() override {
    if (!IsSkipped()) std::printf("[ checked ] %d (shape, config) runs\n", g_configs_checked);
  }
};

TEST_P(OpTest, EveryCaseDtypeAndConfigMatchesTheReference) {
  const std::string& op = GetParam();
  int cases = 0;
  for (const testing::OpCase& c : testing::OpCases()) {
    if (c.op != op) continue;
    for (const std::vector<int64_t>& key : KeysOf(c)) {
      for (DType dt : kDTypes) {
        CheckOp(op, dt, key, c.attrs, false);
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 0) << "no cases for " << op << " in tests/gpu/op_cases.h";
}

// Every pointer one element past 16-byte alignment: the scalar fallback.
TEST_P(OpTest, MisalignedPointers) {
  const OpSpec* spec = FindOpSpec(GetParam());
  if (!spec->memory_bound) GTEST_SKIP() << "the GEMM and attention kernels require 16-byte alignment";
  const std::optional<testing::OpCase> model = testing::ModelCase(spec->name);
  ASSERT_TRUE(model.has_value()) << "no model shape for " << spec->name << " in tests/gpu/op_cases.h";
  std::vector<int64_t> key = model->key;
  key[0] = 5;
  for (DType dt : kDTypes) CheckOp(spec->name, dt, key, model->attrs, true);
}

std::vector<std::string> OpNames() {
  std::vector<std::string> names;
  for (const OpSpec& s : AllOpSpecs()) names.push_back(s.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Registry, OpTest, ::testing::ValuesIn(OpNames()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// The CUDA table covers the registry; an op's candidates need a key of its rank.
TEST(CudaTable, EveryOpHasAnEntry) {
  for (const OpSpec& s : AllOpSpecs()) {
    const CudaOp* op = FindCudaOp(s);
    ASSERT_NE(op, nullptr) << s.name;
    EXPECT_EQ(op->op, s.name);
  }
  EXPECT_TRUE(CudaCandidates("linear", DType::kBF16, {16, 4096}).empty());
  EXPECT_TRUE(CudaCandidates("no_such_op", DType::kBF16, {16, 4096}).empty());
  OpRequest r;
  r.op = "no_such_op";
  DispatchContext ctx;
  bool handled = true;
  EXPECT_TRUE(RunCudaOp(r, {}, {}, ctx, &handled).ok());
  EXPECT_FALSE(handled);
}

}  // namespace
}  // namespace fusedserve
