// The memory-bound CUDA ops (rms_norm, add_rms_norm, add_rms_norm_silu,
// layer_norm, softmax, silu_and_mul, gelu erf/tanh, rope) against the CPU
// reference (kernels/cpu/reference.h), through RunMemoryBoundOp.
//
// For every op x dtype x shape: fresh random inputs (MakeRandomRequest), the
// reference once, then EVERY candidate config of MemoryBoundCandidates plus
// "" and a malformed string (both must fall back to the default), each run
// on outputs poisoned with 0xFF bytes (NaN in every float dtype), compared by
// ||got - ref|| / ||ref||. The bound is the dtype's (1e-5 fp32, 2e-3 fp16,
// 1e-2 bf16) or twice the error of the reference merely rounded to the dtype,
// whichever is larger (fp16 softmax over 262144 columns lands in fp16's
// subnormals, where rounding alone costs more than 2e-3). Shapes: odd and
// large rows and hidden sizes, softmax up to N = 262144,
// plus misaligned pointers (the scalar fallback). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/op.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

constexpr DType kDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

double BaseTolerance(DType dt) { return dt == DType::kF32 ? 1e-5 : dt == DType::kF16 ? 2e-3 : 1e-2; }

float RoundTo(DType dt, float v) {
  if (dt == DType::kF16) return HalfToFloat(FloatToHalf(v));
  if (dt == DType::kBF16) return Bf16ToFloat(FloatToBf16(v));
  return v;
}

// ||got - want|| / ||want||; NaN when got has a NaN (an unwritten element).
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

// Reference outputs (fp32) of a request, by output name.
std::map<std::string, std::vector<float>> Reference(const OpRequest& r) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, shape] : OutputShapes(r)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out[name].assign(n, 0.0f);
  }
  auto F = [&](const char* name) { return r.in(name).ToFloat(); };
  const std::string& op = r.op;
  if (op == "rope") {
    const HostTensor& q = r.in("q");
    cpu::Rope(F("q").data(), F("k").data(), r.in("positions").ToInt64().data(), q.dim(0), q.dim(1), r.in("k").dim(1),
              q.dim(2), r.f("theta"), out["q_out"].data(), out["k_out"].data());
    return out;
  }
  const HostTensor& x = r.in("x");
  const int64_t last = x.dim(-1), rows = x.numel() / std::max<int64_t>(last, 1);
  const std::vector<float> xv = F("x");
  const float eps = r.attrs.count("eps") ? static_cast<float>(r.f("eps")) : 1e-5f;
  if (op == "rms_norm") {
    cpu::RmsNorm(xv.data(), F("weight").data(), rows, last, eps, out["y"].data());
  } else if (op == "add_rms_norm") {
    cpu::AddRmsNorm(xv.data(), F("residual").data(), F("weight").data(), rows, last, eps, out["y"].data(),
                    out["residual_out"].data());
  } else if (op == "add_rms_norm_silu") {
    cpu::AddRmsNormSilu(xv.data(), F("residual").data(), F("weight").data(), rows, last, eps, out["y"].data());
  } else if (op == "layer_norm") {
    cpu::LayerNorm(xv.data(), F("weight").data(), F("bias").data(), rows, last, eps, out["y"].data());
  } else if (op == "softmax") {
    cpu::Softmax(xv.data(), rows, last, out["y"].data());
  } else if (op == "silu_and_mul") {
    cpu::SiluAndMul(xv.data(), rows, last / 2, out["y"].data());
  } else if (op == "gelu") {
    cpu::Gelu(xv.data(), x.numel(), r.s("approximate") == "tanh", out["y"].data());
  }
  return out;
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

int g_configs_checked = 0;

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

// Runs every candidate config of (op, dtype, key) and compares each with the
// reference. `attrs` override the request's defaults; `misalign` offsets every
// device pointer by one element (the scalar path).
void CheckOp(const std::string& op, DType dt, const std::vector<int64_t>& key, const Attrs& attrs = {},
             bool misalign = false) {
  const uint64_t seed = NextSeed();
  std::string shape;
  for (int64_t d : key) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  SCOPED_TRACE(op + " " + DTypeName(dt) + " key " + shape + " seed " + std::to_string(seed) +
               (misalign ? " misaligned" : ""));
  OpRequest r = MakeRandomRequest(op, dt, key, seed);
  for (const auto& [name, value] : attrs) r.attrs[name] = value;
  const std::map<std::string, std::vector<float>> ref = Reference(r);

  DeviceMem mem;
  DeviceTensorMap in, out;
  ASSERT_NE(FindOpSpec(op), nullptr);
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
    std::vector<float> rounded = ref.at(name);
    for (float& v : rounded) v = RoundTo(dt, v);
    tolerance[name] = std::max(BaseTolerance(dt), 2.0 * RelErrorNorm(rounded, ref.at(name)));
  }

  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // uploads complete before the stream reads them
  std::vector<std::string> configs = MemoryBoundCandidates(op, dt, TuningKey(r));
  ASSERT_FALSE(configs.empty());
  configs.push_back("");          // no tuned config: the default
  configs.push_back("t3.bogus");  // unparsable: the default
  for (const std::string& cfg : configs) {
    SCOPED_TRACE("config '" + cfg + "'");
    const cudaStream_t stream = TestStream();
    for (const auto& [name, d] : out) ASSERT_EQ(cudaMemsetAsync(d.data, 0xFF, Bytes(d), stream), cudaSuccess);
    DispatchContext ctx;
    ctx.stream = stream;
    ctx.config = [&cfg](const std::string&, DType, const std::vector<int64_t>&) { return cfg; };
    bool handled = false;
    const CudaStatus s = RunMemoryBoundOp(r, in, out, ctx, &handled);
    ASSERT_TRUE(handled);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    for (const auto& [name, d] : out) {
      HostTensor h;
      h.dtype = d.dtype;
      h.shape = d.shape;
      h.data.resize(Bytes(d));
      ASSERT_EQ(cudaMemcpy(h.data.data(), d.data, h.data.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      const double err = RelErrorNorm(h.ToFloat(), ref.at(name));
      EXPECT_LE(err, tolerance[name]) << name;  // NaN (unwritten output) fails too
    }
    ++g_configs_checked;
  }
}

class MemoryBound : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    g_configs_checked = 0;
  }
  void TearDown() override {
    if (!IsSkipped()) std::printf("[ checked ] %d (shape, config) runs\n", g_configs_checked);
  }
};

TEST_F(MemoryBound, Norms) {
  for (const char* op : {"rms_norm", "add_rms_norm", "add_rms_norm_silu", "layer_norm"}) {
    for (DType dt : kDTypes) {
      for (int64_t m : {1, 3, 17, 512}) {
        for (int64_t h : {1, 7, 769, 4096, 8192}) CheckOp(op, dt, {m, h});
      }
      for (int64_t h : {7, 769, 4096}) CheckOp(op, dt, {4099, h});
      // Rows longer than the registers hold: the streaming path.
      CheckOp(op, dt, {3, 40000});
    }
  }
  for (DType dt : kDTypes) CheckOp("rms_norm", dt, {4099, 8192});
}

TEST_F(MemoryBound, Softmax) {
  for (DType dt : kDTypes) {
    for (int64_t m : {1, 3, 17}) {
      for (int64_t n : {1, 1000, 32000, 128256, 262144}) CheckOp("softmax", dt, {m, n});
    }
    for (int64_t n : {1, 1000, 32000}) CheckOp("softmax", dt, {512, n});
    for (int64_t n : {1, 1000}) CheckOp("softmax", dt, {4099, n});
    CheckOp("softmax", dt, {64, 128256});
    CheckOp("softmax", dt, {2, 1 << 20});  // past every register-resident config: streaming
    CheckOp("softmax", dt, {3, 32001});    // odd: scalar path
  }
}

TEST_F(MemoryBound, SiluAndMul) {
  for (DType dt : kDTypes) {
    for (int64_t m : {1, 3, 17, 512}) {
      for (int64_t i : {1, 7, 769, 4096, 14336}) CheckOp("silu_and_mul", dt, {m, i});
    }
    for (int64_t i : {7, 769}) CheckOp("silu_and_mul", dt, {4099, i});
  }
}

TEST_F(MemoryBound, Gelu) {
  for (const char* form : {"none", "tanh"}) {
    const Attrs attrs = {{"approximate", std::string(form)}};
    for (DType dt : kDTypes) {
      for (int64_t m : {1, 3, 17, 512}) {
        for (int64_t h : {1, 7, 769, 4096, 14336}) CheckOp("gelu", dt, {m, h}, attrs);
      }
      for (int64_t h : {7, 769}) CheckOp("gelu", dt, {4099, h}, attrs);
    }
  }
}

TEST_F(MemoryBound, Rope) {
  for (DType dt : kDTypes) {
    for (int64_t t : {1, 3, 17, 512, 4099}) {
      CheckOp("rope", dt, {t, 32, 8, 128});
      CheckOp("rope", dt, {t, 4, 2, 64});
      CheckOp("rope", dt, {t, 3, 1, 6});  // D/2 = 3: scalar path
    }
    CheckOp("rope", dt, {5, 2, 2, 128}, {{"theta", 10000.0}});
  }
}

// Every pointer one element past 16-byte alignment: the scalar fallback.
TEST_F(MemoryBound, MisalignedPointers) {
  for (DType dt : kDTypes) {
    CheckOp("rms_norm", dt, {5, 4096}, {}, true);
    CheckOp("add_rms_norm", dt, {5, 4096}, {}, true);
    CheckOp("layer_norm", dt, {5, 4096}, {}, true);
    CheckOp("softmax", dt, {5, 32000}, {}, true);
    CheckOp("silu_and_mul", dt, {5, 4096}, {}, true);
    CheckOp("gelu", dt, {5, 4096}, {{"approximate", std::string("tanh")}}, true);
    CheckOp("rope", dt, {5, 32, 8, 128}, {}, true);
  }
}

TEST(MemoryBoundCandidates, OnlyMemoryBoundOps) {
  EXPECT_TRUE(MemoryBoundCandidates("linear", DType::kBF16, {16, 4096, 4096}).empty());
  for (const char* op : {"rms_norm", "softmax", "gelu", "silu_and_mul"}) {
    EXPECT_FALSE(MemoryBoundCandidates(op, DType::kBF16, {1, 4096}).empty()) << op;
  }
  EXPECT_FALSE(MemoryBoundCandidates("rope", DType::kF16, {1, 32, 8, 128}).empty());
  DispatchContext ctx;
  bool handled = true;
  OpRequest r;
  r.op = "linear";
  EXPECT_TRUE(RunMemoryBoundOp(r, {}, {}, ctx, &handled).ok());
  EXPECT_FALSE(handled);
}

}  // namespace
}  // namespace fusedserve
