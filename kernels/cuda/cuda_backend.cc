// CUDA backend. Launches run on lanes: a stream and the buffers of one
// launch at a time, each lane behind its own mutex. Lane 0 runs everything;
// small memory-bound launches (the zero-copy ones below: norms, softmax,
// activations, rope, one pass and no shared device state) may also take any
// other free lane, so several gRPC threads run their own small ops side by
// side instead of queueing for one stream (such a kernel is a few µs on a
// few SMs; the GPU runs them concurrently). GEMMs and attention stay on
// lane 0 (cuBLASLt's workspace is one per device), and so do large launches:
// the other lanes' buffers stay at the zero-copy size, so lanes cost no
// pinned or device memory beyond that.
//
// A launch packs its inputs into the lane's pinned staging buffer and copies
// them with a single H2D transfer into the lane's device arena (grown on
// demand and reused), dispatches the op, and brings the outputs back with a
// single D2H transfer. Nothing is allocated per call once the buffers have
// reached the largest request's size.
//
// Small row-wise ops (at most kZeroCopyBytes of inputs and outputs) skip both
// copies: the kernel reads its inputs from the pinned staging buffer and
// writes its outputs there (mapped host memory, one address space), so a
// round trip is one launch and one wait. The wait spins for a short while
// (these ops finish in microseconds; a blocking wait would add a wake-up)
// before it blocks; it spins on a word of the lane's pinned memory that the
// stream writes once the launch is done (LaneFlag), not on the driver.
// Stage times (h2d, kernel, d2h) go to ThisThreadStageTimes(): CUDA events
// on the copy path, the host clock on the zero-copy path (h2d/d2h: packing
// into and copying out of pinned memory).
#include "kernels/cuda/cuda_backend.h"

#include <cuda.h>  // the stream memory op's types; the function comes through the runtime
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/clock.h"
#include "kernels/cuda/buffers.h"
#include "kernels/cuda/env_knob.h"

namespace fusedserve {
namespace {

// Tensors in the lanes' buffers start where they would in a staging block.
constexpr size_t kAlign = StagingBlock::kAlign;
// Zero-copy launches: inputs + outputs at most this size, memory-bound ops
// (OpSpec::memory_bound: one row-wise pass) only. Up to 1 MiB the kernel
// reading over PCIe beats two copies plus their launches at every measured
// size (H100, gpu_backend_latency_bench: rms_norm [8,4096] 25 vs 46 us,
// [64,4096] 108 vs 131 us, softmax [1,32000] 24 vs 46 us).
constexpr size_t kZeroCopyBytes = 1 << 20;
// How long a wait spins before it blocks.
constexpr absl::Duration kSpinWait = absl::Microseconds(200);

// Largest zero-copy launch: kZeroCopyBytes unless FUSEDSERVE_ZERO_COPY_BYTES
// says otherwise; FUSEDSERVE_ZERO_COPY=0 turns zero-copy off (A/B, a way out).
size_t ZeroCopyLimit() {
  static const size_t limit = cuda::EnvKnob("FUSEDSERVE_ZERO_COPY", 0, 1, 1) == 0
                                  ? 0
                                  : static_cast<size_t>(cuda::EnvKnob("FUSEDSERVE_ZERO_COPY_BYTES", 0, 1 << 30,
                                                                      static_cast<int>(kZeroCopyBytes)));
  return limit;
}

bool WaitYields() {
  static const bool yield = cuda::EnvKnob("FUSEDSERVE_WAIT_YIELD", 0, 1, 1) != 0;
  return yield;
}

// Spins until done() says `st`'s work is over, or blocks in
// cudaStreamSynchronize once kSpinWait has passed since `start`. The spin
// yields the core between tries: under concurrency the spinning gRPC
// threads share the cores with the client and the other calls (H200 host,
// 16 lanes, c=64: 94k req/s against 78k without the yield). Yielding only
// while another wait spins measured within the host's noise at c=1 and no
// better at c=64, in two sessions. FUSEDSERVE_WAIT_YIELD=0 spins without
// yielding (A/B). The clock is read every 16 tries, not on each.
template <typename Done>
CudaStatus Spin(cudaStream_t st, absl::Time start, Done&& done) {
  const absl::Time until = start + kSpinWait;
  for (int i = 1;; ++i) {
    if (CudaStatus s; done(&s)) return s;
    if (i % 16 == 0 && FastNow() > until) return FS_CUDA_CHECK(cudaStreamSynchronize(st));
    if (WaitYields()) sched_yield();
  }
}

// Waits for `st`: spins on cudaStreamQuery, then blocks.
CudaStatus WaitStream(cudaStream_t st, absl::Time start = FastNow()) {
  return Spin(st, start, [st](CudaStatus* s) {
    const cudaError_t e = cudaStreamQuery(st);
    if (e == cudaErrorNotReady) return false;
    *s = e == cudaSuccess ? CudaStatus::Ok() : FS_CUDA_CHECK(e);
    return true;
  });
}

// The driver's cuStreamWriteValue32 (through the runtime: no -lcuda), or
// null where it is missing or FUSEDSERVE_WAIT_FLAG=0 (A/B: cudaStreamQuery).
using StreamWriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
StreamWriteValue32 WriteValue32() {
  static const StreamWriteValue32 fn = []() -> StreamWriteValue32 {
    if (cuda::EnvKnob("FUSEDSERVE_WAIT_FLAG", 0, 1, 1) == 0) return nullptr;
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &f, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<StreamWriteValue32>(f);
  }();
  return fn;
}

// A lane's completion word: after a launch the stream writes the next
// sequence number into it (cuStreamWriteValue32, which fences the launch's
// writes system-wide first), and the waiting thread spins on the word, a
// read of its own memory, instead of calling cudaStreamQuery, a driver call
// under the driver's locks. H200, gpu_roundtrip_bench, one zero-copy
// rms_norm row: 12.9-13.8 us against 13.6-14.6 with the query. A launch that
// fails on the device never writes the word: the wait then blocks in
// cudaStreamSynchronize after kSpinWait, which returns the error.
class LaneFlag {
 public:
  // Waits for everything enqueued on `st` so far (`start`: now, or a moment ago).
  CudaStatus Wait(cudaStream_t st, absl::Time start) {
    const StreamWriteValue32 write = WriteValue32();
    if (write == nullptr || broken_) return WaitStream(st, start);
    char* host = nullptr;
    char* dev = nullptr;
    if (CudaStatus s = word_.Get(sizeof(uint32_t), &host, &dev); !s.ok()) return s;
    const uint32_t seq = ++seq_;
    if (write(st, reinterpret_cast<CUdeviceptr>(dev), seq, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
      broken_ = true;  // e.g. stream memory ops disabled on this system: the query from now on
      return WaitStream(st, start);
    }
    const volatile uint32_t* word = reinterpret_cast<const volatile uint32_t*>(host);
    return Spin(st, start, [word, seq](CudaStatus* s) {
      if (*word != seq) return false;
      std::atomic_thread_fence(std::memory_order_acquire);  // the outputs, read after the word
      *s = CudaStatus::Ok();
      return true;
    });
  }

 private:
  PinnedBuffer word_;
  uint32_t seq_ = 0;
  bool broken_ = false;
};

size_t AlignUp(size_t n) { return StagingBlock::AlignUp(n); }

// Four timing events around the copy path's H2D, kernels and D2H.
class StageEvents {
 public:
  ~StageEvents() {
    for (cudaEvent_t e : ev_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  // Lazily created (on the device current at the first call).
  CudaStatus Record(int i, cudaStream_t st) {
    if (ev_[i] == nullptr) {
      if (CudaStatus s = FS_CUDA_CHECK(cudaEventCreate(&ev_[i])); !s.ok()) return s;
    }
    return FS_CUDA_CHECK(cudaEventRecord(ev_[i], st));
  }
  // Seconds from event i to event j (both recorded and complete).
  double Seconds(int i, int j) const {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, ev_[i], ev_[j]) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return ms * 1e-3;
  }

 private:
  cudaEvent_t ev_[4] = {nullptr, nullptr, nullptr, nullptr};
};

// A stream and the buffers of one launch at a time.
struct Lane {
  std::mutex mu;
  DispatchContext ctx;
  DeviceBuffer arena;
  DeviceBuffer scratch;
  PinnedBuffer staging;
  StageEvents events;
  LaneFlag done;
};

struct Slot {
  std::string name;
  DeviceTensor t;
  size_t offset;
  size_t bytes;
  const HostTensor* src = nullptr;  // an input's request tensor
};

// `m` set to the slots' tensors, its nodes (and their shapes' memory)
// reused where the names repeat from the last call.
void FillTensorMap(const std::vector<Slot>& slots, DeviceTensorMap* m) {
  for (auto it = m->begin(); it != m->end();) {
    const bool kept = std::any_of(slots.begin(), slots.end(), [&](const Slot& s) { return s.name == it->first; });
    it = kept ? std::next(it) : m->erase(it);
  }
  for (const Slot& slot : slots) {
    DeviceTensor& t = (*m)[slot.name];
    t.dtype = slot.t.dtype;
    t.shape.assign(slot.t.shape.begin(), slot.t.shape.end());
    t.data = slot.t.data;
  }
}

// Staging blocks (Backend::TakeStaging): mapped pinned memory, per thread
// (taking one costs no lock), reused once no tensor holds one. A thread holds
// at most kStagingBlocksPerThread (its calls in flight: one at c=1).
struct PinnedStagingBlock : StagingBlock {
  PinnedBuffer buffer;
};
constexpr size_t kStagingMinBytes = 64 << 10;
constexpr size_t kStagingBlocksPerThread = 8;

bool StagedDecode() {
  static const bool on = cuda::EnvKnob("FUSEDSERVE_STAGED_DECODE", 0, 1, 1) != 0;
  return on;
}

std::shared_ptr<StagingBlock> TakeStagingBlock(int device, size_t bytes) {
  static thread_local std::vector<std::shared_ptr<PinnedStagingBlock>> pool;
  std::shared_ptr<PinnedStagingBlock>* small = nullptr;  // a free block too small to use
  for (std::shared_ptr<PinnedStagingBlock>& b : pool) {
    if (b.use_count() != 1) continue;
    // Its last holder has dropped it (and the GPU, waited for, is done with it).
    std::atomic_thread_fence(std::memory_order_acquire);
    if (b->size >= bytes) {
      b->used = 0;
      b->outputs_placed = false;
      return b;
    }
    small = &b;
  }
  if (small == nullptr && pool.size() >= kStagingBlocksPerThread) return nullptr;
  size_t size = kStagingMinBytes;
  while (size < bytes) size *= 2;
  auto b = std::make_shared<PinnedStagingBlock>();
  if (cudaSetDevice(device) != cudaSuccess || !b->buffer.Allocate(size).ok()) {
    cudaGetLastError();
    return nullptr;  // the request's tensors own their bytes instead
  }
  b->host = b->buffer.as<char>();
  b->device = static_cast<char*>(b->buffer.device());
  b->size = size;
  if (small != nullptr) {
    *small = b;
  } else {
    pool.push_back(b);
  }
  return b;
}

// The block that all of a zero-copy request's inputs (laid out in `inputs`)
// were decoded into, with room after them for the inputs the device takes
// in another dtype (index tensors sent as I64) and `out_bytes` of outputs:
// the launch then reads and writes it in place. Null when any input is
// elsewhere, or a launch has already placed its outputs there.
const std::shared_ptr<StagingBlock>* StagedBlock(const std::vector<Slot>& inputs, size_t out_bytes) {
  const std::shared_ptr<StagingBlock>* block = nullptr;
  size_t room = out_bytes;
  for (const Slot& slot : inputs) {
    const HostTensor& t = *slot.src;
    if (t.view == nullptr || t.block == nullptr || (block != nullptr && t.block != *block)) return nullptr;
    if (slot.t.dtype != t.dtype) room += AlignUp(slot.bytes);
    block = &t.block;
  }
  if (block == nullptr) return nullptr;
  const StagingBlock& b = **block;
  if (b.outputs_placed || AlignUp(b.used) + room > b.size) return nullptr;
  return block;
}

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, std::string name, std::vector<std::unique_ptr<Lane>> lanes)
      : device_(device), name_(std::move(name)), lanes_(std::move(lanes)) {}
  ~CudaBackend() override {
    cudaSetDevice(device_);
    for (auto& lane : lanes_) cudaStreamDestroy(lane->ctx.stream);
  }

  using Backend::Run;
  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return name_; }
  std::shared_ptr<StagingBlock> TakeStaging(size_t bytes) override {
    // Worth it only where the launch will read the block in place.
    if (!StagedDecode() || bytes > 2 * ZeroCopyLimit() + kStagingMinBytes) return nullptr;
    return TakeStagingBlock(device_, bytes);
  }

  // GPU work is bounded by the cost limits (--max_op_flops) rather than
  // interrupted: one launch runs milliseconds at most, so `stop` is not polled.
  absl::StatusOr<TensorMap> Run(const OpRequest& r, const StopCheck&, const WhileRunning& while_running) override {
    const absl::Time t0 = FastNow();
    const DType dt = RequestDType(r);

    // Lay out inputs then outputs in one buffer; index inputs become I32.
    // (Per-thread slots and maps, filled in place: a run of one op
    // allocates nothing here once they have grown.)
    static thread_local std::vector<Slot> inputs, outputs;
    static thread_local DeviceTensorMap din, dout;
    inputs.resize(r.inputs.size());
    size_t total = 0;
    auto place = [&total](Slot& slot, const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
      slot.name = name;
      slot.t.dtype = dtype;
      slot.t.shape.assign(shape.begin(), shape.end());
      slot.offset = total;
      slot.bytes = slot.t.numel() * DTypeSize(dtype);
      total += AlignUp(slot.bytes);
    };
    size_t i = 0;
    for (const auto& [name, t] : r.inputs) {
      inputs[i].src = &t;
      place(inputs[i++], name, r.spec != nullptr && r.spec->is_index(name) ? DType::kI32 : t.dtype, t.shape);
    }
    const size_t out_begin = total;
    const OutputShapeList shapes = OutputShapes(r);
    outputs.resize(shapes.size());
    i = 0;
    for (const auto& [name, shape] : shapes) place(outputs[i++], name, dt, shape);
    const bool zero_copy = total <= ZeroCopyLimit() && r.spec != nullptr && r.spec->memory_bound;
    // Inputs decoded into a staging block are read in place and the outputs
    // written after them: no packing, no unpacking (see StagingBlock).
    const std::shared_ptr<StagingBlock>* staged = zero_copy ? StagedBlock(inputs, total - out_begin) : nullptr;
    std::unique_lock<std::mutex> lock;
    Lane& lane = zero_copy ? TakeAnyLane(&lock) : TakeLane(0, &lock);
    if (CudaStatus s = FS_CUDA_CHECK(cudaSetDevice(device_)); !s.ok()) return CudaToAbsl(s);
    void* dev = nullptr;
    char* host = nullptr;
    char* host_dev = nullptr;  // `host` as kernels address it
    if (staged != nullptr) {
      // Converted inputs, then the outputs, right after the decoded inputs.
      StagingBlock& b = **staged;
      b.outputs_placed = true;
      size_t at = AlignUp(b.used);
      for (Slot& slot : inputs) {
        if (slot.t.dtype == slot.src->dtype) continue;
        slot.offset = at;
        at += AlignUp(slot.bytes);
      }
      for (Slot& slot : outputs) slot.offset += at - out_begin;
      host = b.host;
      host_dev = b.device;
    } else {
      if (!zero_copy) {
        if (CudaStatus s = lane.arena.Get(std::max<size_t>(total, kAlign), &dev); !s.ok()) return CudaToAbsl(s);
      }
      if (CudaStatus s = lane.staging.Get(std::max<size_t>(total, kAlign), &host, &host_dev); !s.ok())
        return CudaToAbsl(s);
    }
    if (zero_copy) dev = host_dev;

    for (Slot& slot : inputs) {
      if (staged != nullptr && slot.t.dtype == slot.src->dtype) {  // read where it was decoded
        slot.t.data = (*staged)->device + (slot.src->view - (*staged)->host);
      } else {
        WriteDeviceInput(r, slot.name, host + slot.offset);
        slot.t.data = static_cast<char*>(dev) + slot.offset;
      }
    }
    for (Slot& slot : outputs) slot.t.data = static_cast<char*>(dev) + slot.offset;
    FillTensorMap(inputs, &din);
    FillTensorMap(outputs, &dout);
    cudaStream_t st = lane.ctx.stream;
    StageEvents& events = lane.events;
    const absl::Time packed = FastNow();
    if (!zero_copy) {
      if (CudaStatus s = events.Record(0, st); !s.ok()) return CudaToAbsl(s);
      if (CudaStatus s = FS_CUDA_CHECK(cudaMemcpyAsync(dev, host, out_begin, cudaMemcpyHostToDevice, st)); !s.ok())
        return CudaToAbsl(s);
      if (CudaStatus s = events.Record(1, st); !s.ok()) return CudaToAbsl(s);
    }

    bool handled = false;
    const CudaStatus status = RunCudaOp(r, din, dout, lane.ctx, &handled);
    if (!handled) return absl::UnimplementedError("op '" + r.op + "' has no CUDA implementation");
    // A valid request outside what the kernels take (e.g. a head dim the
    // flash kernels lack): answer it with the CPU reference, slowly but right.
    if (status.unsupported) {
      // The zero-copy kernels may still read the staging buffer: wait first.
      if (CudaStatus s = WaitStream(st); !s.ok()) return CudaToAbsl(s);
      lock.unlock();
      return cpu_fallback_->Run(r);
    }
    if (!status.ok()) return CudaToAbsl(status);

    if (!zero_copy) {
      if (CudaStatus s = events.Record(2, st); !s.ok()) return CudaToAbsl(s);
      if (total > out_begin) {
        if (CudaStatus s = FS_CUDA_CHECK(cudaMemcpyAsync(host + out_begin, static_cast<char*>(dev) + out_begin,
                                                         total - out_begin, cudaMemcpyDeviceToHost, st));
            !s.ok())
          return CudaToAbsl(s);
      }
      if (CudaStatus s = events.Record(3, st); !s.ok()) return CudaToAbsl(s);
    }
    // Staged outputs stay where the kernels write them (the result holds the
    // block too), so the result is known before the wait and the caller's
    // host work (WhileRunning) runs under the device's round trip. An
    // exception from it waits for the device first: the block is still
    // being written.
    TensorMap result;
    auto fill = [&] {
      for (const Slot& slot : outputs) {
        HostTensor& t = result[slot.name];
        t.dtype = slot.t.dtype;
        t.shape = slot.t.shape;
        if (staged != nullptr) {
          t.SetView(*staged, host + slot.offset, slot.bytes);
        } else {
          t.data.assign(host + slot.offset, slot.bytes);
        }
      }
    };
    std::exception_ptr while_running_error;
    if (staged != nullptr) {
      fill();
      if (while_running) {
        try {
          while_running(result);
        } catch (...) {
          while_running_error = std::current_exception();
        }
      }
    }
    if (CudaStatus s = lane.done.Wait(st, packed); !s.ok()) return CudaToAbsl(s);
    const absl::Time done = FastNow();
    if (while_running_error) std::rethrow_exception(while_running_error);
    if (staged == nullptr) fill();
    BackendStageTimes& times = ThisThreadStageTimes();
    times.valid = true;
    if (zero_copy) {
      times.h2d = absl::ToDoubleSeconds(packed - t0);
      times.kernel = absl::ToDoubleSeconds(done - packed);
      times.d2h = absl::ToDoubleSeconds(FastNow() - done);
    } else {
      times.h2d = absl::ToDoubleSeconds(packed - t0) + events.Seconds(0, 1);
      times.kernel = events.Seconds(1, 2);
      times.d2h = events.Seconds(2, 3) + absl::ToDoubleSeconds(FastNow() - done);
    }
    return result;
  }

 private:
  Lane& TakeLane(size_t i, std::unique_lock<std::mutex>* lock) {
    *lock = std::unique_lock<std::mutex>(lanes_[i]->mu);
    return *lanes_[i];
  }
  // The first free lane from the one this thread used last (its buffers are
  // warm and sized for its requests); that one, waited for, when all are busy.
  Lane& TakeAnyLane(std::unique_lock<std::mutex>* lock) {
    static thread_local size_t last = 0;
    const size_t n = lanes_.size();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (last + k) % n;
      std::unique_lock<std::mutex> l(lanes_[i]->mu, std::try_to_lock);
      if (l.owns_lock()) {
        last = i;
        *lock = std::move(l);
        return *lanes_[i];
      }
    }
    return TakeLane(last % n, lock);
  }

  const int device_;
  const std::string name_;
  const std::vector<std::unique_ptr<Lane>> lanes_;
  const std::unique_ptr<Backend> cpu_fallback_ = MakeCpuBackend();
};

}  // namespace

absl::Status CudaToAbsl(const CudaStatus& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const std::string m = what.empty() ? s.message : what + ": " + s.message;
  if (s.unsupported) return absl::InvalidArgumentError(m);
  if (s.out_of_memory) return absl::ResourceExhaustedError(m);
  return absl::InternalError(m);
}

DeviceTensor DeviceInput(const OpRequest& r, const std::string& name) {
  const HostTensor& host = r.in(name);
  const bool index = r.spec != nullptr && r.spec->is_index(name);
  return DeviceTensor{index ? DType::kI32 : host.dtype, host.shape, nullptr};
}

void WriteDeviceInput(const OpRequest& r, const std::string& name, void* dst) {
  const HostTensor& src = r.in(name);
  if (DeviceInput(r, name).dtype == DType::kI32 && src.dtype != DType::kI32) {
    const std::vector<int64_t> v = src.ToInt64();
    char* out = static_cast<char*>(dst);
    for (size_t i = 0; i < v.size(); ++i) {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(out + 4 * i, &x, 4);
    }
  } else {
    const std::string_view bytes = src.bytes();
    std::memcpy(dst, bytes.data(), bytes.size());
  }
}

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device, ConfigLookup config, int small_op_lanes) {
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::FailedPreconditionError("CUDA device " + std::to_string(device) + " is not available");
  }
  if (small_op_lanes < 1 || small_op_lanes > kMaxCudaSmallOpLanes) {
    return absl::InvalidArgumentError("CUDA small-op lanes must be 1.." + std::to_string(kMaxCudaSmallOpLanes));
  }
  if (CudaStatus s = FS_CUDA_CHECK(cudaSetDevice(device)); !s.ok()) return CudaToAbsl(s);
  cudaDeviceProp prop{};
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device)); !s.ok()) return CudaToAbsl(s);
  std::vector<std::unique_ptr<Lane>> lanes;
  for (int i = 0; i < small_op_lanes; ++i) {
    auto lane = std::make_unique<Lane>();
    if (CudaStatus s = FS_CUDA_CHECK(cudaStreamCreateWithFlags(&lane->ctx.stream, cudaStreamNonBlocking)); !s.ok()) {
      for (auto& made : lanes) cudaStreamDestroy(made->ctx.stream);
      return CudaToAbsl(s);
    }
    lane->ctx.sm_count = prop.multiProcessorCount;
    lane->ctx.config = config;
    lane->ctx.scratch = &lane->scratch;
    lanes.push_back(std::move(lane));
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, prop.name, std::move(lanes)));
}

}  // namespace fusedserve
