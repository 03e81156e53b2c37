"""Gluon kernels written the way Triton's Gluon tutorials write them, for benchmarks/gluon_native.py and the tests.

Hopper GEMMs on TMA and wgmma, in the style of the tutorials' 05-wgmma (`blocked_matmul_pipelined`: a
double-buffered loop) and 07-persistence (`matmul_pipelined`: a ring of buffers, the MMA as an ``@aggregate``
class passed as a constexpr, ``MMAImpl=WGMMA``), both taking ``num_warps: gl.constexpr`` as the tutorials do; and
a small elementwise kernel for the launch cost. Written here, not copied. The same functions run through Triton's
own launcher (``kernel[grid](descriptors..., num_warps=8)`` on torch tensors) and through ``jmf.gluon_kernel``.

Gluon's TMA copies are named differently across the Triton releases we support: ``tma.async_load`` and
``async_store`` from Triton 3.8 (3.9 keeps the older names only as stubs that raise), ``async_copy_global_to_shared``
and ``async_copy_shared_to_global`` before. The two aliases below pick the installed release's, so the corpus runs on
the H200's Triton 3.6 and on 3.9; a barrier is allocated as shared memory (``mbarrier.allocate_mbarrier`` is 3.7's).
"""

from typing import Union

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_accumulator, warpgroup_mma_init,
                                                              warpgroup_mma_wait)

try:  # Triton 3.8 and newer export it; 3.6 and 3.7 have Triton's own
  from triton.experimental.gluon import aggregate
except ImportError:
  from triton.language.core import _aggregate as aggregate

tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

# ------------------------------------------------------------------ the wgmma layout for a tile and num_warps


@gluon.constexpr_function
def wgmma_warps(BLOCK_M, num_warps):
  """Warps per CTA of the accumulator: warp groups of 4 along M first (16 rows each), then along N."""
  warps = [4, 1]
  while warps[0] * warps[1] != num_warps:
    if BLOCK_M > 16 * warps[0]:
      warps[0] *= 2
    else:
      warps[1] *= 2
  return warps


@gluon.constexpr_function
def wgmma_instr_n(BLOCK_M, BLOCK_N, num_warps):
  """The widest wgmma N (a multiple of 8, at most 256) that tiles this warp's share of BLOCK_N."""
  reps_m = triton.cdiv(BLOCK_M, 16)
  reps_n = triton.cdiv(num_warps, reps_m)
  widest = max(BLOCK_N // reps_n, 8)
  n = 256
  while n > widest or BLOCK_N % n != 0:
    n -= 8
  return n


@gluon.constexpr_function
def wgmma_layout(dtype, BLOCK_M, BLOCK_N, num_warps):
  k = 256 // dtype.primitive_bitwidth
  return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=wgmma_warps(BLOCK_M, num_warps),
                                   instr_shape=[16, wgmma_instr_n(BLOCK_M, BLOCK_N, num_warps), k])


# ------------------------------------------------------------------ 05-wgmma: double-buffered


@gluon.jit
def blocked_matmul_pipelined(a_desc, b_desc, c_desc, num_warps: gl.constexpr):
  """C = A @ B, one output tile per program: the TMA load of step k+1 overlaps the wgmma of step k."""
  BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
  BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
  BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
  dtype: gl.constexpr = a_desc.dtype
  K = a_desc.shape[1]

  a_bufs = gl.allocate_shared_memory(dtype, [2] + a_desc.block_type.shape, a_desc.layout)
  b_bufs = gl.allocate_shared_memory(dtype, [2] + b_desc.block_type.shape, b_desc.layout)
  bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
  mbarrier.init(bar, count=1)
  off_m = gl.program_id(0) * BLOCK_M
  off_n = gl.program_id(1) * BLOCK_N

  acc_layout: gl.constexpr = wgmma_layout(dtype, BLOCK_M, BLOCK_N, num_warps)
  acc = warpgroup_mma_init(gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout))
  phase = 0
  slot = 0
  for k in range(0, K, BLOCK_K):
    a = a_bufs.index(slot)
    b = b_bufs.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma_load(a_desc, [off_m, k], bar, a)
    tma_load(b_desc, [k, off_n], bar, b)
    mbarrier.wait(bar, phase=phase)
    phase ^= 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))  # the MMA reading the other slot is done
    acc = warpgroup_mma(a, b, acc, is_async=True)
    slot ^= 1
  acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
  mbarrier.invalidate(bar)

  c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
  c_smem.store(acc.to(dtype))
  fence_async_shared()
  tma_store(c_desc, [off_m, off_n], c_smem)
  tma.store_wait(pendings=0)


# ------------------------------------------------------------------ 07-persistence: a ring, the MMA a class


@aggregate
class WGMMA:
  """Hopper's warpgroup MMA behind the interface the kernel calls (07-persistence swaps in Blackwell's)."""

  acc: Union[warpgroup_mma_accumulator, gl.tensor]
  use_acc: gl.tensor

  @gluon.constexpr_function
  def __init__(self, acc, use_acc):
    self.acc = acc
    self.use_acc = use_acc

  @gluon.jit
  def initialize(dtype: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr):
    layout: gl.constexpr = wgmma_layout(dtype, BLOCK_M, BLOCK_N, num_warps)
    return WGMMA(gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout), gl.to_tensor(False))

  @gluon.jit
  def issue_async_mma(self, a, b):
    acc = warpgroup_mma(a, b, self.acc, is_async=True, use_acc=self.use_acc)
    return WGMMA(acc, gl.to_tensor(True))

  @gluon.jit
  def wait_num_outstanding(self, num_outstanding: gl.constexpr):
    return WGMMA(warpgroup_mma_wait(num_outstanding, (self.acc, )), self.use_acc)

  @gluon.jit
  def take_result(self):
    return self.acc, WGMMA(self.acc, gl.to_tensor(False))


@gluon.jit
def issue_loads(producer, a_desc, b_desc, off_m, off_n, k, bars, a_bufs, b_bufs, num_buffers: gl.constexpr):
  index = producer % num_buffers
  bar = bars.index(index)
  mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
  tma_load(a_desc, [off_m, k], bar, a_bufs.index(index))
  tma_load(b_desc, [k, off_n], bar, b_bufs.index(index))
  return producer + 1


@gluon.jit
def issue_mma(consumer, mma, bars, a_bufs, b_bufs, num_buffers: gl.constexpr):
  index = consumer % num_buffers
  mbarrier.wait(bars.index(index), consumer // num_buffers & 1)
  # One MMA in flight at most: the one issued before this reads a buffer the next loads may overwrite.
  mma = mma.wait_num_outstanding(0)
  mma = mma.issue_async_mma(a_bufs.index(index), b_bufs.index(index))
  return consumer + 1, mma


@gluon.jit
def matmul_pipelined(a_desc, b_desc, c_desc, MMAImpl: gl.constexpr, num_buffers: gl.constexpr,
                     num_warps: gl.constexpr):
  """C = A @ B, one output tile per program, loads running num_buffers - 2 steps ahead of the MMAs."""
  BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
  BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
  BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
  dtype: gl.constexpr = a_desc.dtype
  K = a_desc.shape[1]
  gl.static_assert(num_buffers >= 2, "the ring needs at least 2 buffers")

  a_bufs = gl.allocate_shared_memory(dtype, [num_buffers] + a_desc.block_type.shape, a_desc.layout)
  b_bufs = gl.allocate_shared_memory(dtype, [num_buffers] + b_desc.block_type.shape, b_desc.layout)
  bars = gl.allocate_shared_memory(gl.int64, [num_buffers, 1], mbarrier.MBarrierLayout())
  for i in gl.static_range(num_buffers):
    mbarrier.init(bars.index(i), count=1)
  off_m = gl.program_id(0) * BLOCK_M
  off_n = gl.program_id(1) * BLOCK_N

  producer = 0
  consumer = 0
  mma = MMAImpl.initialize(dtype, BLOCK_M, BLOCK_N, num_warps)
  for k in gl.static_range(0, BLOCK_K * (num_buffers - 2), BLOCK_K):
    producer = issue_loads(producer, a_desc, b_desc, off_m, off_n, k, bars, a_bufs, b_bufs, num_buffers)
  for k in range(BLOCK_K * (num_buffers - 2), K, BLOCK_K):
    producer = issue_loads(producer, a_desc, b_desc, off_m, off_n, k, bars, a_bufs, b_bufs, num_buffers)
    consumer, mma = issue_mma(consumer, mma, bars, a_bufs, b_bufs, num_buffers)
  for _ in gl.static_range(num_buffers - 2):
    consumer, mma = issue_mma(consumer, mma, bars, a_bufs, b_bufs, num_buffers)
  mma = mma.wait_num_outstanding(0)
  for i in gl.static_range(num_buffers):
    mbarrier.invalidate(bars.index(i))

  c, mma = mma.take_result()
  c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
  c_smem.store(c.to(dtype))
  fence_async_shared()
  tma_store(c_desc, [off_m, off_n], c_smem)
  tma.store_wait(pendings=0)


# ------------------------------------------------------------------ the launch cost: one small elementwise kernel


@gluon.jit
def add_one(in_ptr, out_ptr, n, BLOCK: gl.constexpr, num_warps: gl.constexpr):
  layout: gl.constexpr = gl.BlockedLayout([BLOCK // (32 * num_warps)], [32], [num_warps], [0])
  offsets = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
  mask = offsets < n
  gl.store(out_ptr + offsets, gl.load(in_ptr + offsets, mask=mask) + 1.0, mask=mask)


@gluon.jit
def load_tile(desc, smem):
  """The first tile of a descriptor into shared memory, through TMA, waited for."""
  bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
  mbarrier.init(bar, count=1)
  mbarrier.expect(bar, desc.block_type.nbytes)
  tma_load(desc, [0, 0], bar, smem)
  mbarrier.wait(bar, phase=0)
  mbarrier.invalidate(bar)


@gluon.jit
def tile_add_one(in_desc, out_ptr, num_warps: gl.constexpr):
  """out = in + 1 for one tile: loaded through a host descriptor (TMA), stored with plain stores. Through Triton's
  launcher each call builds its descriptor (TensorDescriptor.from_tensor), which the launch encodes."""
  M: gl.constexpr = in_desc.block_type.shape[0]
  N: gl.constexpr = in_desc.block_type.shape[1]
  smem = gl.allocate_shared_memory(in_desc.dtype, [M, N], in_desc.layout)
  load_tile(in_desc, smem)
  layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
  rows = gl.arange(0, M, layout=gl.SliceLayout(1, layout))[:, None]
  cols = gl.arange(0, N, layout=gl.SliceLayout(0, layout))[None, :]
  gl.store(out_ptr + rows * N + cols, smem.load(layout) + 1.0)


# The tiles the tutorials time their Hopper GEMMs with (07: BLOCK_M=128, BLOCK_N=256, (BLOCK_K, buffers) in (128, 2),
# (64, 3), (64, 4), num_warps=8); 05's double buffer takes the (64, 2) tile.
GEMM_TILE = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}
GEMM_BUFFERS = 4
GEMM_WARPS = 8
