// GELU forward (tanh approximation) on bf16, eight elements per thread through
// packed 16-byte loads of __nv_bfloat162 pairs.
//
// Mirrors: the elementwise kernels of llm.c-style training code (a
// GELU_SCALING_FACTOR built from M_PI, packed 128-bit loads, out-first
// signature, __launch_bounds__, __restrict__, __ldg, assert).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <assert.h>
#include <math.h>
#include <cuda_bf16.h>

#define GELU_SCALING_FACTOR sqrtf(2.0f / M_PI)

__device__ __forceinline__ float gelu_tanh(float x) {
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
}

extern "C" __global__ void __launch_bounds__(256)
gelu_forward_bf16(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ inp, int N) {
  assert(N >= 0);
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i >= N) return;
  if (i + 8 <= N) {
    // 8 bf16 = 16 bytes = one int4; the buffers are at least 16-byte aligned.
    int4 packed = __ldg(reinterpret_cast<const int4*>(inp + i));
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 x = __bfloat1622float2(pairs[k]);
      pairs[k] = __floats2bfloat162_rn(gelu_tanh(x.x), gelu_tanh(x.y));
    }
    *reinterpret_cast<int4*>(out + i) = packed;
  } else {
    // the ragged end: fewer than 8 elements left
    for (int k = i; k < N; ++k) out[k] = __float2bfloat16(gelu_tanh(__bfloat162float(inp[k])));
  }
}
