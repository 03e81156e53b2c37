"""Gluon kernels for the tests (Triton's @gluon.jit reads its source, so kernels live in a file), written to compile
on every Triton we support (3.6 to 3.9): the TMA copies through the corpus's aliases of them
(benchmarks/kernels/gluon_user.py, whose GEMMs the tests run too)."""

import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

import benchmarks_package

_corpus = benchmarks_package.kernels("gluon_user")
# aggregate too, for a class a test writes (tests/test_gluon.py's edited op).
aggregate, load_tile, tma_store = _corpus.aggregate, _corpus.load_tile, _corpus.tma_store


@gluon.jit
def copy_scalar(in_ptr, out_ptr):
  gl.store(out_ptr, gl.load(in_ptr))


@gluon.jit
def memcpy(in_ptr, out_ptr, xnumel, XBLOCK: gl.constexpr):
  """01-intro's copy, one element at a time: no layout at all."""
  start = gl.program_id(0) * XBLOCK
  for i in range(start, min(start + XBLOCK, xnumel)):
    gl.store(out_ptr + i, gl.load(in_ptr + i))


@gluon.jit
def add(a_ptr, b_ptr, c_ptr, xnumel, XBLOCK: gl.constexpr, layout: gl.constexpr):
  """A layout as a constexpr (02-layouts): its warps_per_cta must be the launch's num_warps."""
  offsets = gl.program_id(0) * XBLOCK + gl.arange(0, XBLOCK, layout=layout)
  mask = offsets < xnumel
  gl.store(c_ptr + offsets, gl.load(a_ptr + offsets, mask=mask) + gl.load(b_ptr + offsets, mask=mask), mask=mask)


@gluon.jit
def axpy(x_ptr, y_ptr, out_ptr, n, alpha, XBLOCK: gl.constexpr, num_warps: gl.constexpr):
  """out = alpha * x + y, its layout made of the num_warps parameter (which takes the launch option's value)."""
  layout: gl.constexpr = gl.BlockedLayout([XBLOCK // (32 * num_warps)], [32], [num_warps], [0])
  offsets = gl.program_id(0) * XBLOCK + gl.arange(0, XBLOCK, layout=layout)
  mask = offsets < n
  x = gl.load(x_ptr + offsets, mask=mask)
  gl.store(out_ptr + offsets, alpha * x + gl.load(y_ptr + offsets, mask=mask), mask=mask)


@gluon.jit
def add_after_wait(a_ptr, b_ptr, c_ptr, xnumel, XBLOCK: gl.constexpr, num_warps: gl.constexpr):
  """The add, waiting for the previous kernel before it reads (programmatic dependent launch)."""
  tl.extra.cuda.gdc_wait()
  layout: gl.constexpr = gl.BlockedLayout([XBLOCK // (32 * num_warps)], [32], [num_warps], [0])
  offsets = gl.program_id(0) * XBLOCK + gl.arange(0, XBLOCK, layout=layout)
  mask = offsets < xnumel
  gl.store(c_ptr + offsets, gl.load(a_ptr + offsets, mask=mask) + gl.load(b_ptr + offsets, mask=mask), mask=mask)


@gluon.jit
def apply_op(x_ptr, out_ptr, n, Op: gl.constexpr, XBLOCK: gl.constexpr, num_warps: gl.constexpr):
  """Op.apply on each element: Op a class passed as a constexpr (as 07-persistence passes MMAImpl=WGMMA)."""
  layout: gl.constexpr = gl.BlockedLayout([XBLOCK // (32 * num_warps)], [32], [num_warps], [0])
  offsets = gl.program_id(0) * XBLOCK + gl.arange(0, XBLOCK, layout=layout)
  mask = offsets < n
  gl.store(out_ptr + offsets, Op.apply(gl.load(x_ptr + offsets, mask=mask)), mask=mask)


@gluon.jit
def tile_copy(in_desc, out_ptr, M: gl.constexpr, N: gl.constexpr, num_warps: gl.constexpr):
  """A host descriptor's tile in through TMA, out with plain stores: the first M x N of the array."""
  smem = gl.allocate_shared_memory(in_desc.dtype, [M, N], in_desc.layout)
  load_tile(in_desc, smem)
  layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
  rows = gl.arange(0, M, layout=gl.SliceLayout(1, layout))[:, None]
  cols = gl.arange(0, N, layout=gl.SliceLayout(0, layout))[None, :]
  gl.store(out_ptr + rows * N + cols, smem.load(layout))


@gluon.jit
def tile_copy_device(in_ptr, out_ptr, M: gl.constexpr, N: gl.constexpr):
  """The same through descriptors made in the kernel (gluon_test.py's test_device_desc_tma_copy): they live in
  Triton's global scratch, 128 bytes each per program."""
  layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([M, N], gl.float32)
  in_desc = tma.make_tensor_descriptor(in_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N], layout=layout)
  out_desc = tma.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N], layout=layout)
  smem = gl.allocate_shared_memory(gl.float32, [M, N], layout)
  load_tile(in_desc, smem)
  fence_async_shared()
  tma_store(out_desc, [0, 0], smem)
  tma.store_wait(0)


@gluon.jit
def uses_async_load(in_desc, out_ptr, M: gl.constexpr, N: gl.constexpr):
  """Written for Triton >= 3.8 (tma.async_load): what another release's user meets."""
  smem = gl.allocate_shared_memory(in_desc.dtype, [M, N], in_desc.layout)
  bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
  mbarrier.init(bar, count=1)
  tma.async_load(in_desc, [0, 0], bar, smem)
  mbarrier.wait(bar, phase=0)


@gluon.jit
def wrong_warps(a_ptr, n, XBLOCK: gl.constexpr):
  """A layout written for 4 warps, whatever num_warps the launch asks."""
  layout: gl.constexpr = gl.BlockedLayout([XBLOCK // 128], [32], [4], [0])
  offsets = gl.arange(0, XBLOCK, layout=layout)
  gl.store(a_ptr + offsets, gl.load(a_ptr + offsets, mask=offsets < n), mask=offsets < n)


@gluon.jit
def _add_one_block(x_ptr, out_ptr, start, XBLOCK: gl.constexpr, warps: gl.constexpr):
  layout: gl.constexpr = gl.BlockedLayout([XBLOCK // (32 * warps)], [32], [warps], [0])
  offsets = start + gl.arange(0, XBLOCK, layout=layout)
  gl.store(out_ptr + offsets, gl.load(x_ptr + offsets) + 1.0)


@gluon.jit
def ws_add_one(x_ptr, out_ptr, XBLOCK: gl.constexpr, num_warps: gl.constexpr):
  """Warp-specialized (08-warp-specialization): the kernel's num_warps warps do one block, a 1-warp worker the
  next, so the launch takes num_warps + 1 warps (Triton's metadata says how many)."""
  start = gl.program_id(0) * 2 * XBLOCK
  gl.warp_specialize([(_add_one_block, (x_ptr, out_ptr, start, XBLOCK, num_warps)),
                      (_add_one_block, (x_ptr, out_ptr, start + XBLOCK, XBLOCK, 1))], [1], [48])
