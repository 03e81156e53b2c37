"""CUDA C++ kernels shared by the tests."""

ADD = r'''
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
'''

# C++ (mangled) names, one template for every dtype.
AXPB = r'''
#include <cuda_fp16.h>
#include <cuda_bf16.h>
namespace ops {
template <typename T>
__global__ void axpb(const T* x, T* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = T(float(x[i]) * 2.0f + 1.0f);
}
}
'''

SUM = r'''
extern "C" __global__ void block_sum(const float* x, float* out, int n) {
  __shared__ float partial[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  partial[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
'''

SUM_AND_PRODUCT = r'''
extern "C" __global__ void sum_and_product(const float* a, const float* b, float* sum, float* product, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { sum[i] = a[i] + b[i]; product[i] = a[i] * b[i]; }
}
'''

INCREMENT = r'''
extern "C" __global__ void increment(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
}
'''

# Reverses each block's slice through dynamic shared memory (over 48 KiB when asked).
BIG_SMEM = r'''
extern "C" __global__ void reverse_in_smem(const float* in, float* out, int per_block) {
  extern __shared__ float tile[];
  const float* src = in + blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) tile[i] = src[i];
  __syncthreads();
  for (int i = threadIdx.x; i < per_block; i += blockDim.x)
    out[blockIdx.x * per_block + i] = tile[per_block - 1 - i];
}
'''

# Row softmax over the last dimension, one 256-thread block per row, and its
# derivative: dx = y * (dy - sum(y * dy)), which is both the JVP (tangent dy)
# and the VJP (cotangent dy), the softmax Jacobian being symmetric.
# A block of THREADS threads reduced to one value: the softmaxes' of every dtype.
BLOCK_REDUCE = r'''// The sum (or max) over the block; every thread gets it. smem is free again on return.
__device__ float block_reduce(float v, float* smem, bool take_max) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      float other = smem[threadIdx.x + s];
      smem[threadIdx.x] = take_max ? fmaxf(smem[threadIdx.x], other) : smem[threadIdx.x] + other;
    }
    __syncthreads();
  }
  float result = smem[0];
  __syncthreads();
  return result;
}

'''

SOFTMAX = r'''
#define THREADS 256

''' + BLOCK_REDUCE + r'''extern "C" __global__ void softmax_fwd(const float* x, float* y, int cols) {
  __shared__ float smem[THREADS];
  const float* xr = x + (long long)blockIdx.x * cols;
  float* yr = y + (long long)blockIdx.x * cols;
  float m = __int_as_float(0xff800000);  // -inf
  for (int j = threadIdx.x; j < cols; j += THREADS) m = fmaxf(m, xr[j]);
  m = block_reduce(m, smem, true);
  float s = 0.0f;
  for (int j = threadIdx.x; j < cols; j += THREADS) s += expf(xr[j] - m);
  float inv = 1.0f / block_reduce(s, smem, false);
  for (int j = threadIdx.x; j < cols; j += THREADS) yr[j] = expf(xr[j] - m) * inv;
}

extern "C" __global__ void softmax_bwd(const float* y, const float* dy, float* dx, int cols) {
  __shared__ float smem[THREADS];
  const long long row = (long long)blockIdx.x * cols;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < cols; j += THREADS) dot += y[row + j] * dy[row + j];
  dot = block_reduce(dot, smem, false);
  for (int j = threadIdx.x; j < cols; j += THREADS) dx[row + j] = y[row + j] * (dy[row + j] - dot);
}
'''

# y = a * x + b over a 2-D float32 array, one 32 x 32 tile a block: TMA load
# (zeros past the edges), the update in shared memory, TMA store (clipped at
# the edges). Both maps use the 128-byte swizzle: 32 floats are 128 bytes.
TMA_AFFINE = r'''
#include <jax_mosaic_ffi/tma.cuh>
extern "C" __global__ void tma_affine(const __grid_constant__ jmf::TensorMap in_map,
                                      const __grid_constant__ jmf::TensorMap out_map, float a, float b) {
  __shared__ alignas(1024) float tile[32 * 32];
  __shared__ alignas(8) unsigned long long bar;
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  if (threadIdx.x == 0) {
    jmf::mbarrier_init(&bar, 1);
    jmf::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    jmf::mbarrier_arrive_expect_tx(&bar, sizeof(tile));
    jmf::tma_load_2d(tile, &in_map, c0, r0, &bar);
  }
  jmf::mbarrier_wait(&bar, 0);
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) tile[i] = a * tile[i] + b;
  jmf::fence_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    jmf::tma_store_2d(&out_map, c0, r0, tile);
    jmf::tma_store_commit_and_wait();
  }
}
'''
