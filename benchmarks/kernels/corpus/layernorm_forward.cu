// LayerNorm forward with three outputs (normalized out, mean, rstd), one warp
// per row, reductions with cooperative groups.
//
// Mirrors: llm.c-style layernorm_forward kernels (one warp per row,
// cg::reduce over a thread_block_tile<32>, streaming __ldcs/__stcs, outputs
// first in the signature, mean and rstd saved for the backward pass).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <assert.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

namespace cg = cooperative_groups;

extern "C" __global__ void layernorm_forward(float* __restrict__ out, float* __restrict__ mean,
                                             float* __restrict__ rstd, const float* __restrict__ inp,
                                             const float* __restrict__ weight,
                                             const float* __restrict__ bias, int N, int C) {
  assert(blockDim.x % 32 == 0);
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  // one row per warp; a whole warp leaves together, so the reductions below
  // always see all 32 lanes
  const int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
  if (row >= N) return;
  const float* x = inp + (size_t)row * C;

  float sum = 0.0f;
  for (int c = warp.thread_rank(); c < C; c += warp.size()) sum += x[c];
  sum = cg::reduce(warp, sum, cg::plus<float>());
  const float m = sum / C;

  // two passes over the row (it is in L1/L2 by now): better than E[x^2]-m^2
  float sq = 0.0f;
  for (int c = warp.thread_rank(); c < C; c += warp.size()) {
    float d = x[c] - m;
    sq += d * d;
  }
  sq = cg::reduce(warp, sq, cg::plus<float>());
  const float s = rsqrtf(sq / C + 1e-5f);

  if (warp.thread_rank() == 0) {
    __stcs(mean + row, m);
    __stcs(rstd + row, s);
  }
  float* o = out + (size_t)row * C;
  for (int c = warp.thread_rank(); c < C; c += warp.size()) {
    float n = s * (__ldcs(x + c) - m);
    __stcs(o + c, n * weight[c] + bias[c]);
  }
}
