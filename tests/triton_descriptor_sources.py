"""Triton kernels taking host-side tensor descriptors, in the style of Triton's TMA tutorials."""

import triton
import triton.language as tl


@triton.jit
def add(x_desc, y_desc, out_desc, BM: tl.constexpr, BN: tl.constexpr):
  """out = x + y, one BM x BN tile a program; TMA clips the tiles at the array's edges."""
  m = tl.program_id(0) * BM
  n = tl.program_id(1) * BN
  out_desc.store([m, n], x_desc.load([m, n]) + y_desc.load([m, n]))


@triton.jit
def scale_rows(x_desc, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
  """out[i, j] = x[i, j] * (i + 1) through a descriptor load and a plain store: reads past the edge
  (padding) must not leak into the output, and the descriptor's own shape bounds the store."""
  m = tl.program_id(0) * BM
  n = tl.program_id(1) * BN
  tile = x_desc.load([m, n])
  rows = m + tl.arange(0, BM)
  cols = n + tl.arange(0, BN)
  mask = (rows[:, None] < M) & (cols[None, :] < N)
  tl.store(out_ptr + rows[:, None] * N + cols[None, :], tile * (rows[:, None] + 1).to(tile.dtype), mask=mask)


@triton.jit
def matmul(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
  """C = A @ B, fp16 in, fp32 accumulation, as the tutorials' descriptor matmul."""
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  acc = tl.zeros((BM, BN), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BK)):
    a = a_desc.load([pid_m * BM, k * BK])
    b = b_desc.load([k * BK, pid_n * BN])
    acc = tl.dot(a, b, acc)
  c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.float16))


@triton.jit
def matmul_persistent(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      NUM_PROGRAMS: tl.constexpr):
  """C = A @ B.T with B given as (N, K), persistent over the tiles, as Triton's persistent-matmul tutorial
  does with host descriptors (its ``matmul_kernel_tma_persistent``, without warp specialization)."""
  tiles_n = tl.cdiv(N, BN)
  tiles = tl.cdiv(M, BM) * tiles_n
  for tile in tl.range(tl.program_id(0), tiles, NUM_PROGRAMS):
    m = (tile // tiles_n) * BM
    n = (tile % tiles_n) * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
      a = a_desc.load([m, k * BK])
      b = b_desc.load([n, k * BK])
      acc = tl.dot(a, b.T, acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@triton.autotune(configs=[triton.Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=8, num_stages=3),
                          triton.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=2)],
                 key=["M", "N", "K"])
@triton.jit
def matmul_autotuned(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
  """The descriptor matmul under @triton.autotune, as the tutorials write it (without their pre_hook: the
  block shapes come from the call's TensorDescriptor callables instead)."""
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  acc = tl.zeros((BM, BN), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BK)):
    acc = tl.dot(a_desc.load([pid_m * BM, k * BK]), b_desc.load([k * BK, pid_n * BN]), acc)
  c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.float16))
