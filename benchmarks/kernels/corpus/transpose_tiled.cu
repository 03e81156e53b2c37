// Matrix transpose through a padded 32x32 shared-memory tile, so that both
// the reads and the writes of global memory are coalesced.
//
// Mirrors: the classic coalesced-transpose kernel of CUDA tutorials
// (TILE_DIM/BLOCK_ROWS macros, a [TILE_DIM][TILE_DIM + 1] tile against bank
// conflicts, 32x8 thread blocks each moving a 32x32 tile), with bounds
// checks for any shape and `uint` indices as nvcc code writes them without
// an include.
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#define TILE_DIM 32
#define BLOCK_ROWS 8

extern "C" __global__ void transpose_tiled(float* __restrict__ odata, const float* __restrict__ idata,
                                           uint rows, uint cols) {
  __shared__ float tile[TILE_DIM][TILE_DIM + 1];

  uint x = blockIdx.x * TILE_DIM + threadIdx.x;  // input column
  uint y = blockIdx.y * TILE_DIM + threadIdx.y;  // input row
  for (uint j = 0; j < TILE_DIM; j += BLOCK_ROWS)
    if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = __ldg(&idata[(size_t)(y + j) * cols + x]);
  __syncthreads();

  x = blockIdx.y * TILE_DIM + threadIdx.x;  // output column = input row
  y = blockIdx.x * TILE_DIM + threadIdx.y;  // output row = input column
  for (uint j = 0; j < TILE_DIM; j += BLOCK_ROWS)
    if (x < rows && y + j < cols) odata[(size_t)(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}
