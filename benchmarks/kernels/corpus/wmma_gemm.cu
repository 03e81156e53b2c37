// Tensor-core GEMM with a bias: C = A @ B + bias, A and B fp16, C and the
// accumulation fp32, through the WMMA API. Each warp computes one 16x16 tile
// of C; a block of four warps a 32x32 tile.
//
// Mirrors: the WMMA GEMM of the CUDA samples and of fused "GEMM + bias"
// layers in inference code (nvcuda::wmma fragments, row-major A and B,
// load/mma/store_matrix_sync over K in steps of 16, the bias added by the
// warp after the store).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <mma.h>
#include <cuda_fp16.h>
#include <assert.h>

using namespace nvcuda;

constexpr int WMMA_M = 16, WMMA_N = 16, WMMA_K = 16;
constexpr int WARPS_M = 2, WARPS_N = 2;  // warps per block along M and N

extern "C" __global__ void __launch_bounds__(32 * WARPS_M * WARPS_N)
wmma_gemm_bias(const half* __restrict__ a, const half* __restrict__ b, const float* __restrict__ bias,
               float* __restrict__ c, int M, int N, int K) {
  assert(M % (WMMA_M * WARPS_M) == 0 && N % (WMMA_N * WARPS_N) == 0 && K % WMMA_K == 0);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.y * WARPS_M + warp / WARPS_N) * WMMA_M;
  const int col0 = (blockIdx.x * WARPS_N + warp % WARPS_N) * WMMA_N;

  wmma::fragment<wmma::matrix_a, WMMA_M, WMMA_N, WMMA_K, half, wmma::row_major> a_frag;
  wmma::fragment<wmma::matrix_b, WMMA_M, WMMA_N, WMMA_K, half, wmma::row_major> b_frag;
  wmma::fragment<wmma::accumulator, WMMA_M, WMMA_N, WMMA_K, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int k = 0; k < K; k += WMMA_K) {
    wmma::load_matrix_sync(a_frag, a + (size_t)row0 * K + k, K);
    wmma::load_matrix_sync(b_frag, b + (size_t)k * N + col0, N);
    wmma::mma_sync(acc, a_frag, b_frag, acc);
  }
  float* tile = c + (size_t)row0 * N + col0;
  wmma::store_matrix_sync(tile, acc, N, wmma::mem_row_major);
  __syncwarp();  // the stores of every lane are visible to the whole warp
  for (int e = lane; e < WMMA_M * WMMA_N; e += 32) {
    const int r = e / WMMA_N, col = e % WMMA_N;
    tile[(size_t)r * N + col] += bias[col0 + col];
  }
}
