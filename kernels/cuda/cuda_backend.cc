// CUDA backend. One request at a time per device (a mutex): inputs are packed
// into one pinned staging buffer and copied with a single H2D transfer into a
// device arena that is grown on demand and reused, the op is dispatched, and
// the outputs come back with a single D2H transfer. Nothing is allocated per
// call once the arena has reached the largest request's size.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "absl/status/status.h"

namespace fusedserve {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A device buffer that only grows.
class DeviceArena : public Scratch {
 public:
  ~DeviceArena() override {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  CudaStatus Get(size_t bytes, void** ptr) override {
    if (bytes > size_) {
      if (ptr_ != nullptr) {
        if (CudaStatus s = FS_CUDA_CHECK(cudaFree(ptr_)); !s.ok()) return s;
        ptr_ = nullptr;
        size_ = 0;
      }
      if (CudaStatus s = FS_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); !s.ok()) return s;
      size_ = bytes;
    }
    *ptr = ptr_;
    return CudaStatus::Ok();
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  CudaStatus Get(size_t bytes, char** ptr) {
    if (bytes > size_) {
      if (ptr_ != nullptr) cudaFreeHost(ptr_);
      ptr_ = nullptr;
      size_ = 0;
      if (CudaStatus s = FS_CUDA_CHECK(cudaMallocHost(&ptr_, bytes)); !s.ok()) return s;
      size_ = bytes;
    }
    *ptr = static_cast<char*>(ptr_);
    return CudaStatus::Ok();
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, std::string name, int sm_count, cudaStream_t stream, ConfigLookup config)
      : device_(device), name_(std::move(name)) {
    ctx_.stream = stream;
    ctx_.sm_count = sm_count;
    ctx_.config = std::move(config);
    ctx_.scratch = &scratch_;
  }
  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamDestroy(ctx_.stream);
  }

  using Backend::Run;
  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return name_; }

  // GPU work is bounded by the cost limits (--max_op_flops) rather than
  // interrupted: one launch runs milliseconds at most, so `stop` is not polled.
  absl::StatusOr<TensorMap> Run(const OpRequest& r, const StopCheck&) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (CudaStatus s = FS_CUDA_CHECK(cudaSetDevice(device_)); !s.ok()) return CudaToAbsl(s);
    const DType dt = RequestDType(r);

    // Lay out inputs then outputs in one arena; index inputs become I32.
    struct Slot {
      std::string name;
      DeviceTensor t;
      size_t offset;
      size_t bytes;
    };
    std::vector<Slot> inputs, outputs;
    size_t total = 0;
    for (const auto& entry : r.inputs) {
      const std::string& name = entry.first;
      DeviceTensor t = DeviceInput(r, name);
      const size_t bytes = t.numel() * DTypeSize(t.dtype);
      inputs.push_back({name, t, total, bytes});
      total += AlignUp(bytes);
    }
    const size_t out_begin = total;
    for (const auto& [name, shape] : OutputShapes(r)) {
      DeviceTensor t{dt, shape, nullptr};
      const size_t bytes = t.numel() * DTypeSize(dt);
      outputs.push_back({name, t, total, bytes});
      total += AlignUp(bytes);
    }
    void* dev = nullptr;
    char* host = nullptr;
    if (CudaStatus s = arena_.Get(std::max<size_t>(total, kAlign), &dev); !s.ok()) return CudaToAbsl(s);
    if (CudaStatus s = staging_.Get(std::max<size_t>(total, kAlign), &host); !s.ok()) return CudaToAbsl(s);

    DeviceTensorMap din, dout;
    for (Slot& slot : inputs) {
      WriteDeviceInput(r, slot.name, host + slot.offset);
      slot.t.data = static_cast<char*>(dev) + slot.offset;
      din[slot.name] = slot.t;
    }
    for (Slot& slot : outputs) {
      slot.t.data = static_cast<char*>(dev) + slot.offset;
      dout[slot.name] = slot.t;
    }
    cudaStream_t st = ctx_.stream;
    if (CudaStatus s = FS_CUDA_CHECK(cudaMemcpyAsync(dev, host, out_begin, cudaMemcpyHostToDevice, st)); !s.ok())
      return CudaToAbsl(s);

    bool handled = false;
    const CudaStatus status = RunCudaOp(r, din, dout, ctx_, &handled);
    if (!handled) return absl::UnimplementedError("op '" + r.op + "' has no CUDA implementation");
    // A valid request outside what the kernels take (e.g. a head dim the
    // flash kernels lack): answer it with the CPU reference, slowly but right.
    if (status.unsupported) return cpu_fallback_->Run(r);
    if (!status.ok()) return CudaToAbsl(status);

    if (total > out_begin) {
      if (CudaStatus s = FS_CUDA_CHECK(cudaMemcpyAsync(host + out_begin, static_cast<char*>(dev) + out_begin,
                                                       total - out_begin, cudaMemcpyDeviceToHost, st));
          !s.ok())
        return CudaToAbsl(s);
    }
    if (CudaStatus s = FS_CUDA_CHECK(cudaStreamSynchronize(st)); !s.ok()) return CudaToAbsl(s);

    TensorMap result;
    for (const Slot& slot : outputs) {
      HostTensor t;
      t.dtype = slot.t.dtype;
      t.shape = slot.t.shape;
      t.data.assign(host + slot.offset, slot.bytes);
      result[slot.name] = std::move(t);
    }
    return result;
  }

 private:
  const int device_;
  const std::string name_;
  std::mutex mu_;
  DispatchContext ctx_;
  DeviceArena arena_;
  DeviceArena scratch_;
  PinnedBuffer staging_;
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
    std::memcpy(dst, src.data.data(), src.data.size());
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

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device, ConfigLookup config) {
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::FailedPreconditionError("CUDA device " + std::to_string(device) + " is not available");
  }
  if (CudaStatus s = FS_CUDA_CHECK(cudaSetDevice(device)); !s.ok()) return CudaToAbsl(s);
  cudaDeviceProp prop{};
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device)); !s.ok()) return CudaToAbsl(s);
  cudaStream_t stream = nullptr;
  if (CudaStatus s = FS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); !s.ok())
    return CudaToAbsl(s);
  return std::unique_ptr<Backend>(
      new CudaBackend(device, prop.name, prop.multiProcessorCount, stream, std::move(config)));
}

}  // namespace fusedserve
