"""Elementwise CuTe DSL kernels, written the way the DSL's own examples write them, for benchmarks/cute_native.py
and tests/test_cute_kernels.py.

Each launcher is a `@cute.jit` function with the signature `cutlass.jax.cutlass_call` (and `jmf.cute_call`) take:
`(stream, *inputs, *outputs, **constexprs)`. The same function compiles with `cute.compile` for the DSL's own
launcher on torch tensors (`from_dlpack`), and runs inside `jax.jit` through either call.

- `axpy`: out = alpha * x + y over 2-D tensors of any float type (math in f32), vectorized the DSL way: a
  thread-value layout of 128-bit vectors (`make_layout_tv`), the tensors cut into CTA tiles (`zipped_divide`), a
  tiled copy partitioning each tile among the threads, and a predicate per vector from an identity tensor so
  that any M and any N divisible by the vector width work.
- `add_one`: out = x + 1 on a 1-D float32 tensor, one element per thread: the trivial kernel whose launch cost is
  measured.

Written here from the DSL's documentation and examples (elementwise_add), not copied.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import numpy as np

COPY_BITS = 128  # one vector per copy: the widest global load/store


@cute.kernel
def _axpy_kernel(tiled_copy: cute.TiledCopy, gX: cute.Tensor, gY: cute.Tensor, gO: cute.Tensor, cO: cute.Tensor,
                 shape: cute.Shape, alpha: cutlass.Constexpr):
  tidx, _, _ = cute.arch.thread_idx()
  bidx, _, _ = cute.arch.block_idx()
  tile = ((None, None), bidx)  # this CTA's tile: (TileM, TileN)
  thread = tiled_copy.get_slice(tidx)
  # ((VECTOR, VECTORS), 1, 1): this thread's vectors of the tile
  tXgX = thread.partition_S(gX[tile])
  tYgY = thread.partition_S(gY[tile])
  tOgO = thread.partition_D(gO[tile])
  tOcO = thread.partition_S(cO[tile])  # the (m, n) coordinates of the same elements
  tXrX = cute.make_fragment_like(tXgX)
  tYrY = cute.make_fragment_like(tYgY)
  tOrO = cute.make_fragment_like(tOgO)
  # One predicate per vector, from the coordinates of its first element: N is a multiple of the vector width,
  # so a vector is in bounds exactly when its first element is.
  vectors, rest_m, rest_n = cute.size(tXgX, mode=[0, 1]), cute.size(tXgX, mode=[1]), cute.size(tXgX, mode=[2])
  pred = cute.make_rmem_tensor(cute.make_layout((vectors, rest_m, rest_n)), cutlass.Boolean)
  for v in cutlass.range_constexpr(vectors):
    for i in cutlass.range_constexpr(rest_m):
      for j in cutlass.range_constexpr(rest_n):
        pred[v, i, j] = cute.elem_less(tOcO[(0, v), i, j], shape)
  cute.copy(tiled_copy, tXgX, tXrX, pred=pred)
  cute.copy(tiled_copy, tYgY, tYrY, pred=pred)
  result = cutlass.Float32(alpha) * tXrX.load().to(cutlass.Float32) + tYrY.load().to(cutlass.Float32)
  tOrO.store(result.to(tOrO.element_type))
  cute.copy(tiled_copy, tOrO, tOgO, pred=pred)


@cute.jit
def axpy(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor, out: cute.Tensor, *, alpha: cutlass.Constexpr = 2.0,
         threads_m: cutlass.Constexpr = 4, threads_n: cutlass.Constexpr = 32, vectors_m: cutlass.Constexpr = 4):
  """out = alpha * x + y for 2-D row-major tensors of one float type; N must be a multiple of 16 bytes.

  Each CTA has threads_m x threads_n threads; each thread moves vectors_m 128-bit vectors of each tensor, one per
  row, so a CTA's tile is (threads_m * vectors_m) x (threads_n * vector width).
  """
  if cutlass.const_expr(not (x.element_type == y.element_type == out.element_type)):
    raise TypeError(f"axpy: x, y and out must have one element type, got {x.element_type}, {y.element_type}, "
                    f"{out.element_type}")
  vector = COPY_BITS // x.element_type.width
  thread_layout = cute.make_ordered_layout((threads_m, threads_n), order=(1, 0))  # threads along N first
  value_layout = cute.make_ordered_layout((vectors_m, vector), order=(1, 0))  # one vector per row
  tiler_mn, tv_layout = cute.make_layout_tv(thread_layout, value_layout)
  atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), x.element_type, num_bits_per_copy=COPY_BITS)
  tiled_copy = cute.make_tiled_copy_tv(atom, thread_layout, value_layout)
  gX = cute.zipped_divide(x, tiler_mn)  # ((TileM, TileN), (RestM, RestN))
  gY = cute.zipped_divide(y, tiler_mn)
  gO = cute.zipped_divide(out, tiler_mn)
  cO = cute.zipped_divide(cute.make_identity_tensor(out.shape), tiler_mn)
  _axpy_kernel(tiled_copy, gX, gY, gO, cO, out.shape, alpha).launch(
      grid=[cute.size(gO, mode=[1]), 1, 1], block=[cute.size(tv_layout, mode=[0]), 1, 1], stream=stream)


def axpy_reference(x, y, alpha: float = 2.0):
  """numpy: alpha * x + y in float32, in the inputs' dtype."""
  return (np.float32(alpha) * x.astype(np.float32) + y.astype(np.float32)).astype(x.dtype)


@cute.kernel
def _add_one_kernel(x: cute.Tensor, out: cute.Tensor, block: cutlass.Constexpr):
  tidx, _, _ = cute.arch.thread_idx()
  bidx, _, _ = cute.arch.block_idx()
  i = bidx * block + tidx
  if i < cute.size(x):
    out[i] = x[i] + cutlass.Float32(1.0)


@cute.jit
def add_one(stream: cuda.CUstream, x: cute.Tensor, out: cute.Tensor, *, block: cutlass.Constexpr = 256):
  """out = x + 1 on a 1-D float32 tensor: the trivial kernel of the launch-cost measurement."""
  _add_one_kernel(x, out, block).launch(grid=[cute.ceil_div(cute.size(x), block), 1, 1], block=[block, 1, 1],
                                        stream=stream)
