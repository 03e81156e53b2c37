"""mha's backward, FlashAttention-2's way, in three kernels and no atomics:

- `delta`: per query row, ``rowsum(o * do) - log2(e) * dlse`` (the lse's own cotangent folded in, so that a
  caller who uses the returned residuals gets their gradient too);
- `dkdv`: one program per block of keys, walking the queries that see them: ``dv += p^T do`` and
  ``dk += ds^T q``;
- `dq`: one program per block of queries, walking the keys they see: ``dq += ds k``.

``p = exp2(qk * sm_scale * log2(e) - lse)`` is recomputed from the forward's base-2 log-sum-exp and
``ds = p * (dp - delta)``, ``dp = do v^T``. Layouts as the forward's: q, o, do (B, T, H, D); k, v (B, S, H, D);
lse, delta, dlse (B, H, T) float32.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit(do_not_specialize_on_alignment=["DLSE", "DELTA"])
def mha_delta(OUT, DO, DLSE, DELTA, seq_q, heads, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr):
  """grid (cdiv(T, BLOCK_Q), B, H)."""
  b = tl.program_id(1).to(tl.int64)
  h = tl.program_id(2)
  row_stride = heads * HEAD_DIM
  offs_q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
  offs_d = tl.arange(0, D_PAD)
  mask = (offs_q < seq_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
  offsets = b * seq_q * row_stride + h * HEAD_DIM + offs_q[:, None] * row_stride + offs_d[None, :]
  o = tl.load(OUT + offsets, mask=mask, other=0.0).to(tl.float32)
  do = tl.load(DO + offsets, mask=mask, other=0.0).to(tl.float32)
  rows = (b * heads + h) * seq_q + offs_q
  dlse = tl.load(DLSE + rows, mask=offs_q < seq_q, other=0.0)
  tl.store(DELTA + rows, tl.sum(o * do, 1) - LOG2E * dlse, mask=offs_q < seq_q)


@triton.jit
def dkdv_step(dk, dv, k, v, seg_k, q_base, do_base, lse_base, delta_base, seg_base, lo, hi, offs_k, offs_d,
              row_stride, seq_q, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, DIAGONAL: tl.constexpr,
              CHECK_Q: tl.constexpr, HAS_SEG: tl.constexpr, PRECISION: tl.constexpr):
  """Queries [lo, hi) folded into this block of keys' dk, dv (transposed: keys are the rows)."""
  offs_q0 = tl.arange(0, BLOCK_Q)
  d_ok = offs_d[None, :] < HEAD_DIM
  for start in range(lo, hi, BLOCK_Q):
    offs_q = start + offs_q0
    q_ok = offs_q < seq_q
    qd_mask = q_ok[:, None] & d_ok
    offsets = offs_q[:, None] * row_stride + offs_d[None, :]
    q = tl.load(q_base + offsets, mask=qd_mask, other=0.0)
    lse = tl.load(lse_base + offs_q, mask=q_ok, other=0.0)
    qk_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale
    p_t = tl.math.exp2(qk_t - lse[None, :])
    if DIAGONAL:
      p_t = tl.where(offs_q[None, :] >= offs_k[:, None], p_t, 0.0)
    if CHECK_Q:
      p_t = tl.where(q_ok[None, :], p_t, 0.0)
    if HAS_SEG:
      seg_q = tl.load(seg_base + offs_q, mask=q_ok, other=-2)
      p_t = tl.where(seg_k[:, None] == seg_q[None, :], p_t, 0.0)
    do = tl.load(do_base + offsets, mask=qd_mask, other=0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
    dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    dlt = tl.load(delta_base + offs_q, mask=q_ok, other=0.0)
    ds_t = p_t * (dp_t - dlt[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
  return dk, dv


@triton.jit
def dkdv(Q, K, V, Seg, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, seq_q, seq_k, heads, HAS_SEG: tl.constexpr,
         CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
         BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
  """grid (cdiv(S, BLOCK_K), B, H)."""
  b = tl.program_id(1).to(tl.int64)
  h = tl.program_id(2)
  row_stride = heads * HEAD_DIM
  k_start = tl.program_id(0) * BLOCK_K
  offs_k = k_start + tl.arange(0, BLOCK_K)
  offs_d = tl.arange(0, D_PAD)
  k_ok = offs_k < seq_k
  kd_mask = k_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
  kv_offsets = b * seq_k * row_stride + h * HEAD_DIM + offs_k[:, None] * row_stride + offs_d[None, :]
  k = tl.load(K + kv_offsets, mask=kd_mask, other=0.0)
  v = tl.load(V + kv_offsets, mask=kd_mask, other=0.0)
  seg_base = Seg + b * seq_k
  if HAS_SEG:
    seg_k = tl.load(seg_base + offs_k, mask=k_ok, other=-1)
  else:
    seg_k = offs_k
  q_base = Q + b * seq_q * row_stride + h * HEAD_DIM
  do_base = DO + b * seq_q * row_stride + h * HEAD_DIM
  lse_base = LSE + (b * heads + h) * seq_q
  delta_base = DELTA + (b * heads + h) * seq_q
  dk = tl.zeros([BLOCK_K, D_PAD], dtype=tl.float32)
  dv = tl.zeros([BLOCK_K, D_PAD], dtype=tl.float32)
  full_q = (seq_q // BLOCK_Q) * BLOCK_Q
  if CAUSAL:
    # Queries from the block's first key on see some of its keys; past its last key they see them all.
    lo = (k_start // BLOCK_Q) * BLOCK_Q
    diagonal_end = tl.minimum(tl.cdiv(k_start + BLOCK_K, BLOCK_Q) * BLOCK_Q, seq_q)
    dk, dv = dkdv_step(dk, dv, k, v, seg_k, q_base, do_base, lse_base, delta_base, seg_base, lo, diagonal_end,
                       offs_k, offs_d, row_stride, seq_q, qk_scale, HEAD_DIM, BLOCK_Q, True, True, HAS_SEG,
                       PRECISION)
    open_start = diagonal_end
  else:
    open_start = 0
  dk, dv = dkdv_step(dk, dv, k, v, seg_k, q_base, do_base, lse_base, delta_base, seg_base, open_start, full_q,
                     offs_k, offs_d, row_stride, seq_q, qk_scale, HEAD_DIM, BLOCK_Q, False, False, HAS_SEG,
                     PRECISION)
  tail = tl.maximum(full_q, open_start)
  dk, dv = dkdv_step(dk, dv, k, v, seg_k, q_base, do_base, lse_base, delta_base, seg_base, tail, seq_q,
                     offs_k, offs_d, row_stride, seq_q, qk_scale, HEAD_DIM, BLOCK_Q, False, True, HAS_SEG,
                     PRECISION)
  tl.store(DK + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty), mask=kd_mask)
  tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=kd_mask)


@triton.jit
def dq_step(dq, q, do, lse, dlt, seg_q, k_base, v_base, seg_base, lo, hi, offs_q, offs_d, row_stride, seq_k,
            qk_scale, HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, DIAGONAL: tl.constexpr, CHECK_K: tl.constexpr,
            HAS_SEG: tl.constexpr, PRECISION: tl.constexpr):
  """Keys [lo, hi) folded into this block of queries' dq."""
  offs_k0 = tl.arange(0, BLOCK_K)
  d_ok = offs_d[None, :] < HEAD_DIM
  for start in range(lo, hi, BLOCK_K):
    offs_k = start + offs_k0
    k_ok = offs_k < seq_k
    kd_mask = k_ok[:, None] & d_ok
    offsets = offs_k[:, None] * row_stride + offs_d[None, :]
    k = tl.load(k_base + offsets, mask=kd_mask, other=0.0)
    v = tl.load(v_base + offsets, mask=kd_mask, other=0.0)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    p = tl.math.exp2(qk - lse[:, None])
    if DIAGONAL:
      p = tl.where(offs_q[:, None] >= offs_k[None, :], p, 0.0)
    if CHECK_K:
      p = tl.where(k_ok[None, :], p, 0.0)
    if HAS_SEG:
      seg_k = tl.load(seg_base + offs_k, mask=k_ok, other=-1)
      p = tl.where(seg_q[:, None] == seg_k[None, :], p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    ds = p * (dp - dlt[:, None])
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
  return dq


@triton.jit
def dq(Q, K, V, Seg, DO, LSE, DELTA, DQ, qk_scale, sm_scale, seq_q, seq_k, heads, HAS_SEG: tl.constexpr,
       CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
       BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
  """grid (cdiv(T, BLOCK_Q), B, H)."""
  b = tl.program_id(1).to(tl.int64)
  h = tl.program_id(2)
  row_stride = heads * HEAD_DIM
  q_start = tl.program_id(0) * BLOCK_Q
  offs_q = q_start + tl.arange(0, BLOCK_Q)
  offs_d = tl.arange(0, D_PAD)
  q_ok = offs_q < seq_q
  qd_mask = q_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
  q_offsets = b * seq_q * row_stride + h * HEAD_DIM + offs_q[:, None] * row_stride + offs_d[None, :]
  q = tl.load(Q + q_offsets, mask=qd_mask, other=0.0)
  do = tl.load(DO + q_offsets, mask=qd_mask, other=0.0)
  rows = (b * heads + h) * seq_q + offs_q
  lse = tl.load(LSE + rows, mask=q_ok, other=0.0)
  dlt = tl.load(DELTA + rows, mask=q_ok, other=0.0)
  seg_base = Seg + b * seq_k
  if HAS_SEG:
    seg_q = tl.load(seg_base + offs_q, mask=q_ok, other=-2)
  else:
    seg_q = offs_q
  k_base = K + b * seq_k * row_stride + h * HEAD_DIM
  v_base = V + b * seq_k * row_stride + h * HEAD_DIM
  acc = tl.zeros([BLOCK_Q, D_PAD], dtype=tl.float32)
  full_k = (seq_k // BLOCK_K) * BLOCK_K
  if CAUSAL:
    open_end = tl.minimum((q_start // BLOCK_K) * BLOCK_K, full_k)
    acc = dq_step(acc, q, do, lse, dlt, seg_q, k_base, v_base, seg_base, 0, open_end, offs_q, offs_d, row_stride,
                  seq_k, qk_scale, HEAD_DIM, BLOCK_K, False, False, HAS_SEG, PRECISION)
    acc = dq_step(acc, q, do, lse, dlt, seg_q, k_base, v_base, seg_base, open_end,
                  tl.minimum(q_start + BLOCK_Q, seq_k), offs_q, offs_d, row_stride, seq_k, qk_scale, HEAD_DIM,
                  BLOCK_K, True, True, HAS_SEG, PRECISION)
  else:
    acc = dq_step(acc, q, do, lse, dlt, seg_q, k_base, v_base, seg_base, 0, full_k, offs_q, offs_d, row_stride,
                  seq_k, qk_scale, HEAD_DIM, BLOCK_K, False, False, HAS_SEG, PRECISION)
    acc = dq_step(acc, q, do, lse, dlt, seg_q, k_base, v_base, seg_base, full_k, seq_k, offs_q, offs_d,
                  row_stride, seq_k, qk_scale, HEAD_DIM, BLOCK_K, False, True, HAS_SEG, PRECISION)
  tl.store(DQ + q_offsets, (acc * sm_scale).to(DQ.dtype.element_ty), mask=qd_mask)


@triton.jit(do_not_specialize_on_alignment=["Seg", "LSE", "DELTA"])
def mha_dkdv_segments(Q, K, V, Seg, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, seq_q, seq_k, heads,
                  CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
  dkdv(Q, K, V, Seg, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, seq_q, seq_k, heads, True, CAUSAL, HEAD_DIM,
       D_PAD, BLOCK_Q, BLOCK_K, PRECISION)


@triton.jit(do_not_specialize_on_alignment=["LSE", "DELTA"])
def mha_dkdv_plain(Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, seq_q, seq_k, heads, CAUSAL: tl.constexpr,
               HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
               PRECISION: tl.constexpr):
  dkdv(Q, K, V, Q, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale, seq_q, seq_k, heads, False, CAUSAL, HEAD_DIM,
       D_PAD, BLOCK_Q, BLOCK_K, PRECISION)


@triton.jit(do_not_specialize_on_alignment=["Seg", "LSE", "DELTA"])
def mha_dq_segments(Q, K, V, Seg, DO, LSE, DELTA, DQ, qk_scale, sm_scale, seq_q, seq_k, heads, CAUSAL: tl.constexpr,
                HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                PRECISION: tl.constexpr):
  dq(Q, K, V, Seg, DO, LSE, DELTA, DQ, qk_scale, sm_scale, seq_q, seq_k, heads, True, CAUSAL, HEAD_DIM, D_PAD,
     BLOCK_Q, BLOCK_K, PRECISION)


@triton.jit(do_not_specialize_on_alignment=["LSE", "DELTA"])
def mha_dq_plain(Q, K, V, DO, LSE, DELTA, DQ, qk_scale, sm_scale, seq_q, seq_k, heads, CAUSAL: tl.constexpr,
             HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
             PRECISION: tl.constexpr):
  dq(Q, K, V, Q, DO, LSE, DELTA, DQ, qk_scale, sm_scale, seq_q, seq_k, heads, False, CAUSAL, HEAD_DIM, D_PAD,
     BLOCK_Q, BLOCK_K, PRECISION)
