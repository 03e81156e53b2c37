"""softmax over the last axis of x viewed as (M, N): rows that fit a block are read once and written once,
BLOCK_M of them per program; longer rows are walked twice (an online max and sum, then the output)."""

import triton
import triton.language as tl


@triton.jit
def softmax_forward(X, Y, rows, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
  """grid (cdiv(M, BLOCK_M),)."""
  offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_n = tl.arange(0, BLOCK_N)
  mask = (offs_m < rows)[:, None] & (offs_n < n)[None, :]
  offsets = offs_m.to(tl.int64)[:, None] * n + offs_n[None, :]
  x = tl.load(X + offsets, mask=mask, other=float("-inf")).to(tl.float32)
  e = tl.exp(x - tl.max(x, 1)[:, None])
  tl.store(Y + offsets, (e / tl.sum(e, 1)[:, None]).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def softmax_forward_long(X, Y, rows, n, BLOCK_N: tl.constexpr):
  """grid (M,): one row longer than a block."""
  row = tl.program_id(0).to(tl.int64)
  m = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
  total = tl.zeros([BLOCK_N], dtype=tl.float32)
  for start in range(0, n, BLOCK_N):
    offs = start + tl.arange(0, BLOCK_N)
    x = tl.load(X + row * n + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
    m_new = tl.maximum(m, x)
    total = total * tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new)) + tl.where(
        m_new == float("-inf"), 0.0, tl.exp(x - m_new))
    m = m_new
  row_max = tl.max(m, 0)
  row_sum = tl.sum(total * tl.where(m == float("-inf"), 0.0, tl.exp(m - row_max)), 0)
  for start in range(0, n, BLOCK_N):
    offs = start + tl.arange(0, BLOCK_N)
    x = tl.load(X + row * n + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
    tl.store(Y + row * n + offs, (tl.exp(x - row_max) / row_sum).to(Y.dtype.element_ty), mask=offs < n)
