// C = A @ B in fp32, row-major, any M, N, K: shared-memory tiles of BM x BK
// and BK x BN, each thread accumulating a TM x TN block of C in registers.
// The tile sizes are -D options, so that jmf.autotune can pick them.
#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef BK
#define BK 16
#endif
#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 4
#endif

extern "C" __global__ void tiled_matmul(const float* A, const float* B, float* C, int M, int N, int K) {
  constexpr int kRowThreads = BM / TM, kColThreads = BN / TN, kThreads = kRowThreads * kColThreads;
  __shared__ float As[BK][BM + 1];  // A's tile, transposed
  __shared__ float Bs[BK][BN];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kColThreads + tx;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  float acc[TM][TN] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += kThreads) {
      int r = i / BK, c = i % BK, gr = row0 + r, gc = k0 + c;
      As[c][r] = (gr < M && gc < K) ? A[(size_t)gr * K + gc] : 0.f;
    }
    for (int i = tid; i < BK * BN; i += kThreads) {
      int r = i / BN, c = i % BN, gr = k0 + r, gc = col0 + c;
      Bs[r][c] = (gr < K && gc < N) ? B[(size_t)gr * N + gc] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[k][ty + i * kRowThreads];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx + j * kColThreads];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    int r = row0 + ty + i * kRowThreads;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      int c = col0 + tx + j * kColThreads;
      if (r < M && c < N) C[(size_t)r * N + c] = acc[i][j];
    }
  }
}
