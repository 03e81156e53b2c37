"""Triton kernels written the way Triton users write them, for benchmarks/triton_native.py, autotune.py and
vs_jax_triton.py, and the tests (tests/triton_sources.py, triton_decorated_sources.py).

Each takes its strides as arguments (so Triton's launcher specializes the ones equal to 1) and carries the
decorators real kernels arrive with: `@triton.autotune` with a config list for Hopper and a `key=`, and
`@triton.heuristics` for block sizes that follow from the arguments. They were written here in the style of
Triton's tutorials 02 (fused softmax), 03 (grouped matmul), 05 (layer norm) and 06 (flash attention), not copied.
The same functions run through Triton's own launcher (`kernel[grid](torch tensors...)`) and through
`jmf.triton_kernel`, so both sides launch the very same code.

Each kernel's parameters come in the order its tutorial uses (outputs not always last): the benchmark's
`param_order` maps them.
"""

import triton
import triton.language as tl

# ------------------------------------------------------------------ grouped matmul (fp32 accumulation)

MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
]


@triton.jit
def grouped_matmul(a_ptr, b_ptr, c_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
  """C = A @ B. Programs walk C's tiles GROUP_M tile-rows at a time, so the tiles of B they load stay in L2.
  Every operand by its strides, so a transposed or padded view is passed as it is."""
  pid = tl.program_id(0)
  tiles_m = tl.cdiv(M, BLOCK_M)
  tiles_n = tl.cdiv(N, BLOCK_N)
  per_group = GROUP_M * tiles_n
  first_m = (pid // per_group) * GROUP_M
  rows_here = min(tiles_m - first_m, GROUP_M)  # the last group may be short
  pid_m = first_m + (pid % per_group) % rows_here
  pid_n = (pid % per_group) // rows_here
  # Wrapping the row and column indices keeps every load in bounds, so only K needs a mask.
  rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
  rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
  rk = tl.arange(0, BLOCK_K)
  a_tile = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
  b_tile = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for step in range(0, tl.cdiv(K, BLOCK_K)):
    k_left = K - step * BLOCK_K
    a = tl.load(a_tile, mask=rk[None, :] < k_left, other=0.0)
    b = tl.load(b_tile, mask=rk[:, None] < k_left, other=0.0)
    acc = tl.dot(a, b, acc)
    a_tile += BLOCK_K * stride_ak
    b_tile += BLOCK_K * stride_bk
  cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  tl.store(c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
           mask=(cm[:, None] < M) & (cn[None, :] < N))


# As it arrives in a model's code: under @triton.autotune with Hopper's configs.
matmul_kernel = triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])(grouped_matmul)


# ------------------------------------------------------------------ flash attention forward (fp16, Z x H x S x D)

# BLOCK_N divides BLOCK_M in each: the causal diagonal is walked in whole key blocks.
ATTENTION_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_stages=2, num_warps=8),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_stages=4, num_warps=4),
]


@triton.jit
def _attend_keys(acc, row_sum, row_max, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, rows,
                 start, stop, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, ON_DIAGONAL: tl.constexpr):
  """Online softmax over the key blocks [start, stop): scores in base 2 (qk_scale holds log2(e))."""
  rd = tl.arange(0, HEAD_DIM)
  for first in range(start, stop, BLOCK_N):
    first = tl.multiple_of(first, BLOCK_N)
    cols = first + tl.arange(0, BLOCK_N)
    k_t = tl.load(k_base + rd[:, None] * stride_kd + cols[None, :] * stride_kn)
    scores = tl.dot(q, k_t) * qk_scale
    if ON_DIAGONAL:
      scores = tl.where(rows[:, None] >= cols[None, :], scores, -1.0e6)
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    p = tl.math.exp2(scores - new_max[:, None])
    rescale = tl.math.exp2(row_max - new_max)
    row_sum = row_sum * rescale + tl.sum(p, 1)
    v = tl.load(v_base + cols[:, None] * stride_vn + rd[None, :] * stride_vd)
    acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None])
    row_max = new_max
  return acc, row_sum, row_max


@triton.autotune(configs=ATTENTION_CONFIGS, key=["N_CTX", "HEAD_DIM", "CAUSAL"])
@triton.jit
def attention_fwd(Q, K, V, sm_scale, LSE, Out,
                  stride_qz, stride_qh, stride_qm, stride_qd, stride_kz, stride_kh, stride_kn, stride_kd,
                  stride_vz, stride_vh, stride_vn, stride_vd, stride_oz, stride_oh, stride_om, stride_od,
                  H, N_CTX,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
  """Out = softmax(Q K^T * sm_scale) V for one BLOCK_M block of queries of one (batch, head); LSE keeps each
  row's log2-sum-exp for a backward pass. N_CTX is a multiple of BLOCK_M."""
  block = tl.program_id(0)
  zh = tl.program_id(1)
  z = (zh // H).to(tl.int64)
  h = (zh % H).to(tl.int64)
  rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
  rd = tl.arange(0, HEAD_DIM)
  q = tl.load(Q + z * stride_qz + h * stride_qh + rows[:, None] * stride_qm + rd[None, :] * stride_qd)
  k_base = K + z * stride_kz + h * stride_kh
  v_base = V + z * stride_vz + h * stride_vh
  acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
  row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
  row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
  qk_scale = sm_scale * 1.4426950408889634
  if CAUSAL:  # blocks wholly below the diagonal unmasked, then the diagonal's with the mask
    acc, row_sum, row_max = _attend_keys(acc, row_sum, row_max, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                         stride_vd, rows, 0, block * BLOCK_M, qk_scale, HEAD_DIM, BLOCK_N, False)
    acc, row_sum, row_max = _attend_keys(acc, row_sum, row_max, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                         stride_vd, rows, block * BLOCK_M, (block + 1) * BLOCK_M, qk_scale,
                                         HEAD_DIM, BLOCK_N, True)
  else:
    acc, row_sum, row_max = _attend_keys(acc, row_sum, row_max, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                         stride_vd, rows, 0, N_CTX, qk_scale, HEAD_DIM, BLOCK_N, False)
  tl.store(LSE + zh * N_CTX + rows, row_max + tl.math.log2(row_sum))
  out = acc / row_sum[:, None]
  tl.store(Out + z * stride_oz + h * stride_oh + rows[:, None] * stride_om + rd[None, :] * stride_od,
           out.to(Out.dtype.element_ty))


# ------------------------------------------------------------------ fused softmax over rows (row strides)

@triton.jit
def _softmax_row(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
  """One program per row: the row is read once, kept in registers, and written once."""
  row = tl.program_id(0)
  cols = tl.arange(0, BLOCK_SIZE)
  mask = cols < n_cols
  x = tl.load(input_ptr + row * input_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
  e = tl.exp(x - tl.max(x, axis=0))
  tl.store(output_ptr + row * output_row_stride + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.heuristics({"BLOCK_SIZE": lambda args: triton.next_power_of_2(args["n_cols"])})
@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                   BLOCK_SIZE: tl.constexpr):
  """The tutorial's parameter order: the output first."""
  _softmax_row(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols, BLOCK_SIZE)


@triton.heuristics({"BLOCK_SIZE": lambda args: triton.next_power_of_2(args["n_cols"])})
@triton.jit
def softmax_kernel_output_last(input_ptr, output_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                               BLOCK_SIZE: tl.constexpr):
  """The order jax-triton expects: every array input before the outputs."""
  _softmax_row(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols, BLOCK_SIZE)


# ------------------------------------------------------------------ layer norm forward and backward

@triton.heuristics({"BLOCK_N": lambda args: triton.next_power_of_2(args["N"])})
@triton.jit
def layer_norm_fwd(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_N: tl.constexpr):
  """Y = (X - mean) * rstd * W + B per row; keeps mean and rstd for the backward pass."""
  row = tl.program_id(0)
  cols = tl.arange(0, BLOCK_N)
  mask = cols < N
  x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
  mean = tl.sum(x, axis=0) / N
  centered = tl.where(mask, x - mean, 0.0)
  rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / N + eps)
  w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
  b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
  tl.store(Y + row * stride + cols, (centered * rstd * w + b).to(Y.dtype.element_ty), mask=mask)
  tl.store(Mean + row, mean)
  tl.store(Rstd + row, rstd)


@triton.heuristics({"BLOCK_N": lambda args: triton.next_power_of_2(args["N"])})
@triton.jit
def layer_norm_bwd_dx(DX, DY, X, W, Mean, Rstd, PartialDW, PartialDB, stride, M, N, BLOCK_N: tl.constexpr):
  """DX per row, and this program's share of DW and DB: it takes rows pid, pid + programs, ... and writes the
  sums of its rows to row pid of PartialDW / PartialDB (no locks: a second kernel adds the rows up)."""
  pid = tl.program_id(0)
  programs = tl.num_programs(0)
  cols = tl.arange(0, BLOCK_N)
  mask = cols < N
  w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
  dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
  db = tl.zeros((BLOCK_N,), dtype=tl.float32)
  for row in range(pid, M, programs):
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    x_hat = tl.where(mask, (x - tl.load(Mean + row)) * tl.load(Rstd + row), 0.0)
    w_dy = tl.where(mask, w * dy, 0.0)
    c1 = tl.sum(x_hat * w_dy, axis=0) / N
    c2 = tl.sum(w_dy, axis=0) / N
    dx = (w_dy - (x_hat * c1 + c2)) * tl.load(Rstd + row)
    tl.store(DX + row * stride + cols, dx.to(DX.dtype.element_ty), mask=mask)
    dw += dy * x_hat
    db += dy
  tl.store(PartialDW + pid * N + cols, dw, mask=mask)
  tl.store(PartialDB + pid * N + cols, db, mask=mask)


@triton.jit
def layer_norm_bwd_dwdb(PartialDW, PartialDB, DW, DB, G, N, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
  """DW and DB: the G partial rows summed, BLOCK_N columns per program."""
  cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
  dw = tl.zeros((BLOCK_G, BLOCK_N), dtype=tl.float32)
  db = tl.zeros((BLOCK_G, BLOCK_N), dtype=tl.float32)
  for first in range(0, G, BLOCK_G):
    rows = first + tl.arange(0, BLOCK_G)
    mask = (rows[:, None] < G) & (cols[None, :] < N)
    dw += tl.load(PartialDW + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
    db += tl.load(PartialDB + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
  tl.store(DW + cols, tl.sum(dw, axis=0).to(DW.dtype.element_ty), mask=cols < N)
  tl.store(DB + cols, tl.sum(db, axis=0).to(DB.dtype.element_ty), mask=cols < N)


# ------------------------------------------------------------------ a tiny kernel, for the cost of a launch

@triton.jit
def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)
