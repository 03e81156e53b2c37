"""Triton kernels decorated as Triton users write them: @triton.autotune, @triton.heuristics, both stacked.

In the style of Triton's tutorials (stride arguments, grouped program ids, split-K with atomics); the tests
call them through jmf.triton_kernel(fn) unchanged.
"""

import triton
import triton.language as tl

import benchmarks_package


# The corpus's grouped matmul (benchmarks/kernels/triton_user.py), under this file's own @triton.autotune.
grouped_matmul = triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=4),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 4}, num_warps=4, num_stages=3),
    ],
    key=["M", "N", "K"],
)(benchmarks_package.kernels("triton_user").grouped_matmul)


@triton.heuristics({
    "BLOCK": lambda args: triton.next_power_of_2(args["n_cols"]),
    "num_warps": lambda args: 8 if args["BLOCK"] >= 2048 else 4,   # sees BLOCK, computed just above
    "UPCAST": lambda args: args["x_ptr"].dtype.itemsize < 4,
})
@triton.jit
def softmax_rows(x_ptr, out_ptr, stride_x, stride_out, n_cols, BLOCK: tl.constexpr, UPCAST: tl.constexpr):
  """One program per row; the whole row in one block of the next power of two."""
  row = tl.program_id(0)
  cols = tl.arange(0, BLOCK)
  mask = cols < n_cols
  x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"))
  if UPCAST:
    x = x.to(tl.float32)
  x = x - tl.max(x, axis=0)
  e = tl.exp(x)
  tl.store(out_ptr + row * stride_out + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 4}, num_warps=4, num_stages=2),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "SPLIT_K": 2}, num_warps=4, num_stages=3),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 8}, num_warps=4, num_stages=2),
    ],
    key=["M", "N", "K"],
    reset_to_zero=["c_ptr"],
)
@triton.heuristics({"EVEN_K": lambda args: args["K"] % (args["BLOCK_K"] * args["SPLIT_K"]) == 0})
@triton.jit
def splitk_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                  EVEN_K: tl.constexpr):
  """C += A[:, slice] @ B[slice, :] for this program's slice of K, with atomics: C must start at zero."""
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  pid_k = tl.program_id(2)
  rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
  a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
  b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
    if EVEN_K:
      a = tl.load(a_ptrs, mask=rm[:, None] < M, other=0.0)
      b = tl.load(b_ptrs, mask=rn[None, :] < N, other=0.0)
    else:
      left = K - k * BLOCK_K * SPLIT_K
      a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
      b = tl.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
    acc = tl.dot(a, b, acc)
    a_ptrs += BLOCK_K * SPLIT_K * stride_ak
    b_ptrs += BLOCK_K * SPLIT_K * stride_bk
  tl.atomic_add(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
                mask=(rm[:, None] < M) & (rn[None, :] < N))


def _small_blocks_only(configs, named_args, **kwargs):
  """early_config_prune: no block wider than the array (Triton's calling convention: named args, kwargs)."""
  return [c for c in configs if c.kwargs["BLOCK"] <= max(named_args["x_ptr"].numel(), 128)]


@triton.heuristics({"MASKED": lambda args: args["n"] % 1024 != 0})   # above: sees no config value
@triton.autotune(
    configs=[triton.Config({"BLOCK": 128}, num_warps=2), triton.Config({"BLOCK": 512}, num_warps=4),
             triton.Config({"BLOCK": 1024}, num_warps=8)],
    key=["n"],
    prune_configs_by={"early_config_prune": _small_blocks_only},
)
@triton.jit
def scaled_copy(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr, MASKED: tl.constexpr):
  """out = factor * x; unmasked when every block is full."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  if MASKED:
    tl.store(out_ptr + offsets, factor * tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)
  else:
    tl.store(out_ptr + offsets, factor * tl.load(x_ptr + offsets))


@triton.autotune(
    configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=4),
             triton.Config({"BLOCK": 1024}, num_warps=8)],
    key=["n"],
    restore_value=["x_ptr"],
)
@triton.jit
def add_in_place(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
  """x += y, in place: timing the configs must not add y more than once to the caller's x."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
  """Undecorated, for the tests to decorate in place (refused hooks, maxnreg)."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)
