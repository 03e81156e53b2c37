"""mha's forward: FlashAttention-2's loop, one program per (block of queries, batch, head).

q is (B, T, H, D), k and v (B, S, H, D), row-major; the output is q's shape and the log-sum-exp (B, H, T) in
base 2 of the scaled logits (``m + log2(l)``, as jax's Pallas kernel stores it for its backward pass). Keys are
streamed in blocks with an online softmax in base 2 (``exp2`` of logits times ``sm_scale * log2(e)``); blocks
wholly visible to every query of the program run without masks, and only the causal diagonal, a ragged last
block and segment ids pay for them. Masked logits get `MASK_VALUE` (finite, as Pallas's kernel), so a row whose
keys are all masked in one block never divides zero by zero.
"""

import triton
import triton.language as tl

MASK_VALUE = tl.constexpr(-0.7 * 3.4028234663852886e38)


@triton.jit
def attend(acc, l_i, m_i, q, seg_q, k_base, v_base, seg_base, lo, hi, offs_q, offs_d, row_stride, seq_k,
           qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_K: tl.constexpr,
           DIAGONAL: tl.constexpr, CHECK_K: tl.constexpr, HAS_SEG: tl.constexpr, PRECISION: tl.constexpr):
  """Keys [lo, hi) folded into the running (acc, l_i, m_i); DIAGONAL masks the causal triangle, CHECK_K the
  keys past seq_k, HAS_SEG the keys of other segments."""
  offs_k0 = tl.arange(0, BLOCK_K)
  d_ok = offs_d[None, :] < HEAD_DIM
  for start in range(lo, hi, BLOCK_K):
    offs_k = start + offs_k0
    if CHECK_K:
      kv_mask = (offs_k[:, None] < seq_k) & d_ok
    else:
      kv_mask = d_ok
    kv_offsets = offs_k[:, None] * row_stride + offs_d[None, :]
    if D_PAD == HEAD_DIM and not CHECK_K:
      k = tl.load(k_base + kv_offsets)
    else:
      k = tl.load(k_base + kv_offsets, mask=kv_mask, other=0.0)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if DIAGONAL:
      qk = tl.where(offs_q[:, None] >= offs_k[None, :], qk, MASK_VALUE)
    if CHECK_K:
      qk = tl.where((offs_k < seq_k)[None, :], qk, MASK_VALUE)
    if HAS_SEG:
      seg_k = tl.load(seg_base + offs_k, mask=offs_k < seq_k, other=-1)
      qk = tl.where(seg_q[:, None] == seg_k[None, :], qk, MASK_VALUE)
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if D_PAD == HEAD_DIM and not CHECK_K:
      v = tl.load(v_base + kv_offsets)
    else:
      v = tl.load(v_base + kv_offsets, mask=kv_mask, other=0.0)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    m_i = m_new
  return acc, l_i, m_i


@triton.jit
def forward(Q, K, V, Seg, OUT, LSE, qk_scale, seq_q, seq_k, heads, HAS_SEG: tl.constexpr, CAUSAL: tl.constexpr,
            HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
            PRECISION: tl.constexpr):
  """One block of queries of one (batch, head): grid (cdiv(T, BLOCK_Q), B, H), Pallas's order. The causal
  programs with the most keys start first."""
  if CAUSAL:
    q_block = tl.num_programs(0) - 1 - tl.program_id(0)
  else:
    q_block = tl.program_id(0)
  b = tl.program_id(1).to(tl.int64)
  h = tl.program_id(2)
  row_stride = heads * HEAD_DIM
  q_base = Q + b * seq_q * row_stride + h * HEAD_DIM
  k_base = K + b * seq_k * row_stride + h * HEAD_DIM
  v_base = V + b * seq_k * row_stride + h * HEAD_DIM
  seg_base = Seg + b * seq_k
  q_start = q_block * BLOCK_Q
  offs_q = q_start + tl.arange(0, BLOCK_Q)
  offs_d = tl.arange(0, D_PAD)
  q_ok = offs_q < seq_q
  q_mask = q_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
  q = tl.load(q_base + offs_q[:, None] * row_stride + offs_d[None, :], mask=q_mask, other=0.0)
  if HAS_SEG:
    seg_q = tl.load(seg_base + offs_q, mask=q_ok, other=-2)
  else:
    seg_q = offs_q
  acc = tl.zeros([BLOCK_Q, D_PAD], dtype=tl.float32)
  l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
  m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
  full_k = (seq_k // BLOCK_K) * BLOCK_K
  if CAUSAL:
    # Keys before the block's first query are seen by all its queries; the rest, up to its last, masked.
    open_end = tl.minimum((q_start // BLOCK_K) * BLOCK_K, full_k)
    last = tl.minimum(q_start + BLOCK_Q, seq_k)
    acc, l_i, m_i = attend(acc, l_i, m_i, q, seg_q, k_base, v_base, seg_base, 0, open_end, offs_q, offs_d,
                           row_stride, seq_k, qk_scale, HEAD_DIM, D_PAD, BLOCK_K, False, False, HAS_SEG, PRECISION)
    acc, l_i, m_i = attend(acc, l_i, m_i, q, seg_q, k_base, v_base, seg_base, open_end, last, offs_q, offs_d,
                           row_stride, seq_k, qk_scale, HEAD_DIM, D_PAD, BLOCK_K, True, True, HAS_SEG, PRECISION)
  else:
    acc, l_i, m_i = attend(acc, l_i, m_i, q, seg_q, k_base, v_base, seg_base, 0, full_k, offs_q, offs_d,
                           row_stride, seq_k, qk_scale, HEAD_DIM, D_PAD, BLOCK_K, False, False, HAS_SEG, PRECISION)
    acc, l_i, m_i = attend(acc, l_i, m_i, q, seg_q, k_base, v_base, seg_base, full_k, seq_k, offs_q, offs_d,
                           row_stride, seq_k, qk_scale, HEAD_DIM, D_PAD, BLOCK_K, False, True, HAS_SEG, PRECISION)
  out = acc / l_i[:, None]
  tl.store(OUT + b * seq_q * row_stride + h * HEAD_DIM + offs_q[:, None] * row_stride + offs_d[None, :],
           out.to(OUT.dtype.element_ty), mask=q_mask)
  lse_base = LSE + (b * heads + h) * seq_q
  tl.store(lse_base + offs_q, m_i + tl.math.log2(l_i), mask=q_ok)


@triton.jit(do_not_specialize_on_alignment=["Seg", "LSE"])
def mha_forward_segments(Q, K, V, Seg, OUT, LSE, qk_scale, seq_q, seq_k, heads, CAUSAL: tl.constexpr,
                     HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                     PRECISION: tl.constexpr):
  """`forward` with segment ids (B, S): a query sees the keys of its own segment only."""
  forward(Q, K, V, Seg, OUT, LSE, qk_scale, seq_q, seq_k, heads, True, CAUSAL, HEAD_DIM, D_PAD, BLOCK_Q, BLOCK_K,
          PRECISION)


@triton.jit(do_not_specialize_on_alignment=["LSE"])
def mha_forward_plain(Q, K, V, OUT, LSE, qk_scale, seq_q, seq_k, heads, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                  D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
  """`forward` without segment ids (the segment pointer is never read)."""
  forward(Q, K, V, Q, OUT, LSE, qk_scale, seq_q, seq_k, heads, False, CAUSAL, HEAD_DIM, D_PAD, BLOCK_Q, BLOCK_K,
          PRECISION)
