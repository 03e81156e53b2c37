// RMSNorm on fp16, y = x / sqrt(mean(x^2) + eps) * weight, one block per
// row, two elements per thread step through __half2, statistics in fp32.
//
// Mirrors: FasterTransformer/Apex-style normalization kernels (FINAL_MASK,
// templated warp and block reduce helpers built on __shfl_xor_sync, __half2
// loads through __ldg, rsqrtf, __launch_bounds__).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <cuda_fp16.h>
#include <assert.h>

#define FINAL_MASK 0xffffffff

template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(FINAL_MASK, value, offset);
  return value;
}

// The sum over the block, returned to every thread. blockDim.x is a multiple of 32.
template <typename T>
__device__ T block_reduce_sum(T value) {
  __shared__ T warp_sums[32];
  __shared__ T total;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  value = warp_reduce_sum(value);
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    T sum = lane < (int)(blockDim.x / 32) ? warp_sums[lane] : T(0);
    sum = warp_reduce_sum(sum);
    if (lane == 0) total = sum;
  }
  __syncthreads();
  return total;
}

extern "C" __global__ void __launch_bounds__(1024)
rmsnorm_half2(__half* __restrict__ out, const __half* __restrict__ in, const __half* __restrict__ weight,
              float eps, int hidden) {
  assert(hidden % 2 == 0 && blockDim.x % 32 == 0);
  const int pairs = hidden / 2;
  const __half2* x = reinterpret_cast<const __half2*>(in + (size_t)blockIdx.x * hidden);
  const __half2* w = reinterpret_cast<const __half2*>(weight);
  __half2* y = reinterpret_cast<__half2*>(out + (size_t)blockIdx.x * hidden);

  float sumsq = 0.0f;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const float2 v = __half22float2(__ldg(&x[i]));
    sumsq += v.x * v.x + v.y * v.y;
  }
  const float inv_rms = rsqrtf(block_reduce_sum(sumsq) / hidden + eps);
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const float2 v = __half22float2(__ldg(&x[i]));
    const float2 g = __half22float2(__ldg(&w[i]));
    y[i] = __floats2half2_rn(v.x * inv_rms * g.x, v.y * inv_rms * g.y);
  }
}
