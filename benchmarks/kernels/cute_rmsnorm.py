"""RMSNorm over rows as a CuTe DSL kernel, written the way the DSL's examples write row-wise kernels, for
benchmarks/cute_native.py and tests/test_cute_kernels.py.

    out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w

x and out are (M, N) row-major, w is (N,); all one float type, the math in f32. One CTA per row: a tiled copy of
128-bit vectors lays the row out across the threads (each thread holds its N / threads elements in registers),
the squares are summed per thread, across each warp with butterfly shuffles and across the warps through shared
memory, then each thread scales its elements and stores them. The launcher has the signature `cutlass_call` and
`jmf.cute_call` take, `(stream, x, w, out, *, eps, threads)`; the row length must be known when compiling
(static shapes: `use_static_tensors=True`, or `from_dlpack` tensors as they come).

Written here from the DSL's documentation and examples, not copied.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import numpy as np
from cutlass.memory import SmemAllocator

COPY_BITS = 128
WARP = 32


@cute.kernel
def _rmsnorm_kernel(tiled_copy: cute.TiledCopy, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
                    cols: cutlass.Constexpr, tile_n: cutlass.Constexpr, warps: cutlass.Constexpr,
                    eps: cutlass.Constexpr):
  tidx, _, _ = cute.arch.thread_idx()
  row, _, _ = cute.arch.block_idx()
  thread = tiled_copy.get_slice(tidx)
  # This row, in whole tiles of tile_n columns: (1, tile_n * tiles).
  padded = cute.ceil_div(cols, tile_n) * tile_n
  gX = cute.local_tile(mX, (1, padded), (row, 0))
  gO = cute.local_tile(mO, (1, padded), (row, 0))
  gW = cute.local_tile(mW, (1, padded), (0, 0))
  cX = cute.local_tile(cute.make_identity_tensor(mX.shape), (1, padded), (row, 0))
  tXgX = thread.partition_S(gX)  # ((VECTOR, 1), 1, TILES)
  tWgW = thread.partition_S(gW)
  tOgO = thread.partition_D(gO)
  tXcX = thread.partition_S(cX)
  tXrX = cute.make_fragment_like(tXgX)
  tWrW = cute.make_fragment_like(tWgW)
  tOrO = cute.make_fragment_like(tOgO)
  tXrX.fill(0)  # columns past N stay 0: they add nothing to the sum of squares
  tWrW.fill(0)
  tiles = cute.size(tXgX, mode=[2])
  pred = cute.make_rmem_tensor(cute.make_layout((1, 1, tiles)), cutlass.Boolean)
  for t in cutlass.range_constexpr(tiles):
    pred[0, 0, t] = cute.elem_less(tXcX[(0, 0), 0, t][1], cols)  # N is a multiple of the vector width
  cute.copy(tiled_copy, tXgX, tXrX, pred=pred)
  cute.copy(tiled_copy, tWgW, tWrW, pred=pred)

  x = tXrX.load().to(cutlass.Float32)
  squares = cute.TensorSSA.reduce(x * x, cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
  squares = cute.arch.warp_reduction(squares, lambda a, b: a + b)
  # Across the warps: one partial sum per warp in shared memory, every thread adds them up.
  smem = SmemAllocator()
  partial = smem.allocate_tensor(cutlass.Float32, cute.make_layout(warps), byte_alignment=16)
  warp = cute.arch.warp_idx()
  lane = cute.arch.lane_idx()
  if lane == 0:
    partial[warp] = squares
  cute.arch.sync_threads()
  total = cutlass.Float32(0.0)
  for k in cutlass.range_constexpr(warps):
    total = total + partial[k]
  scale = cute.math.rsqrt(total / cutlass.Float32(cols) + cutlass.Float32(eps), fastmath=False)

  y = x * scale * tWrW.load().to(cutlass.Float32)
  tOrO.store(y.to(tOrO.element_type))
  cute.copy(tiled_copy, tOrO, tOgO, pred=pred)


@cute.jit
def rmsnorm(stream: cuda.CUstream, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor, *, eps: cutlass.Constexpr = 1e-6,
            threads: cutlass.Constexpr = 256):
  """out = x * rsqrt(mean(x^2, axis=1) + eps) * w, one CTA of `threads` threads per row of x (M, N)."""
  if cutlass.const_expr(not (x.element_type == w.element_type == out.element_type)):
    raise TypeError(f"rmsnorm: x, w and out must have one element type, got {x.element_type}, {w.element_type}, "
                    f"{out.element_type}")
  cols = x.shape[1]
  if cutlass.const_expr(not isinstance(cols, int)):
    raise TypeError("rmsnorm needs the row length when compiling: pass use_static_tensors=True to "
                    "cutlass_call / cute_call (from_dlpack tensors are static as they come)")
  vector = COPY_BITS // x.element_type.width
  if cutlass.const_expr(cols % vector or threads % WARP):
    raise ValueError(f"rmsnorm: the row length ({cols}) must be a multiple of {vector} and threads ({threads}) of "
                     f"{WARP}")
  atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), x.element_type, num_bits_per_copy=COPY_BITS)
  # Threads side by side along the row, one vector each per tile of threads * vector columns.
  tiled_copy = cute.make_tiled_copy_tv(atom, cute.make_layout((1, threads)), cute.make_layout((1, vector)))
  w_row = cute.make_tensor(w.iterator, cute.make_layout((1, cols), stride=(0, 1)))  # (N,) seen as one row
  _rmsnorm_kernel(tiled_copy, x, w_row, out, cols, threads * vector, threads // WARP, eps).launch(
      grid=[x.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)


def rmsnorm_reference(x, w, eps: float = 1e-6):
  """numpy, in float32, in the inputs' dtype."""
  x32, w32 = x.astype(np.float32), w.astype(np.float32)
  scale = 1.0 / np.sqrt(np.mean(x32 * x32, axis=1, keepdims=True) + np.float32(eps))
  return (x32 * scale * w32).astype(x.dtype)
