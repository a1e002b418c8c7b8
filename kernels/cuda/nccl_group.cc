// NcclGroup (nccl_group.h): NCCL's functions resolved from libnccl.so.2 at
// run time. The types come from nccl.h when CMake found it
// (FUSEDSERVE_HAVE_NCCL_H); a build without the header says so on use.
#include "kernels/cuda/nccl_group.h"

#include <dlfcn.h>

#include <algorithm>
#include <type_traits>

#if FUSEDSERVE_HAVE_NCCL_H
#include <nccl.h>
#endif

namespace fusedserve::cuda {

#if FUSEDSERVE_HAVE_NCCL_H

struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
#ifdef NCCL_WIN_COLL_SYMMETRIC  // symmetric memory: nccl.h 2.27+; null with older libraries
  decltype(&ncclMemAlloc) mem_alloc = nullptr;
  decltype(&ncclMemFree) mem_free = nullptr;
  decltype(&ncclCommWindowRegister) window_register = nullptr;
  decltype(&ncclCommWindowDeregister) window_deregister = nullptr;
#endif
  void* lib = nullptr;     // the dlopen handle (Resolve)
  std::string load_error;  // empty when every required function resolved
};

namespace {

// Loaded once per process and never unloaded.
const NcclApi& LoadApi() {
  static const NcclApi* api = [] {
    auto* a = new NcclApi;
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      a->load_error = std::string("cannot load NCCL (libnccl.so.2): ") + (e != nullptr ? e : "unknown error");
      return a;
    }
    a->lib = lib;
    // An optional function missing leaves its pointer null; a required one fails the load.
    auto resolve = [&](auto* fn, const char* name, bool required = true) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
      if (required && *fn == nullptr && a->load_error.empty())
        a->load_error = std::string("libnccl.so.2 lacks ") + name;
    };
    resolve(&a->get_version, "ncclGetVersion");
    resolve(&a->comm_init_all, "ncclCommInitAll");
    resolve(&a->comm_destroy, "ncclCommDestroy");
    resolve(&a->comm_abort, "ncclCommAbort");
    resolve(&a->all_reduce, "ncclAllReduce");
    resolve(&a->group_start, "ncclGroupStart");
    resolve(&a->group_end, "ncclGroupEnd");
    resolve(&a->error_string, "ncclGetErrorString");
    resolve(&a->all_gather, "ncclAllGather");
#ifdef NCCL_WIN_COLL_SYMMETRIC
    resolve(&a->mem_alloc, "ncclMemAlloc", false);
    resolve(&a->mem_free, "ncclMemFree", false);
    resolve(&a->window_register, "ncclCommWindowRegister", false);
    resolve(&a->window_deregister, "ncclCommWindowDeregister", false);
#endif
    return a;
  }();
  return *api;
}

CudaStatus Check(const NcclApi& api, ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return CudaStatus::Ok();
  return CudaStatus::Error(std::string(what) + " failed: " + api.error_string(r));
}

bool ToNccl(DType t, ncclDataType_t* out) {
  switch (t) {
    case DType::kF32:
      *out = ncclFloat32;
      return true;
    case DType::kF16:
      *out = ncclFloat16;
      return true;
    case DType::kBF16:
      *out = ncclBfloat16;
      return true;
    default:
      return false;
  }
}

}  // namespace

bool NcclAvailable(std::string* why_not) {
  const NcclApi& api = LoadApi();
  if (api.load_error.empty()) return true;
  if (why_not != nullptr) *why_not = api.load_error;
  return false;
}

CudaStatus NcclGroup::Create(const std::vector<int>& devices, std::unique_ptr<NcclGroup>* out) {
  const NcclApi& api = LoadApi();
  if (!api.load_error.empty()) return CudaStatus::Error(api.load_error);
  if (devices.empty()) return CudaStatus::Error("an NCCL group needs at least one GPU");
  int count = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDeviceCount(&count)); !s.ok()) return s;
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return CudaStatus::Error("an NCCL group needs distinct GPUs (one is listed twice)");
  if (sorted.front() < 0 || sorted.back() >= count)
    return CudaStatus::Error("an NCCL group of " + std::to_string(devices.size()) + " GPUs needs GPU " +
                             std::to_string(sorted.back()) + ", but " + std::to_string(count) + " are visible");
  std::unique_ptr<NcclGroup> g(new NcclGroup);
  g->api_ = &api;
  g->devices_ = devices;
  int v = 0;
  if (CudaStatus s = Check(api, api.get_version(&v), "ncclGetVersion"); !s.ok()) return s;
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch.
  g->version_code_ = v;
  g->version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  std::vector<ncclComm_t> comms(devices.size());
  if (CudaStatus s = Check(api, api.comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data()),
                           "ncclCommInitAll");
      !s.ok())
    return s;
  g->comms_.assign(comms.begin(), comms.end());
  *out = std::move(g);
  return CudaStatus::Ok();
}

NcclGroup::~NcclGroup() {
#ifdef NCCL_WIN_COLL_SYMMETRIC
  // Windows go before their communicators (an aborted one cannot deregister).
  for (const Window& w : windows_) {
    cudaSetDevice(devices_[w.rank]);
    if (!comms_.empty())
      api_->window_deregister(static_cast<ncclComm_t>(comms_[w.rank]), static_cast<ncclWindow_t>(w.window));
    api_->mem_free(w.ptr);
  }
#endif
  for (void* c : comms_) api_->comm_destroy(static_cast<ncclComm_t>(c));
}

void NcclGroup::Abort() {
  std::vector<void*> comms;
  comms.swap(comms_);
  for (void* c : comms) api_->comm_abort(static_cast<ncclComm_t>(c));
}

CudaStatus NcclGroup::AllReduceSum(int rank, void* data, size_t count, DType dtype, cudaStream_t stream) const {
  if (comms_.empty()) return CudaStatus::Error("NCCL all-reduce: the group was aborted");
  if (rank < 0 || rank >= size()) return CudaStatus::Error("NCCL all-reduce: rank out of range");
  ncclDataType_t t;
  if (!ToNccl(dtype, &t)) return CudaStatus::Error("NCCL all-reduce: only float dtypes are summed");
  return Check(*api_, api_->all_reduce(data, data, count, t, ncclSum, static_cast<ncclComm_t>(comms_[rank]), stream),
               "ncclAllReduce");
}

CudaStatus NcclGroup::AllGather(int rank, const void* send, void* recv, size_t count, DType dtype,
                                cudaStream_t stream) const {
  if (comms_.empty()) return CudaStatus::Error("NCCL all-gather: the group was aborted");
  if (rank < 0 || rank >= size()) return CudaStatus::Error("NCCL all-gather: rank out of range");
  ncclDataType_t t;
  if (!ToNccl(dtype, &t)) return CudaStatus::Error("NCCL all-gather: only float dtypes");
  return Check(*api_, api_->all_gather(send, recv, count, t, static_cast<ncclComm_t>(comms_[rank]), stream),
               "ncclAllGather");
}

void* NcclGroup::Resolve(const char* name) const { return api_->lib == nullptr ? nullptr : dlsym(api_->lib, name); }

CudaStatus NcclGroup::AllocateSymmetric(int rank, size_t bytes, void** ptr, void** window_out) const {
  *ptr = nullptr;
  if (window_out != nullptr) *window_out = nullptr;
  if (comms_.empty()) return CudaStatus::Error("NCCL symmetric memory: the group was aborted");
  if (rank < 0 || rank >= size()) return CudaStatus::Error("NCCL symmetric memory: rank out of range");
#ifndef NCCL_WIN_COLL_SYMMETRIC
  (void)bytes;
  return CudaStatus::Error("this build's nccl.h predates symmetric memory (ncclCommWindowRegister needs 2.27+)");
#else
  if (api_->mem_alloc == nullptr || api_->window_register == nullptr)
    return CudaStatus::Error("NCCL " + version_ + " has no symmetric memory (ncclCommWindowRegister needs 2.27+)");
  if (CudaStatus s = FS_CUDA_CHECK(cudaSetDevice(devices_[rank])); !s.ok()) return s;
  void* p = nullptr;
  if (CudaStatus s = Check(*api_, api_->mem_alloc(&p, bytes), "ncclMemAlloc"); !s.ok()) return s;
  ncclWindow_t window = nullptr;
  if (CudaStatus s = Check(
          *api_,
          api_->window_register(static_cast<ncclComm_t>(comms_[rank]), p, bytes, &window, NCCL_WIN_COLL_SYMMETRIC),
          "ncclCommWindowRegister");
      !s.ok()) {
    api_->mem_free(p);
    return s;
  }
  std::lock_guard<std::mutex> lock(windows_mu_);
  windows_.push_back({rank, p, window});
  *ptr = p;
  if (window_out != nullptr) *window_out = window;
  return CudaStatus::Ok();
#endif
}

CudaStatus NcclGroup::GroupStart() const { return Check(*api_, api_->group_start(), "ncclGroupStart"); }
CudaStatus NcclGroup::GroupEnd() const { return Check(*api_, api_->group_end(), "ncclGroupEnd"); }

#else  // no nccl.h at configure time: every use says so

namespace {
const char kNoNccl[] = "this build has no NCCL (nccl.h was not found when it was configured)";
}

struct NcclApi {};

bool NcclAvailable(std::string* why_not) {
  if (why_not != nullptr) *why_not = kNoNccl;
  return false;
}
CudaStatus NcclGroup::Create(const std::vector<int>&, std::unique_ptr<NcclGroup>*) {
  return CudaStatus::Error(kNoNccl);
}
NcclGroup::~NcclGroup() = default;
CudaStatus NcclGroup::AllReduceSum(int, void*, size_t, DType, cudaStream_t) const { return CudaStatus::Error(kNoNccl); }
CudaStatus NcclGroup::AllGather(int, const void*, void*, size_t, DType, cudaStream_t) const {
  return CudaStatus::Error(kNoNccl);
}
CudaStatus NcclGroup::AllocateSymmetric(int, size_t, void**, void**) const { return CudaStatus::Error(kNoNccl); }
void* NcclGroup::Resolve(const char*) const { return nullptr; }
CudaStatus NcclGroup::GroupStart() const { return CudaStatus::Error(kNoNccl); }
CudaStatus NcclGroup::GroupEnd() const { return CudaStatus::Error(kNoNccl); }
void NcclGroup::Abort() {}

#endif

}  // namespace fusedserve::cuda
