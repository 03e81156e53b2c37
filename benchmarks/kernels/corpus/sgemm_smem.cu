// FP32 GEMM, C = alpha * A @ B, all row-major, with 128x128 block tiles and a
// 64-deep K slice held in dynamic shared memory: 64 KiB per block, over the
// 48 KiB a kernel gets without opting in.
//
// Mirrors: the hand-tiled SGEMM kernels of GEMM tutorials and CUTLASS-style
// examples: compile-time tile sizes as template parameters, an 8x8 register
// tile per thread, float4 global loads, `extern __shared__` storage carved
// into the A and B tiles, __launch_bounds__, asserts on the shape.
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <cassert>

template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
sgemm_smem(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
           int M, int N, int K, float alpha) {
  constexpr int THREADS = (BM / TM) * (BN / TN);
  constexpr int COLS = BN / TN;  // threads along a tile row
  static_assert(BK % 4 == 0 && BN % 4 == 0, "float4 loads");
  static_assert((BM * BK / 4) % THREADS == 0 && (BK * BN / 4) % THREADS == 0, "even loads");
  assert(M % BM == 0 && N % BN == 0 && K % BK == 0);
  assert(blockDim.x == THREADS);

  extern __shared__ __align__(16) float smem[];  // float4 stores below
  float* As = smem;            // [BM][BK]
  float* Bs = smem + BM * BK;  // [BK][BN]

  const int row0 = blockIdx.y * BM;
  const int col0 = blockIdx.x * BN;
  // thread (ty, tx) owns rows ty*TM + i and columns tx + j*COLS of the tile:
  // the strided columns keep the Bs reads of a warp on distinct banks
  const int ty = threadIdx.x / COLS;
  const int tx = threadIdx.x % COLS;

  float acc[TM][TN] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int f = threadIdx.x; f < BM * BK / 4; f += THREADS) {
      const int r = f / (BK / 4), c = (f % (BK / 4)) * 4;
      *reinterpret_cast<float4*>(&As[r * BK + c]) =
          *reinterpret_cast<const float4*>(&A[(size_t)(row0 + r) * K + k0 + c]);
    }
    for (int f = threadIdx.x; f < BK * BN / 4; f += THREADS) {
      const int r = f / (BN / 4), c = (f % (BN / 4)) * 4;
      *reinterpret_cast<float4*>(&Bs[r * BN + c]) =
          *reinterpret_cast<const float4*>(&B[(size_t)(k0 + r) * N + col0 + c]);
    }
    __syncthreads();
#pragma unroll 4
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[(ty * TM + i) * BK + k];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[k * BN + tx + j * COLS];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();  // before the next slice overwrites the tiles
  }
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j)
      C[(size_t)(row0 + ty * TM + i) * N + col0 + tx + j * COLS] = alpha * acc[i][j];
}
