// The CUDA autotuner. For one (op, dtype, bucket) it builds device inputs,
// runs every candidate config through the op family's dispatcher, rejects a
// candidate whose output differs from the default config's (outputs poisoned
// with NaN first, so unwritten elements count), and times the rest with CUDA
// events: one warm run, one estimate, then the median of 5-25 runs.
//
// Measuring small kernels honestly:
//  - L2 is flushed before every timed run (a memset over 2x the L2 size), so
//    every candidate reads its inputs from DRAM as a request would.
//  - The timed runs are queued behind a host-function "gate" that opens only
//    once all of them are enqueued, so the GPU runs them back to back and the
//    dispatcher's host-side launch cost never lands between two events.
//  - Each candidate runs right behind a stand-in predecessor kernel
//    (kernels/cuda/predecessor.h), inside the timed span, as it would inside
//    a model step: work a kernel does ahead of its PDL wait (the GEMV's L2
//    prefetch of its weights) overlaps the predecessor. The predecessor's
//    own time, measured alone, is subtracted, so a candidate's time is what
//    it adds to a stream of kernels. Timed alone, the GEMV lost decode shapes
//    to the skinny GEMM that it wins inside the decode step.
//
// Inputs: as the op describes them for a key (OpSpec::inputs_for_key), random
// values from MakeRandomRequest at a few token rows (at most
// 16 MiB of token inputs per op, generated once per op and shape), copied to
// the device and tiled up to the bucket's row count with device copies, so a
// 16384-row bucket costs no host time. Index inputs (positions, seq_lens,
// lengths) are built at full size. The host-side OpRequest handed to the
// dispatcher carries shapes, attributes and index values; its float inputs
// have no data (dispatchers read device tensors).
#include "warmup/autotuner.h"

#ifndef FUSEDSERVE_KERNEL_HASH
#define FUSEDSERVE_KERNEL_HASH "dev"
#endif

namespace fusedserve {

const char* KernelBuildHash() { return FUSEDSERVE_KERNEL_HASH; }

CacheStamp HostStamp() {
  CacheStamp s;
  s.device = "cpu";
  s.kernel_hash = KernelBuildHash();
  return s;
}

}  // namespace fusedserve

#ifndef FUSEDSERVE_HAVE_CUDA

namespace fusedserve {
std::unique_ptr<Tuner> MakeCudaTuner() { return nullptr; }
}  // namespace fusedserve

#else  // FUSEDSERVE_HAVE_CUDA

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/backend.h"
#include "kernels/cuda/buffers.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/predecessor.h"
#include "kernels/op.h"

namespace fusedserve {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Token inputs of the random source request, per op and shape (at most).
constexpr int64_t kSourceTokenBytes = int64_t{16} << 20;
// Output rows compared per candidate, at most (bytes).
constexpr int64_t kSampleBytes = int64_t{8} << 20;
// Timing: runs per candidate chosen so that one candidate takes about this long.
constexpr double kCandidateBudgetUs = 20000;
constexpr int kMinRuns = 5, kMaxRuns = 25;

// Relative error norm ||candidate - reference|| / ||reference|| allowed between
// two configs of one op: both accumulate in fp32, so they differ by output
// rounding (a few ulps of the output dtype) and summation order.
double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 1.6e-2;  // 2^-6: bf16 has 8 mantissa bits
    case DType::kF16:
      return 4e-3;  // 2^-8
    default:
      return 1e-3;  // f32 (leaves room for TF32 GEMM paths)
  }
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Token rows of the random source request for an op/shape.
int64_t SourceRows(const OpSpec& spec, const std::vector<int64_t>& key, DType dtype) {
  std::vector<int64_t> one = key;
  one[0] = 1;
  int64_t row_bytes = 0;
  for (const InputDesc& s : spec.inputs_for_key(one)) {
    if (s.token && !spec.is_index(s.name)) row_bytes += Numel(s.shape) * static_cast<int64_t>(DTypeSize(dtype));
  }
  int64_t rows = 1;
  while (rows * 2 <= 16384 && rows * 2 * row_bytes <= kSourceTokenBytes) rows *= 2;
  return rows;
}

// Opens when every timed run is queued (see the file comment). A timeout keeps
// a dispatcher that blocks on the stream from deadlocking; such a measurement
// is redone without the gate.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  bool timed_out = false;
  static void CUDART_CB Wait(void* arg) {
    Gate* g = static_cast<Gate*>(arg);
    std::unique_lock<std::mutex> lock(g->mu);
    if (!g->cv.wait_for(lock, std::chrono::seconds(2), [g] { return g->open; })) g->timed_out = true;
  }
  void Reset() {
    std::lock_guard<std::mutex> lock(mu);
    open = false;
    timed_out = false;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

// One op's device problem: inputs then outputs in one buffer.
struct Problem {
  OpRequest host;
  struct Slot {
    std::string name;
    DeviceTensor tensor;
    size_t offset = 0;
    size_t bytes = 0;
  };
  DType dtype = DType::kBF16;
  std::vector<Slot> inputs, outputs;
  size_t total = 0;
  DeviceTensorMap in, out;
};

class CudaTuner : public Tuner {
 public:
  CudaTuner() = default;
  ~CudaTuner() override {
    Release();
    if (stream_ != nullptr) {
      cudaSetDevice(device_);
      cudaStreamDestroy(stream_);
    }
  }

  bool Serves(const Backend* backend) const override { return backend == nullptr || backend->name() == "cuda"; }

  CacheStamp Stamp() const override {
    CacheStamp s = HostStamp();
    int device = 0;
    cudaDeviceProp prop{};
    int driver = 0, runtime = 0;
    if (stream_ != nullptr)
      device = device_;
    else if (cudaGetDevice(&device) != cudaSuccess)
      device = -1;
    if (device < 0 || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
      cudaGetLastError();
      return s;
    }
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    s.device = prop.name;
    s.compute_capability = absl::StrCat(prop.major, ".", prop.minor);
    s.driver = driver;
    s.cuda_runtime = runtime;
    s.cublaslt = static_cast<int64_t>(cublasLtGetVersion());
    return s;
  }

  absl::StatusOr<TuneResult> Tune(const EnvelopeEntry& entry, const ConfigLookup& tuned) override;
  absl::Status RunOnce(const EnvelopeEntry& entry, const std::string& config, const ConfigLookup& tuned) override;

  void Release() override {
    if (stream_ == nullptr) return;
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    arena_.Free();
    flush_.Free();
    predecessor_.Free();
    scratch_.Free();
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    events_.clear();
    source_ = OpRequest();
    source_id_.clear();
  }

 private:
  absl::Status Init();
  // Lays out entry's problem in arena_; inputs random (from source_) or zero.
  absl::Status Build(const EnvelopeEntry& entry, bool random, Problem* p, std::string* skip);
  CudaStatus Launch(Problem& p, const std::string& config, const ConfigLookup& tuned, bool* handled);
  // After a failed launch: clears a non-sticky error; an error if the context is lost.
  absl::Status Recover(const std::string& what);
  CudaStatus Sample(const Problem& p, std::vector<std::vector<float> >* out);
  // Median over `runs` of the candidate's time behind the predecessor, less the predecessor's own.
  absl::StatusOr<double> Time(Problem& p, const std::string& config, const ConfigLookup& tuned, int runs, bool gated);
  // Median over `runs` spans of: flush L2, then the predecessor and launch() back to back.
  absl::StatusOr<double> TimeSpans(int runs, bool gated, const std::function<CudaStatus()>& launch);
  // The predecessor: 4 MiB written, a few microseconds (a norm or a small GEMM of a decode step).
  static constexpr int64_t kPredecessorBytes = int64_t{4} << 20;
  static constexpr int kPredecessorRuns = 15;

  // The device current when the tuner is first used (the backend's: the
  // server creates the backend, which selects it, before Warmup).
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  Gate gate_;
  int sm_count_ = 0;
  size_t l2_bytes_ = 0;
  DeviceBuffer arena_, flush_, scratch_, predecessor_;
  double predecessor_us_ = -1;  // the predecessor alone (median; < 0 until measured), subtracted from timings
  std::vector<cudaEvent_t> events_;
  // The random source request of the current op/shape (one at a time: the
  // envelope lists an op's buckets together).
  std::string source_id_;
  OpRequest source_;
  int64_t source_rows_ = 0;
};

absl::Status CudaTuner::Init() {
  if (stream_ != nullptr) return CudaToAbsl(FS_CUDA_CHECK(cudaSetDevice(device_)));
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDevice(&device_)); !s.ok()) return CudaToAbsl(s);
  cudaDeviceProp prop{};
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_)); !s.ok()) return CudaToAbsl(s);
  sm_count_ = prop.multiProcessorCount;
  l2_bytes_ = static_cast<size_t>(prop.l2CacheSize);
  return CudaToAbsl(FS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
}

absl::Status CudaTuner::Build(const EnvelopeEntry& e, bool random, Problem* p, std::string* skip) {
  const OpSpec* spec = FindOpSpec(e.op);
  if (spec == nullptr) {
    *skip = "the tuner does not know this op";
    return absl::OkStatus();
  }
  // The inputs as the op builds them for a key (the random source request is
  // built from the same description, at fewer rows).
  const std::vector<InputDesc> shapes = spec->inputs_for_key(e.key);
  const size_t dsize = DTypeSize(e.dtype);
  const int64_t M = e.key[0];

  if (random) {
    std::vector<int64_t> rest(e.key.begin() + 1, e.key.end());
    const std::string id = absl::StrCat(e.op, "|", static_cast<int>(e.dtype), "|", absl::StrJoin(rest, ","));
    if (id != source_id_) {
      source_rows_ = SourceRows(*spec, e.key, e.dtype);
      std::vector<int64_t> key = e.key;
      key[0] = source_rows_;
      source_ = MakeRandomRequest(e.op, e.dtype, key, /*seed=*/0x7475'6e65);
      source_id_ = id;
    }
  }

  // Host request: attributes (defaults, shape-dependent ones resolved, as
  // MakeRandomRequest's), shapes, index values.
  p->host = OpRequest();
  p->host.op = e.op;
  p->host.spec = spec;
  p->dtype = e.dtype;
  for (const AttrSpec& a : spec->attrs) p->host.attrs[a.name] = a.default_value;
  p->inputs.clear();
  p->outputs.clear();
  p->total = 0;
  for (const InputDesc& s : shapes) {
    const bool index = spec->is_index(s.name);
    HostTensor h;
    h.shape = s.shape;
    if (index) {
      h = HostTensor::FromInt64(DType::kI64, s.shape, s.values);
    } else {
      h.dtype = e.dtype;
    }
    DeviceTensor t{index ? DType::kI32 : e.dtype, s.shape, nullptr};
    const size_t bytes = static_cast<size_t>(t.numel()) * (index ? 4 : dsize);
    p->inputs.push_back({s.name, t, p->total, bytes});
    p->total += AlignUp(bytes);
    p->host.inputs[s.name] = std::move(h);
  }
  if (spec->resolve_attrs) spec->resolve_attrs(p->host);
  for (const auto& [name, shape] : OutputShapes(p->host)) {
    DeviceTensor t{e.dtype, shape, nullptr};
    const size_t bytes = static_cast<size_t>(t.numel()) * dsize;
    p->outputs.push_back({name, t, p->total, bytes});
    p->total += AlignUp(bytes);
  }

  // Device memory: the problem, the L2 flush buffer and some room for scratch.
  size_t free_bytes = 0, total_bytes = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes)); !s.ok()) return CudaToAbsl(s);
  const size_t held = arena_.size();
  if (p->total > held && p->total - held > free_bytes * 9 / 10) {
    *skip = absl::StrCat("needs ", p->total >> 20, " MiB of device memory, ", free_bytes >> 20, " MiB free");
    return absl::OkStatus();
  }
  void* base = nullptr;
  if (CudaStatus s = arena_.Get(p->total, &base); !s.ok()) return CudaToAbsl(s);
  char* dev = static_cast<char*>(base);
  p->in.clear();
  p->out.clear();
  for (Problem::Slot& s : p->inputs) {
    s.tensor.data = dev + s.offset;
    p->in[s.name] = s.tensor;
  }
  for (Problem::Slot& s : p->outputs) {
    s.tensor.data = dev + s.offset;
    p->out[s.name] = s.tensor;
  }

  // Fill.
  cudaStream_t st = stream_;
  if (!random) {
    const size_t in_bytes = p->outputs.empty() ? p->total : p->outputs[0].offset;
    if (CudaStatus s = FS_CUDA_CHECK(cudaMemsetAsync(dev, 0, in_bytes, st)); !s.ok()) return CudaToAbsl(s);
  }
  for (size_t i = 0; i < p->inputs.size(); ++i) {
    const Problem::Slot& slot = p->inputs[i];
    const InputDesc& s = shapes[i];
    char* dst = dev + slot.offset;
    if (spec->is_index(s.name)) {
      std::vector<int32_t> v32(s.values.begin(), s.values.end());
      if (CudaStatus c = FS_CUDA_CHECK(cudaMemcpyAsync(dst, v32.data(), v32.size() * 4, cudaMemcpyHostToDevice, st));
          !c.ok())
        return CudaToAbsl(c);
      if (CudaStatus c = FS_CUDA_CHECK(cudaStreamSynchronize(st)); !c.ok()) return CudaToAbsl(c);  // v32 is local
      continue;
    }
    if (!random) continue;
    const std::string& src = source_.in(s.name).data;
    if (!s.token) {
      if (src.size() != slot.bytes) return absl::InternalError("tuner: source size mismatch for " + s.name);
      if (CudaStatus c = FS_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), slot.bytes, cudaMemcpyHostToDevice, st));
          !c.ok())
        return CudaToAbsl(c);
      continue;
    }
    // Token input: copy the source's first rows, then double up to M rows.
    const size_t row_bytes = slot.bytes / static_cast<size_t>(M);
    const int64_t have = std::min(M, source_rows_);
    if (CudaStatus c = FS_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), have * row_bytes, cudaMemcpyHostToDevice, st));
        !c.ok())
      return CudaToAbsl(c);
    for (int64_t filled = have; filled < M;) {
      const int64_t n = std::min(filled, M - filled);
      if (CudaStatus c = FS_CUDA_CHECK(
              cudaMemcpyAsync(dst + filled * row_bytes, dst, n * row_bytes, cudaMemcpyDeviceToDevice, st));
          !c.ok())
        return CudaToAbsl(c);
      filled += n;
    }
  }
  return CudaToAbsl(FS_CUDA_CHECK(cudaStreamSynchronize(st)));
}

CudaStatus CudaTuner::Launch(Problem& p, const std::string& config, const ConfigLookup& tuned, bool* handled) {
  DispatchContext ctx;
  ctx.stream = stream_;
  ctx.sm_count = sm_count_;
  ctx.scratch = &scratch_;
  const std::string& op = p.host.op;
  const DType dtype = p.dtype;
  ctx.config = [&](const std::string& o, DType d, const std::vector<int64_t>& key) -> std::string {
    if (o == op && d == dtype) return config;
    return tuned ? tuned(o, d, key) : std::string();
  };
  return RunCudaOp(p.host, p.in, p.out, ctx, handled);
}

absl::Status CudaTuner::Recover(const std::string& what) {
  cudaGetLastError();  // a launch-configuration error is not sticky
  const cudaError_t err = cudaStreamSynchronize(stream_);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("the CUDA context failed after ", what, ": ", cudaGetErrorName(err), " (",
                                            cudaGetErrorString(err), ")"));
  }
  return absl::OkStatus();
}

CudaStatus CudaTuner::Sample(const Problem& p, std::vector<std::vector<float> >* out) {
  out->clear();
  for (const Problem::Slot& slot : p.outputs) {
    const int64_t rows = slot.tensor.shape.empty() ? 1 : std::max<int64_t>(1, slot.tensor.shape[0]);
    const size_t row_bytes = slot.bytes / static_cast<size_t>(rows);
    // Evenly spaced blocks of rows, the first and the last included.
    int64_t want = row_bytes == 0 ? rows : std::max<int64_t>(2, kSampleBytes / static_cast<int64_t>(row_bytes));
    want = std::min(want, rows);
    const int64_t blocks = std::min<int64_t>(16, want);
    const int64_t per_block = want / blocks;
    HostTensor h;
    h.dtype = slot.tensor.dtype;
    h.shape = {blocks * per_block, static_cast<int64_t>(row_bytes / DTypeSize(h.dtype))};
    h.data.resize(static_cast<size_t>(blocks * per_block) * row_bytes);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = blocks == 1 ? 0 : b * (rows - per_block) / (blocks - 1);
      const char* src = static_cast<const char*>(slot.tensor.data) + first * row_bytes;
      if (CudaStatus s = FS_CUDA_CHECK(
              cudaMemcpy(&h.data[b * per_block * row_bytes], src, per_block * row_bytes, cudaMemcpyDeviceToHost));
          !s.ok())
        return s;
    }
    out->push_back(h.ToFloat());
  }
  return CudaStatus::Ok();
}

// Relative error norm; a NaN/Inf where the reference is finite (an element
// the candidate did not write stays NaN) counts as a mismatch.
bool Matches(const std::vector<std::vector<float> >& ref, const std::vector<std::vector<float> >& got, DType dtype,
             double* rel) {
  double diff = 0, norm = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    if (t >= got.size() || got[t].size() != ref[t].size()) return false;
    for (size_t i = 0; i < ref[t].size(); ++i) {
      const double r = ref[t][i], g = got[t][i];
      if (!std::isfinite(r)) {
        if (std::isfinite(g)) return false;
        continue;
      }
      if (!std::isfinite(g)) {
        *rel = INFINITY;
        return false;
      }
      diff += (g - r) * (g - r);
      norm += r * r;
    }
  }
  *rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return *rel <= Tolerance(dtype);
}

absl::StatusOr<double> CudaTuner::Time(Problem& p, const std::string& config, const ConfigLookup& tuned, int runs,
                                       bool gated) {
  if (predecessor_us_ < 0) {
    absl::StatusOr<double> alone = TimeSpans(kPredecessorRuns, /*gated=*/true, [] { return CudaStatus::Ok(); });
    if (!alone.ok()) return alone.status();
    predecessor_us_ = *alone;
  }
  absl::StatusOr<double> us = TimeSpans(runs, gated, [&] {
    bool handled = false;
    return Launch(p, config, tuned, &handled);
  });
  if (!us.ok()) return us;
  // What the candidate adds behind the predecessor (never below a tenth of the span).
  return std::max(*us - predecessor_us_, 0.1 * *us);
}

absl::StatusOr<double> CudaTuner::TimeSpans(int runs, bool gated, const std::function<CudaStatus()>& launch) {
  while (static_cast<int>(events_.size()) < 2 * runs) {
    cudaEvent_t e;
    if (CudaStatus s = FS_CUDA_CHECK(cudaEventCreate(&e)); !s.ok()) return CudaToAbsl(s);
    events_.push_back(e);
  }
  void* flush = nullptr;
  const size_t flush_bytes = std::max<size_t>(2 * l2_bytes_, size_t{8} << 20);
  if (CudaStatus s = flush_.Get(flush_bytes, &flush); !s.ok()) return CudaToAbsl(s);
  void* predecessor = nullptr;
  if (CudaStatus s = predecessor_.Get(kPredecessorBytes, &predecessor); !s.ok()) return CudaToAbsl(s);

  // A member, not a local: if the context dies, the host function may still
  // run after we return.
  Gate& gate = gate_;
  gate.Reset();
  if (gated) {
    if (CudaStatus s = FS_CUDA_CHECK(cudaLaunchHostFunc(stream_, &Gate::Wait, &gate)); !s.ok()) return CudaToAbsl(s);
  }
  CudaStatus failed;
  for (int i = 0; i < runs && failed.ok(); ++i) {
    failed = FS_CUDA_CHECK(cudaMemsetAsync(flush, i & 1, flush_bytes, stream_));
    if (failed.ok()) failed = FS_CUDA_CHECK(cudaEventRecord(events_[2 * i], stream_));
    if (failed.ok()) failed = cuda::LaunchPredecessor(predecessor, kPredecessorBytes, stream_);
    if (failed.ok()) failed = launch();
    if (failed.ok()) failed = FS_CUDA_CHECK(cudaEventRecord(events_[2 * i + 1], stream_));
  }
  if (gated) gate.Open();
  if (!failed.ok()) {
    if (absl::Status s = Recover("timing: " + failed.message); !s.ok()) return s;
    return absl::AbortedError(failed.message);
  }
  if (CudaStatus s = FS_CUDA_CHECK(cudaStreamSynchronize(stream_)); !s.ok()) return CudaToAbsl(s);
  if (gate.timed_out) return TimeSpans(runs, /*gated=*/false, launch);
  std::vector<double> us(runs);
  for (int i = 0; i < runs; ++i) {
    float ms = 0;
    if (CudaStatus s = FS_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1])); !s.ok())
      return CudaToAbsl(s);
    us[i] = 1000.0 * ms;
  }
  std::nth_element(us.begin(), us.begin() + runs / 2, us.end());
  return us[runs / 2];
}

absl::StatusOr<TuneResult> CudaTuner::Tune(const EnvelopeEntry& e, const ConfigLookup& tuned) {
  if (absl::Status s = Init(); !s.ok()) return s;
  TuneResult result;
  std::vector<std::string> candidates = CudaCandidates(e.op, e.dtype, e.key);
  result.candidates = static_cast<int64_t>(candidates.size());
  if (candidates.size() <= 1) {
    // Nothing to choose: only check that the op runs here.
    result.default_config = candidates.empty() ? "" : candidates[0];
    absl::Status s = RunOnce(e, result.default_config, tuned);
    if (absl::IsUnimplemented(s)) {
      result.supported = false;
      result.note = "no CUDA kernel";
      return result;
    }
    if (!s.ok()) {
      if (absl::IsInternal(s)) return s;
      result.supported = false;
      result.note = std::string(s.message());
    }
    return result;
  }
  result.default_config = candidates[0];

  Problem p;
  std::string skip;
  if (absl::Status s = Build(e, /*random=*/true, &p, &skip); !s.ok()) return s;
  if (!skip.empty()) {
    result.supported = false;
    result.note = skip;
    return result;
  }

  std::vector<std::vector<float> > reference, got;
  for (const std::string& config : candidates) {
    const bool is_default = config == candidates[0];
    // Correctness run on poisoned outputs (all-ones bits: NaN in every float dtype).
    for (const Problem::Slot& slot : p.outputs) {
      if (CudaStatus s = FS_CUDA_CHECK(cudaMemsetAsync(slot.tensor.data, 0xff, slot.bytes, stream_)); !s.ok())
        return CudaToAbsl(s);
    }
    bool handled = false;
    CudaStatus run = Launch(p, config, tuned, &handled);
    if (!handled) {
      result.supported = false;
      result.note = "no CUDA kernel";
      return result;
    }
    if (run.ok()) run = FS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (!run.ok()) {
      if (absl::Status s = Recover("candidate " + config); !s.ok()) return s;
      if (is_default) {
        result.supported = false;
        result.note = (run.unsupported ? "unsupported: " : "the default config " + config + " failed: ") + run.message;
        return result;
      }
      result.rejected.emplace_back(config, "launch_failed");
      continue;
    }
    if (CudaStatus s = Sample(p, is_default ? &reference : &got); !s.ok()) return CudaToAbsl(s);
    double rel = 0;
    if (!is_default && !Matches(reference, got, e.dtype, &rel)) {
      result.rejected.emplace_back(config, "mismatch");
      continue;
    }

    // One timed run for the estimate, then the gated, flushed runs.
    absl::StatusOr<double> estimate = Time(p, config, tuned, 1, /*gated=*/false);
    absl::StatusOr<double> median = estimate;
    if (estimate.ok()) {
      const int runs = static_cast<int>(
          std::clamp(kCandidateBudgetUs / std::max(*estimate, 1.0), double{kMinRuns}, double{kMaxRuns}));
      median = Time(p, config, tuned, runs, /*gated=*/true);
    }
    ++result.benchmarks;
    if (!median.ok()) {
      if (!absl::IsAborted(median.status())) return median.status();
      if (is_default) {
        result.supported = false;
        result.note = "the default config " + config + " failed: " + std::string(median.status().message());
        return result;
      }
      result.rejected.emplace_back(config, "launch_failed");
      continue;
    }
    if (is_default) result.default_us = *median;
    result.accepted.push_back({config, *median});
  }
  std::stable_sort(result.accepted.begin(), result.accepted.end(),
                   [](const CandidateTime& a, const CandidateTime& b) { return a.us < b.us; });
  return result;
}

absl::Status CudaTuner::RunOnce(const EnvelopeEntry& e, const std::string& config, const ConfigLookup& tuned) {
  if (absl::Status s = Init(); !s.ok()) return s;
  Problem p;
  std::string skip;
  if (absl::Status s = Build(e, /*random=*/false, &p, &skip); !s.ok()) return s;
  if (!skip.empty()) return absl::ResourceExhaustedError(skip);
  bool handled = false;
  CudaStatus run = Launch(p, config, tuned, &handled);
  if (!handled) return absl::UnimplementedError("no CUDA kernel for " + e.op);
  // The default config refusing the shape: the device has no kernel for it.
  if (run.unsupported && config.empty()) return absl::UnimplementedError(run.message);
  if (run.ok()) run = FS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (!run.ok()) {
    if (absl::Status s = Recover("running " + e.op); !s.ok()) return s;
    return absl::FailedPreconditionError(run.message);
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Tuner> MakeCudaTuner() {
  if (CudaDeviceCount() == 0) return nullptr;
  return std::make_unique<CudaTuner>();
}

}  // namespace fusedserve

#endif  // FUSEDSERVE_HAVE_CUDA
