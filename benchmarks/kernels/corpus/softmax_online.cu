// Row softmax in one pass over the input for max and sum (the "online"
// softmax), one warp per row, lanes combined with warp shuffles.
//
// Mirrors: online-softmax kernels as in llm.c and the Triton fused-softmax
// tutorial ported to CUDA: -INFINITY as the running maximum's start, a
// running sum rescaled whenever the maximum grows, __shfl_xor_sync
// butterflies. Written as nvcc code often is, with no includes at all:
// INFINITY, expf and `uint` come with nvcc's implicit cuda_runtime.h.
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.

// (m_a, s_a) and (m_b, s_b) are running (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void combine(float& m_a, float& s_a, float m_b, float s_b) {
  const float m = fmaxf(m_a, m_b);
  if (m == -INFINITY) return;  // both empty
  s_a = s_a * expf(m_a - m) + s_b * expf(m_b - m);
  m_a = m;
}

extern "C" __global__ void softmax_forward_online(float* __restrict__ out, const float* __restrict__ inp,
                                                  int N, int C) {
  const uint lane = threadIdx.x % 32;
  const uint warp = threadIdx.x / 32;
  const uint warps_per_block = blockDim.x / 32;
  const int row = blockIdx.x * warps_per_block + warp;
  if (row >= N) return;  // the whole warp: the shuffles below need all 32 lanes
  const float* x = inp + (size_t)row * C;

  float maxval = -INFINITY;
  float sumval = 0.0f;
  for (int i = lane; i < C; i += 32) combine(maxval, sumval, x[i], 1.0f);
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_max = __shfl_xor_sync(0xffffffff, maxval, offset);
    const float other_sum = __shfl_xor_sync(0xffffffff, sumval, offset);
    combine(maxval, sumval, other_max, other_sum);
  }

  const float inv_sum = 1.0f / sumval;
  float* y = out + (size_t)row * C;
  for (int i = lane; i < C; i += 32) y[i] = expf(x[i] - maxval) * inv_sum;
}
