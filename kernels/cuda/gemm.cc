// cuBLASLt GEMM with cached plans (see gemm.h). Row-major y = x . w^T is run
// as the column-major product y^T[N,M] = w[K,N]^T . x[K,M]: A = w with
// CUBLAS_OP_T, B = x with CUBLAS_OP_N, D = y^T with leading dimension N, so
// the bias (one value per row of D) is the per-output-column bias of y.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/gemv.h"

namespace fusedserve::cuda {
namespace {

// Hopper cuBLASLt kernels use up to 32 MiB of workspace (NVIDIA's
// recommendation for sm_90); allocated once per device.
constexpr size_t kWorkspaceBytes = 32u << 20;

CudaStatus CheckLt(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return CudaStatus::Ok();
  return CudaStatus::Error(std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")");
}
#define FS_LT_CHECK(expr) CheckLt((expr), #expr, __FILE__, __LINE__)

cudaDataType_t LtType(DType t) {
  switch (t) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

// The cuBLASLt epilogue for (act, has_bias); SiLU and erf-GELU get the bias
// epilogue (or none) and a separate elementwise pass.
cublasLtEpilogue_t LtEpilogue(Activation act, bool has_bias) {
  if (act == Activation::kGeluTanh) return has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  return has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// Everything cuBLASLt needs for one problem, built once.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  std::string error;  // non-empty when the plan could not be built
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

using PlanKey = std::tuple<int, int, int64_t, int64_t, int64_t, int>;  // device, dtype, M, N, K, epilogue

class LtContext {
 public:
  static LtContext& Get() {
    static LtContext* ctx = new LtContext();  // never destroyed: outlives static teardown
    return *ctx;
  }

  // Handle and workspace of the current device.
  CudaStatus Device(int device, cublasLtHandle_t* handle, void** workspace) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = devices_.find(device);
    if (it == devices_.end()) {
      PerDevice pd;
      if (CudaStatus s = FS_LT_CHECK(cublasLtCreate(&pd.handle)); !s.ok()) return s;
      if (CudaStatus s = FS_CUDA_CHECK(cudaMalloc(&pd.workspace, kWorkspaceBytes)); !s.ok()) {
        cublasLtDestroy(pd.handle);
        return s;
      }
      it = devices_.emplace(device, pd).first;
    }
    *handle = it->second.handle;
    *workspace = it->second.workspace;
    return CudaStatus::Ok();
  }

  // The cached plan (built on first use); plans live as long as the process.
  const Plan* GetPlan(cublasLtHandle_t handle, int device, DType dtype, int64_t M, int64_t N, int64_t K,
                      cublasLtEpilogue_t epi) {
    const PlanKey key{device, static_cast<int>(dtype), M, N, K, static_cast<int>(epi)};
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.get();
    auto plan = std::make_unique<Plan>();
    plan->error = Build(handle, dtype, M, N, K, epi, plan.get()).message;
    return plans_.emplace(key, std::move(plan)).first->second.get();
  }

 private:
  struct PerDevice {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
  };

  static CudaStatus Build(cublasLtHandle_t handle, DType dtype, int64_t M, int64_t N, int64_t K, cublasLtEpilogue_t epi,
                          Plan* p) {
    const cudaDataType_t t = LtType(dtype);
    if (CudaStatus s = FS_LT_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)); !s.ok())
      return s;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    if (CudaStatus s =
            FS_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
        !s.ok())
      return s;
    if (CudaStatus s =
            FS_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
        !s.ok())
      return s;
    if (CudaStatus s =
            FS_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        !s.ok())
      return s;
    // A = w stored column-major [K,N] (ld K), B = x column-major [K,M] (ld K),
    // D = y^T column-major [N,M] (ld N).
    if (CudaStatus s = FS_LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, t, K, N, K)); !s.ok()) return s;
    if (CudaStatus s = FS_LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, t, K, M, K)); !s.ok()) return s;
    if (CudaStatus s = FS_LT_CHECK(cublasLtMatrixLayoutCreate(&p->d, t, N, M, N)); !s.ok()) return s;

    cublasLtMatmulPreference_t pref = nullptr;
    if (CudaStatus s = FS_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref)); !s.ok()) return s;
    size_t ws = kWorkspaceBytes;
    CudaStatus s = FS_LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    int found = 0;
    p->algos.resize(kMaxGemmAlgos);
    if (s.ok()) {
      s = FS_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->d, p->d, pref, kMaxGemmAlgos,
                                                     p->algos.data(), &found));
    }
    cublasLtMatmulPreferenceDestroy(pref);
    p->algos.resize(s.ok() ? found : 0);
    if (!s.ok()) return s;
    if (found == 0) {
      return CudaStatus::Error("cuBLASLt offers no algorithm for " + std::string(DTypeName(dtype)) +
                               " GEMM M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                               " (row strides must suit its alignment rules)");
    }
    return CudaStatus::Ok();
  }

  std::mutex mu_;
  std::map<int, PerDevice> devices_;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace

int GemmAlgoCount(DType dtype, int64_t M, int64_t N, int64_t K) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cublasLtHandle_t handle;
  void* ws;
  if (!LtContext::Get().Device(device, &handle, &ws).ok()) return 0;
  const Plan* plan = LtContext::Get().GetPlan(handle, device, dtype, M, N, K, CUBLASLT_EPILOGUE_DEFAULT);
  return static_cast<int>(plan->algos.size());
}

CudaStatus GemmForward(const GemmParams& g, int algo_index, cudaStream_t stream) {
  if (g.M == 0 || g.N == 0) return CudaStatus::Ok();
  if (g.K == 0) {
    // cuBLASLt rejects K = 0; y = act(bias) (or act(0)).
    return LaunchBiasActivation(g.dtype, g.M, g.N, g.bias, g.act, g.y, stream);
  }
  int device = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDevice(&device)); !s.ok()) return s;
  cublasLtHandle_t handle;
  void* workspace;
  if (CudaStatus s = LtContext::Get().Device(device, &handle, &workspace); !s.ok()) return s;
  const cublasLtEpilogue_t epi = LtEpilogue(g.act, g.bias != nullptr);
  const Plan* plan = LtContext::Get().GetPlan(handle, device, g.dtype, g.M, g.N, g.K, epi);
  if (!plan->error.empty()) return CudaStatus::Error(plan->error);
  if (g.bias != nullptr) {
    // The descriptor is shared by every call of this shape; the pointer is
    // per call. Setting it is a host-side store, and calls on one device are
    // serialized by the backend's lock.
    if (CudaStatus s = FS_LT_CHECK(
            cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
        !s.ok())
      return s;
  }
  if (g.residual != nullptr && g.act != Activation::kNone) {
    // cuBLASLt would apply the activation after adding C.
    return CudaStatus::Error("GemmForward: a residual with an activation is not supported");
  }
  const int n = static_cast<int>(plan->algos.size());
  const int idx = algo_index < 0 ? 0 : (algo_index >= n ? n - 1 : algo_index);
  const float alpha = 1.0f, beta = g.residual != nullptr ? 1.0f : 0.0f;
  const void* c = g.residual != nullptr ? g.residual : g.y;
  if (CudaStatus s =
          FS_LT_CHECK(cublasLtMatmul(handle, plan->desc, &alpha, g.w, plan->a, g.x, plan->b, &beta, c, plan->d, g.y,
                                     plan->d, &plan->algos[idx].algo, workspace, kWorkspaceBytes, stream));
      !s.ok())
    return s;
  if (g.act == Activation::kSilu || g.act == Activation::kGeluErf) {
    return LaunchActivationInPlace(g.dtype, g.M * g.N, g.act, g.y, stream);
  }
  return CudaStatus::Ok();
}

}  // namespace fusedserve::cuda
