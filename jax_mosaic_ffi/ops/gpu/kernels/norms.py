"""layer_norm and rms_norm (SUBTRACT_MEAN off) over the last axis of x viewed as (M, N), forward and backward.

A row that fits `BLOCK_N` is read once and written once (Pallas's kernel reads it three times); longer rows are
walked in blocks, twice (three times with the mean). The forward keeps the mean and 1/std per row, float32,
for the backward, which computes dx row by row and writes each program's share of dw and db, float32, for the
caller to sum (no atomics: every program's partial sums are its own row of the output).
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize_on_alignment=["MEAN", "RSTD"])
def norm_forward(X, W, B, Y, MEAN, RSTD, rows, n, eps, SUBTRACT_MEAN: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr):
  """grid (cdiv(M, BLOCK_M),): BLOCK_M whole rows per program (n <= BLOCK_N)."""
  offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_n = tl.arange(0, BLOCK_N)
  m_ok = offs_m < rows
  n_ok = offs_n < n
  mask = m_ok[:, None] & n_ok[None, :]
  offsets = offs_m.to(tl.int64)[:, None] * n + offs_n[None, :]
  x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
  if SUBTRACT_MEAN:
    mean = tl.sum(x, 1) / n
    x = tl.where(mask, x - mean[:, None], 0.0)
  else:
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
  rstd = 1.0 / tl.sqrt(tl.sum(x * x, 1) / n + eps)
  w = tl.load(W + offs_n, mask=n_ok, other=0.0).to(tl.float32)
  b = tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)
  y = x * rstd[:, None] * w[None, :] + b[None, :]
  tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)
  tl.store(MEAN + offs_m, mean, mask=m_ok)
  tl.store(RSTD + offs_m, rstd, mask=m_ok)


@triton.jit(do_not_specialize_on_alignment=["MEAN", "RSTD"])
def norm_forward_long(X, W, B, Y, MEAN, RSTD, rows, n, eps, SUBTRACT_MEAN: tl.constexpr, BLOCK_N: tl.constexpr):
  """grid (M,): one row longer than a block, walked in blocks of BLOCK_N."""
  row = tl.program_id(0).to(tl.int64)
  x_row = X + row * n
  mean = 0.0
  if SUBTRACT_MEAN:
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
      offs = start + tl.arange(0, BLOCK_N)
      total += tl.load(x_row + offs, mask=offs < n, other=0.0).to(tl.float32)
    mean = tl.sum(total, 0) / n
  squares = tl.zeros([BLOCK_N], dtype=tl.float32)
  for start in range(0, n, BLOCK_N):
    offs = start + tl.arange(0, BLOCK_N)
    x = tl.load(x_row + offs, mask=offs < n, other=0.0).to(tl.float32)
    x = tl.where(offs < n, x - mean, 0.0)
    squares += x * x
  rstd = 1.0 / tl.sqrt(tl.sum(squares, 0) / n + eps)
  for start in range(0, n, BLOCK_N):
    offs = start + tl.arange(0, BLOCK_N)
    ok = offs < n
    x = tl.load(x_row + offs, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * n + offs, ((x - mean) * rstd * w + b).to(Y.dtype.element_ty), mask=ok)
  tl.store(MEAN + row, mean)
  tl.store(RSTD + row, rstd)


@triton.jit(do_not_specialize_on_alignment=["MEAN", "RSTD"])
def norm_backward(X, W, DY, MEAN, RSTD, DX, DW_PART, DB_PART, group_rows, n, rows_per_program,
                  SUBTRACT_MEAN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
  """grid (SPLITS, GROUPS) over x viewed as (GROUPS, group_rows, n) (n <= BLOCK_N): program (s, g) takes rows
  [s * rows_per_program, ...) of group g, BLOCK_M at a time; its sums of dy * xhat and dy are row g * SPLITS + s
  of DW_PART and DB_PART (float32), summed after (a two-stage reduction: no atomics, the same sums every run)."""
  s = tl.program_id(0)
  g = tl.program_id(1).to(tl.int64)
  first = s * rows_per_program
  last = tl.minimum(first + rows_per_program, group_rows)
  offs_n = tl.arange(0, BLOCK_N)
  n_ok = offs_n < n
  w = tl.load(W + offs_n, mask=n_ok, other=0.0).to(tl.float32)
  dw = tl.zeros([BLOCK_N], dtype=tl.float32)
  db = tl.zeros([BLOCK_N], dtype=tl.float32)
  for start in range(first, last, BLOCK_M):
    offs_m = start + tl.arange(0, BLOCK_M)
    m_ok = offs_m < last
    rows = g * group_rows + offs_m
    mask = m_ok[:, None] & n_ok[None, :]
    offsets = rows[:, None] * n + offs_n[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + rows, mask=m_ok, other=0.0)
    if SUBTRACT_MEAN:
      mean = tl.load(MEAN + rows, mask=m_ok, other=0.0)
      xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    else:
      xhat = x * rstd[:, None]
    wdy = w[None, :] * dy
    c1 = tl.sum(xhat * wdy, 1) / n
    if SUBTRACT_MEAN:
      c2 = tl.sum(wdy, 1) / n
      dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
    else:
      dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
    dw += tl.sum(dy * xhat, 0)
    db += tl.sum(dy, 0)
  part = (g * tl.num_programs(0) + s) * n
  tl.store(DW_PART + part + offs_n, dw, mask=n_ok)
  tl.store(DB_PART + part + offs_n, db, mask=n_ok)


@triton.jit(do_not_specialize_on_alignment=["MEAN", "RSTD"])
def norm_backward_long(X, W, DY, MEAN, RSTD, DX, rows, n, SUBTRACT_MEAN: tl.constexpr, BLOCK_N: tl.constexpr):
  """grid (M,): dx of one row longer than a block, walked in blocks twice (dw and db: the caller's column sums)."""
  row = tl.program_id(0).to(tl.int64)
  rstd = tl.load(RSTD + row)
  mean = 0.0
  if SUBTRACT_MEAN:
    mean = tl.load(MEAN + row)
  c1_terms = tl.zeros([BLOCK_N], dtype=tl.float32)
  c2_terms = tl.zeros([BLOCK_N], dtype=tl.float32)
  for start in range(0, n, BLOCK_N):
    offs = start + tl.arange(0, BLOCK_N)
    ok = offs < n
    x = tl.load(X + row * n + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * n + offs, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    xhat = tl.where(ok, (x - mean) * rstd, 0.0)
    c1_terms += xhat * w * dy
    c2_terms += w * dy
  c1 = tl.sum(c1_terms, 0) / n
  c2 = 0.0
  if SUBTRACT_MEAN:
    c2 = tl.sum(c2_terms, 0) / n
  for start in range(0, n, BLOCK_N):
    offs = start + tl.arange(0, BLOCK_N)
    ok = offs < n
    x = tl.load(X + row * n + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * n + offs, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    xhat = (x - mean) * rstd
    tl.store(DX + row * n + offs, ((w * dy - (xhat * c1 + c2)) * rstd).to(DX.dtype.element_ty), mask=ok)
