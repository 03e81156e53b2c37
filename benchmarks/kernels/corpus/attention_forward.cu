// Attention forward, softmax(Q K^T * scale) V with an optional causal mask,
// for q, k, v, out laid out [batch, heads, T, HEAD_DIM], in the flash style:
// key/value tiles staged in shared memory, an online softmax per query, the
// T x T score matrix never stored.
//
// Mirrors: small-head-dim flash-attention forward kernels of educational and
// inference codebases (a warp per query, one key per lane for the scores,
// -INFINITY for masked scores and the running maximum, the output rescaled
// as the maximum grows, template parameters for the head dimension and
// tile sizes, __launch_bounds__ from them).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <cmath>
#include <cassert>

template <int HEAD_DIM, int QUERIES_PER_BLOCK, int KEYS_PER_TILE>
__global__ void __launch_bounds__(QUERIES_PER_BLOCK * 32)
attention_forward(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                  float* __restrict__ out, int T, float scale, int causal) {
  static_assert(KEYS_PER_TILE == 32, "one key of a tile per lane");
  static_assert(HEAD_DIM % 32 == 0, "HEAD_DIM / 32 output dimensions per lane");
  constexpr int DIMS_PER_LANE = HEAD_DIM / 32;
  assert(blockDim.x == QUERIES_PER_BLOCK * 32);

  __shared__ float k_tile[KEYS_PER_TILE][HEAD_DIM + 1];  // +1: lanes read one column of it at a time
  __shared__ float v_tile[KEYS_PER_TILE][HEAD_DIM];
  __shared__ float q_rows[QUERIES_PER_BLOCK][HEAD_DIM];

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int query = blockIdx.x * QUERIES_PER_BLOCK + warp;
  const size_t base = (size_t)blockIdx.y * T * HEAD_DIM;  // this (batch, head)

  for (int d = lane; d < HEAD_DIM; d += 32)
    q_rows[warp][d] = query < T ? q[base + (size_t)query * HEAD_DIM + d] : 0.0f;

  float row_max = -INFINITY;
  float row_sum = 0.0f;
  float acc[DIMS_PER_LANE] = {};

  // With the causal mask no query of this block sees a key after its last query.
  const int last_query = min(T, (int)(blockIdx.x + 1) * QUERIES_PER_BLOCK) - 1;
  const int key_end = causal ? last_query + 1 : T;
  for (int tile = 0; tile < key_end; tile += KEYS_PER_TILE) {
    __syncthreads();  // the previous tile is used up (and q_rows written, the first time)
    for (int i = threadIdx.x; i < KEYS_PER_TILE * HEAD_DIM; i += blockDim.x) {
      const int key = tile + i / HEAD_DIM, d = i % HEAD_DIM;
      const bool valid = key < T;
      k_tile[i / HEAD_DIM][d] = valid ? k[base + (size_t)key * HEAD_DIM + d] : 0.0f;
      v_tile[i / HEAD_DIM][d] = valid ? v[base + (size_t)key * HEAD_DIM + d] : 0.0f;
    }
    __syncthreads();
    if (query >= T) continue;  // the whole warp; it still takes part in the barriers

    const int key = tile + lane;
    float score = -INFINITY;
    if (key < T && (!causal || key <= query)) {
      float dot = 0.0f;
#pragma unroll 16
      for (int d = 0; d < HEAD_DIM; ++d) dot += q_rows[warp][d] * k_tile[lane][d];
      score = dot * scale;
    }
    float tile_max = score;
    for (int offset = 16; offset > 0; offset >>= 1)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, offset));
    const float new_max = fmaxf(row_max, tile_max);
    if (new_max == -INFINITY) continue;  // every key so far is masked (the same in all lanes)

    const float p = expf(score - new_max);  // 0 for a masked key
    float tile_sum = p;
    for (int offset = 16; offset > 0; offset >>= 1) tile_sum += __shfl_xor_sync(0xffffffff, tile_sum, offset);
    const float correction = expf(row_max - new_max);  // 0 while row_max is still -INFINITY
    row_sum = row_sum * correction + tile_sum;
#pragma unroll
    for (int j = 0; j < DIMS_PER_LANE; ++j) acc[j] *= correction;
    for (int src = 0; src < 32; ++src) {
      const float p_src = __shfl_sync(0xffffffff, p, src);
#pragma unroll
      for (int j = 0; j < DIMS_PER_LANE; ++j) acc[j] += p_src * v_tile[src][lane + 32 * j];
    }
    row_max = new_max;
  }
  if (query < T) {
#pragma unroll
    for (int j = 0; j < DIMS_PER_LANE; ++j) out[base + (size_t)query * HEAD_DIM + lane + 32 * j] = acc[j] / row_sum;
  }
}
