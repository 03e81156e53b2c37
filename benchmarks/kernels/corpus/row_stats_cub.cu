// Per-row sum of squares and absolute maximum, one block per row, reduced
// across the block with cub::BlockReduce.
//
// Mirrors: the statistics passes of normalization and quantization kernels
// in PyTorch and vLLM (`#include <cub/cub.cuh>`, a BlockReduce typedef sized
// by a template parameter, its TempStorage in __shared__ and reused after a
// __syncthreads, a functor for the max).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <cub/cub.cuh>

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <int BLOCK_THREADS>
__global__ void __launch_bounds__(BLOCK_THREADS)
row_sumsq_amax(const float* __restrict__ x, float* __restrict__ sumsq, float* __restrict__ amax, int cols) {
  using BlockReduce = cub::BlockReduce<float, BLOCK_THREADS>;
  __shared__ typename BlockReduce::TempStorage temp;

  const float* row = x + (size_t)blockIdx.x * cols;
  float sq = 0.0f, big = 0.0f;
  for (int i = threadIdx.x; i < cols; i += BLOCK_THREADS) {
    const float v = row[i];
    sq += v * v;
    big = fmaxf(big, fabsf(v));
  }
  const float total = BlockReduce(temp).Sum(sq);
  __syncthreads();  // temp is used again
  const float biggest = BlockReduce(temp).Reduce(big, MaxOp());
  if (threadIdx.x == 0) {  // the block-wide results are valid in thread 0
    sumsq[blockIdx.x] = total;
    amax[blockIdx.x] = biggest;
  }
}
