// 256-bin histogram of bytes: each block counts its grid-stride share in a
// shared-memory histogram with shared atomics, then writes it out as one row
// of per-block partial histograms (summed afterwards, outside the kernel).
//
// Mirrors: privatized histogram kernels of CUDA samples and image-processing
// code (uint8_t data, uint32_t bins from <stdint.h>, __shared__ bins zeroed
// by the block, atomicAdd on shared memory, grid-stride loops).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <stdint.h>
#include <assert.h>

#define NUM_BINS 256

extern "C" __global__ void histogram256_partial(const uint8_t* __restrict__ data,
                                                uint32_t* __restrict__ partial, int n) {
  assert(n >= 0);
  __shared__ uint32_t bins[NUM_BINS];
  for (int b = threadIdx.x; b < NUM_BINS; b += blockDim.x) bins[b] = 0;
  __syncthreads();

  const int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) atomicAdd(&bins[data[i]], 1u);
  __syncthreads();

  // every bin of this block's row is written, zero or not
  for (int b = threadIdx.x; b < NUM_BINS; b += blockDim.x) partial[blockIdx.x * NUM_BINS + b] = bins[b];
}
