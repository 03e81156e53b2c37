// Dynamic per-row (per-token) FP8 quantization of bf16 activations: each row
// gets scale = max|x| / 448 (the E4M3 maximum) and is stored as
// fp8_e4m3(x / scale), with the scales written alongside.
//
// Mirrors: the dynamic FP8 quantization kernels of LLM inference engines
// (vLLM, TensorRT-LLM, Transformer Engine style): one block per token, an
// absolute-max reduction with cooperative groups and shared memory, a floor
// on the scale, multiplication by the reciprocal, saturating conversion to
// __nv_fp8_e4m3; std::max and std::numeric_limits from the C++ library, as
// code built with --expt-relaxed-constexpr uses them.
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <algorithm>
#include <limits>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

namespace cg = cooperative_groups;

constexpr float FP8_E4M3_MAX = 448.0f;

template <int BLOCK_THREADS>
__global__ void __launch_bounds__(BLOCK_THREADS)
quantize_fp8_per_row(__nv_fp8_e4m3* __restrict__ out, float* __restrict__ scales,
                     const __nv_bfloat16* __restrict__ in, int cols) {
  static_assert(BLOCK_THREADS % 32 == 0 && BLOCK_THREADS <= 1024, "whole warps");
  __shared__ float warp_max[BLOCK_THREADS / 32];
  __shared__ float row_scale;
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);

  const __nv_bfloat16* x = in + (size_t)blockIdx.x * cols;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < cols; i += BLOCK_THREADS) amax = std::max(amax, fabsf(__bfloat162float(x[i])));
  amax = cg::reduce(warp, amax, cg::greater<float>());
  if (warp.thread_rank() == 0) warp_max[warp.meta_group_rank()] = amax;
  block.sync();
  if (threadIdx.x == 0) {
    float m = -std::numeric_limits<float>::infinity();
    for (int w = 0; w < BLOCK_THREADS / 32; ++w) m = std::max(m, warp_max[w]);
    // a floor on the scale, so that an all-zero row does not divide by zero
    const float scale = std::max(m / FP8_E4M3_MAX, 1.0f / (FP8_E4M3_MAX * 512.0f));
    row_scale = scale;
    scales[blockIdx.x] = scale;
  }
  block.sync();

  const float inv_scale = 1.0f / row_scale;
  __nv_fp8_e4m3* y = out + (size_t)blockIdx.x * cols;
  for (int i = threadIdx.x; i < cols; i += BLOCK_THREADS)
    y[i] = __nv_fp8_e4m3(__bfloat162float(x[i]) * inv_scale);  // round to nearest, saturating
}
