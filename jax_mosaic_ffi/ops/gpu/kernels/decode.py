"""Decoding attention (one query per head) split along the keys: `split` attends one split of the keys for a
block of query heads that share a key/value head, writing its unnormalized output and its softmax statistics
(max and sum, natural units of the scaled logits, as Pallas's residuals); `decode_combine` merges the splits.

q is (B, Hq, D); k and v (B, S, Hkv, D) (mqa: Hkv = 1); Hq = Hkv * G. The partials are (B * Hq, SPLITS, D),
(B * Hq, SPLITS) float32. A split with no key to attend (past the length, before the start) writes l = 0 and
m = `EMPTY`, which `decode_combine` weighs by zero; a row without any key gives 0, as Pallas's kernel.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
EMPTY = tl.constexpr(-3.4028234663852886e38)


@triton.jit(do_not_specialize_on_alignment=["START", "LENGTH", "L_PART", "M_PART"])
def decode_split(Q, K, V, START, LENGTH, O_PART, L_PART, M_PART, qk_scale, seq_k, kv_heads, group, split_len,
          HAS_START: tl.constexpr, HAS_LENGTH: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
          BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
  """grid (cdiv(G, BLOCK_H), SPLITS, B * Hkv). ``qk_scale`` is sm_scale * log2(e)."""
  h_block = tl.program_id(0)
  s = tl.program_id(1)
  splits = tl.num_programs(1)
  bk = tl.program_id(2)
  b = bk // kv_heads
  kvh = bk % kv_heads
  q_heads = kv_heads * group
  offs_h = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
  offs_d = tl.arange(0, D_PAD)
  h_ok = offs_h < group
  d_ok = offs_d < HEAD_DIM
  rows = b.to(tl.int64) * q_heads + kvh * group + offs_h  # rows of q, and of the partials
  q = tl.load(Q + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
  row_stride = kv_heads * HEAD_DIM
  k_base = K + b.to(tl.int64) * seq_k * row_stride + kvh * HEAD_DIM
  v_base = V + b.to(tl.int64) * seq_k * row_stride + kvh * HEAD_DIM
  lo = s * split_len
  hi = tl.minimum(lo + split_len, seq_k)
  first = 0
  last = seq_k
  if HAS_START:
    first = tl.load(START + b)
  if HAS_LENGTH:
    last = tl.load(LENGTH + b)
  # Only the keys of this split inside [start, length) count (Pallas's additive mask weighs the others by an
  # exact zero); blocks wholly outside are not visited.
  begin = tl.maximum(lo, first)
  end = tl.minimum(hi, last)
  acc = tl.zeros([BLOCK_H, D_PAD], dtype=tl.float32)
  l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
  m_i = tl.full([BLOCK_H], EMPTY, dtype=tl.float32)
  if begin < end:
    offs_k0 = tl.arange(0, BLOCK_K)
    for start in range(lo + ((begin - lo) // BLOCK_K) * BLOCK_K, end, BLOCK_K):
      offs_k = start + offs_k0
      k_ok = (offs_k >= begin) & (offs_k < end)
      kv_mask = k_ok[:, None] & d_ok[None, :]
      offsets = offs_k[:, None] * row_stride + offs_d[None, :]
      k = tl.load(k_base + offsets, mask=kv_mask, other=0.0)
      qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
      qk = tl.where(k_ok[None, :], qk, float("-inf"))
      m_new = tl.maximum(m_i, tl.max(qk, 1))
      alpha = tl.math.exp2(m_i - m_new)
      p = tl.math.exp2(qk - m_new[:, None])
      l_i = l_i * alpha + tl.sum(p, 1)
      v = tl.load(v_base + offsets, mask=kv_mask, other=0.0)
      acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
      m_i = m_new
    m_i = m_i * LN2
  part = rows * splits + s
  tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=h_ok[:, None] & d_ok[None, :])
  tl.store(L_PART + part, l_i, mask=h_ok)
  tl.store(M_PART + part, m_i, mask=h_ok)


@triton.jit(do_not_specialize_on_alignment=["L_PART", "M_PART", "L", "M"])
def decode_combine(O_PART, L_PART, M_PART, OUT, L, M, splits, NORMALIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
            D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr):
  """grid (B * Hq,): one row's splits merged; o divided by l + eps where NORMALIZE (Pallas's eps)."""
  row = tl.program_id(0).to(tl.int64)
  offs_s = tl.arange(0, SPLITS_PAD)
  offs_d = tl.arange(0, D_PAD)
  s_ok = offs_s < splits
  m = tl.load(M_PART + row * splits + offs_s, mask=s_ok, other=EMPTY)
  sums = tl.load(L_PART + row * splits + offs_s, mask=s_ok, other=0.0)
  mask = s_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
  o = tl.load(O_PART + (row * splits + offs_s)[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0)
  m_max = tl.max(m, 0)
  weight = tl.exp(m - m_max)
  l_sum = tl.sum(sums * weight, 0)
  out = tl.sum(o * weight[:, None], 0)
  if NORMALIZE:
    out = out / (l_sum + 1.1920928955078125e-07)
  tl.store(OUT + row * HEAD_DIM + offs_d, out.to(OUT.dtype.element_ty), mask=offs_d < HEAD_DIM)
  tl.store(L + row, l_sum)
  tl.store(M + row, m_max)
