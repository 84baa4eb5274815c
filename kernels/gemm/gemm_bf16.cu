#include "kernels/gemm/gemm_bf16.h"

#include <cublasLt.h>

#include <algorithm>
#include <string>

namespace mx::cuda {

void gemm_throw(const std::string& what);  // defined in gemm_bf16_host.cpp (mx::Error lives in C++20 land)

namespace {
#define MX_LT(call)                                                                     \
  do {                                                                                  \
    cublasStatus_t st_ = (call);                                                        \
    if (st_ != CUBLAS_STATUS_SUCCESS) gemm_throw(std::string(#call) + " -> " + std::to_string(int(st_))); \
  } while (0)

struct Plan {
  int M = 0, N = 0, K = 0, ldy = 0;
  bool f32 = false, acc = false, bias = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
constexpr int kMaxPlans = 64;

__global__ void add_bias_f32(float* y, const uint16_t* bias, int N, long long total) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < total) y[i] += __uint_as_float(unsigned(bias[i % N]) << 16);
}
}  // namespace

struct GemmContext {
  cublasLtHandle_t lt = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  Plan plans[kMaxPlans];
  int n_plans = 0;
};

GemmContext* gemm_context_create(size_t workspace_bytes) {
  auto* c = new GemmContext();
  MX_LT(cublasLtCreate(&c->lt));
  if (cudaMalloc(&c->ws, workspace_bytes) != cudaSuccess) gemm_throw("cudaMalloc of GEMM workspace failed");
  c->ws_bytes = workspace_bytes;
  return c;
}

void gemm_context_destroy(GemmContext* c) {
  if (!c) return;
  for (int i = 0; i < std::min(c->n_plans, kMaxPlans); ++i) {
    Plan& p = c->plans[i];
    cublasLtMatmulDescDestroy(p.desc);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
  }
  cudaFree(c->ws);
  cublasLtDestroy(c->lt);
  delete c;
}

static Plan& get_plan(GemmContext* c, const GemmBf16Params& q) {
  const bool has_bias = q.bias != nullptr;
  const int ldy = q.ldy ? q.ldy : q.N;
  for (int i = 0; i < std::min(c->n_plans, kMaxPlans); ++i) {
    Plan& p = c->plans[i];
    if (p.M == q.M && p.N == q.N && p.K == q.K && p.ldy == ldy && p.f32 == q.y_f32 && p.acc == q.accumulate && p.bias == has_bias)
      return p;
  }
  // Serving sees many token counts: when the cache is full, replace the oldest plan (round robin).
  Plan& p = c->plans[c->n_plans % kMaxPlans];
  if (c->n_plans >= kMaxPlans) {
    cublasLtMatmulDescDestroy(p.desc);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
  }
  p = Plan{};
  p.M = q.M; p.N = q.N; p.K = q.K; p.ldy = ldy; p.f32 = q.y_f32; p.acc = q.accumulate; p.bias = has_bias;
  // Column-major view: C[N, M] = W^T(op T of [K, N]) * X([K, M]).
  MX_LT(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MX_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MX_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (has_bias && !q.y_f32) {  // fp32 output takes the bias in add_bias_f32 (no bf16-bias fp32-D algos)
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MX_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    cudaDataType_t bt = CUDA_R_16BF;
    MX_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  const cudaDataType_t ct = q.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
  MX_LT(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, q.K, q.N, q.K));
  MX_LT(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, q.K, q.M, q.K));
  MX_LT(cublasLtMatrixLayoutCreate(&p.c, ct, q.N, q.M, ldy));
  cublasLtMatmulPreference_t pref;
  MX_LT(cublasLtMatmulPreferenceCreate(&pref));
  MX_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->ws_bytes,
                                             sizeof(c->ws_bytes)));
  cublasLtMatmulHeuristicResult_t res{};
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || n == 0)
    gemm_throw("cuBLASLt has no algorithm for GEMM M=" + std::to_string(q.M) + " N=" + std::to_string(q.N) +
               " K=" + std::to_string(q.K));
  p.algo = res.algo;
  ++c->n_plans;
  return p;
}

void gemm_bf16(GemmContext* c, const GemmBf16Params& q, cudaStream_t s) {
  if (q.M <= 0) return;
  if (q.K % 8 || q.N % 8) gemm_throw("gemm_bf16: K and N must be multiples of 8");
  if (q.ldy && (q.ldy < q.N || (q.bias && q.ldy != q.N))) gemm_throw("gemm_bf16: ldy must be >= N, and N with a bias");
  Plan& p = get_plan(c, q);
  if (q.bias && !q.y_f32)
    MX_LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &q.bias, sizeof(q.bias)));
  const float alpha = 1.0f, beta = q.accumulate ? 1.0f : 0.0f;
  MX_LT(cublasLtMatmul(c->lt, p.desc, &alpha, q.w, p.a, q.x, p.b, &beta, q.y, p.c, q.y, p.c, &p.algo, c->ws,
                       c->ws_bytes, s));
  if (q.bias && q.y_f32) {
    const long long total = (long long)q.M * q.N;
    add_bias_f32<<<int((total + 255) / 256), 256, 0, s>>>(static_cast<float*>(q.y), q.bias, q.N, total);
  }
}

}  // namespace mx::cuda
