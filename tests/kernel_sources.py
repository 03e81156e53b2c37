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
