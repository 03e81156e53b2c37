// A realistic kernel for the compile benchmarks: layer norm, then a tiled
// GEMM with a bias + GELU epilogue, in bf16 with float accumulation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mlp {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <int kThreads>
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / kWarp ? scratch[lane] : 0.0f;
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  float result = scratch[0];
  __syncthreads();
  return result;
}

// One block per row: y = (x - mean) / sqrt(var + eps) * gamma + beta.
template <int kThreads>
__global__ void layer_norm(const __nv_bfloat16* x, const float* gamma, const float* beta,
                           __nv_bfloat16* y, int cols, float eps) {
  __shared__ float scratch[kWarp];
  const __nv_bfloat16* row = x + static_cast<long long>(blockIdx.x) * cols;
  __nv_bfloat16* out = y + static_cast<long long>(blockIdx.x) * cols;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < cols; c += kThreads) sum += __bfloat162float(row[c]);
  const float mean = block_sum<kThreads>(sum, scratch) / cols;
  float squares = 0.0f;
  for (int c = threadIdx.x; c < cols; c += kThreads) {
    const float d = __bfloat162float(row[c]) - mean;
    squares += d * d;
  }
  const float inv_std = rsqrtf(block_sum<kThreads>(squares, scratch) / cols + eps);
  for (int c = threadIdx.x; c < cols; c += kThreads) {
    const float v = (__bfloat162float(row[c]) - mean) * inv_std;
    out[c] = __float2bfloat16(v * gamma[c] + beta[c]);
  }
}

__device__ __forceinline__ float gelu(float v) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

template <int kTileM, int kTileN, int kTileK, int kThreadM, int kThreadN>
struct GemmConfig {
  static constexpr int kThreads = (kTileM / kThreadM) * (kTileN / kThreadN);
  static constexpr int kTileM_ = kTileM, kTileN_ = kTileN, kTileK_ = kTileK;
  static constexpr int kThreadM_ = kThreadM, kThreadN_ = kThreadN;
};

// C[m, n] = gelu(sum_k A[m, k] * B[k, n] + bias[n]); row-major, any sizes.
template <typename Config>
__global__ void gemm_bias_gelu(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* bias,
                               __nv_bfloat16* c, int m, int n, int k) {
  constexpr int TM = Config::kTileM_, TN = Config::kTileN_, TK = Config::kTileK_;
  constexpr int RM = Config::kThreadM_, RN = Config::kThreadN_;
  __shared__ float a_tile[TK][TM + 1];
  __shared__ float b_tile[TK][TN + 1];
  const int threads_n = TN / RN;
  const int tx = threadIdx.x % threads_n;
  const int ty = threadIdx.x / threads_n;
  const int row0 = blockIdx.y * TM;
  const int col0 = blockIdx.x * TN;
  float acc[RM][RN];
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int j = 0; j < RN; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < k; k0 += TK) {
    for (int idx = threadIdx.x; idx < TM * TK; idx += Config::kThreads) {
      const int r = idx / TK, kk = idx % TK;
      const int gr = row0 + r, gk = k0 + kk;
      a_tile[kk][r] = (gr < m && gk < k) ? __bfloat162float(a[static_cast<long long>(gr) * k + gk]) : 0.0f;
    }
    for (int idx = threadIdx.x; idx < TK * TN; idx += Config::kThreads) {
      const int kk = idx / TN, cc = idx % TN;
      const int gk = k0 + kk, gc = col0 + cc;
      b_tile[kk][cc] = (gk < k && gc < n) ? __bfloat162float(b[static_cast<long long>(gk) * n + gc]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TK; ++kk) {
      float a_frag[RM], b_frag[RN];
#pragma unroll
      for (int i = 0; i < RM; ++i) a_frag[i] = a_tile[kk][ty * RM + i];
#pragma unroll
      for (int j = 0; j < RN; ++j) b_frag[j] = b_tile[kk][tx * RN + j];
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) acc[i][j] = fmaf(a_frag[i], b_frag[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int gr = row0 + ty * RM + i;
    if (gr >= m) continue;
#pragma unroll
    for (int j = 0; j < RN; ++j) {
      const int gc = col0 + tx * RN + j;
      if (gc < n) c[static_cast<long long>(gr) * n + gc] = __float2bfloat16(gelu(acc[i][j] + bias[gc]));
    }
  }
}

using DefaultGemm = GemmConfig<64, 64, 16, 4, 4>;

}  // namespace mlp

extern "C" __global__ void __launch_bounds__(256) fused_mlp_layer_norm(
    const __nv_bfloat16* x, const float* gamma, const float* beta, __nv_bfloat16* y, int cols, float eps) {
  mlp::layer_norm<256>(x, gamma, beta, y, cols, eps);
}

extern "C" __global__ void __launch_bounds__(mlp::DefaultGemm::kThreads) fused_mlp_gemm(
    const __nv_bfloat16* a, const __nv_bfloat16* b, const float* bias, __nv_bfloat16* c, int m, int n, int k) {
  mlp::gemm_bias_gelu<mlp::DefaultGemm>(a, b, bias, c, m, n, k);
}
