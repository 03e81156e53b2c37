"""Paged decoding attention: `decode.decode_split`'s loop over keys gathered page by page through each sequence's block
table, with Pallas's options (int8 pages with per-token scales, a logits soft cap, the mask value); the splits
are merged by `decode.decode_combine`.

q is (B, Hq, D); k_pages and v_pages (Hkv, P, PAGE_SIZE, D); their scales (Hkv, P, PAGE_SIZE); block_tables
(B, pages_per_sequence) int32; lengths (B,) int32. No softmax scale, as Pallas's kernel. Tokens of the split's
pages at or past the length get ``mask_value`` (Pallas's), pages past the split's none.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
EMPTY = tl.constexpr(-3.4028234663852886e38)


@triton.jit(do_not_specialize_on_alignment=["KS", "VS", "TABLES", "LENGTHS", "L_PART", "M_PART"])
def paged_split(Q, KP, VP, KS, VS, TABLES, LENGTHS, O_PART, L_PART, M_PART, total_pages, pages_per_seq, kv_heads, group,
          pages_per_split, soft_cap, mask_value, HAS_K_SCALES: tl.constexpr, HAS_V_SCALES: tl.constexpr,
          HAS_LENGTHS: tl.constexpr, HAS_CAP: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGES_PER_BLOCK: tl.constexpr,
          BLOCK_T: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
          PRECISION: tl.constexpr):
  """grid (cdiv(G, BLOCK_H), SPLITS, B * Hkv); BLOCK_T = next power of two of PAGES_PER_BLOCK * PAGE_SIZE."""
  h_block = tl.program_id(0)
  s = tl.program_id(1)
  splits = tl.num_programs(1)
  bk = tl.program_id(2)
  b = bk // kv_heads
  kvh = bk % kv_heads
  offs_h = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
  offs_d = tl.arange(0, D_PAD)
  h_ok = offs_h < group
  d_ok = offs_d < HEAD_DIM
  rows = b.to(tl.int64) * kv_heads * group + kvh * group + offs_h
  q = tl.load(Q + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
  page_lo = s * pages_per_split
  page_hi = tl.minimum(page_lo + pages_per_split, pages_per_seq)
  if HAS_LENGTHS:
    length = tl.load(LENGTHS + b)
    page_hi = tl.minimum(page_hi, tl.cdiv(length, PAGE_SIZE))
  head_pages = KP + kvh.to(tl.int64) * total_pages * PAGE_SIZE * HEAD_DIM
  head_v_pages = VP + kvh.to(tl.int64) * total_pages * PAGE_SIZE * HEAD_DIM
  table = TABLES + b.to(tl.int64) * pages_per_seq
  offs_t = tl.arange(0, BLOCK_T)
  page_of_t = offs_t // PAGE_SIZE
  in_page = offs_t % PAGE_SIZE
  acc = tl.zeros([BLOCK_H, D_PAD], dtype=tl.float32)
  l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
  m_i = tl.full([BLOCK_H], EMPTY, dtype=tl.float32)
  for first_page in range(page_lo, page_hi, PAGES_PER_BLOCK):
    t_ok = (page_of_t < PAGES_PER_BLOCK) & (first_page + page_of_t < page_hi)
    page = tl.load(table + first_page + page_of_t, mask=t_ok, other=0).to(tl.int64)
    token_row = page * PAGE_SIZE + in_page
    kv_mask = t_ok[:, None] & d_ok[None, :]
    offsets = token_row[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(head_pages + offsets, mask=kv_mask, other=0.0)
    if HAS_K_SCALES:
      k = k.to(Q.dtype.element_ty)
    logits = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if HAS_K_SCALES:
      k_scale = tl.load(KS + kvh.to(tl.int64) * total_pages * PAGE_SIZE + token_row, mask=t_ok, other=0.0)
      logits = logits * k_scale.to(tl.float32)[None, :]
    if HAS_CAP:
      logits = soft_cap * (2.0 * tl.sigmoid(2.0 * logits / soft_cap) - 1.0)  # soft_cap * tanh(logits / soft_cap)
    if HAS_LENGTHS:
      token = first_page * PAGE_SIZE + offs_t
      logits = tl.where((token < length)[None, :], logits, mask_value)
    logits = tl.where(t_ok[None, :], logits, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, 1))
    alpha = tl.math.exp2((m_i - m_new) * LOG2E)
    p = tl.math.exp2((logits - m_new[:, None]) * LOG2E)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(head_v_pages + offsets, mask=kv_mask, other=0.0)
    if HAS_V_SCALES:
      v_scale = tl.load(VS + kvh.to(tl.int64) * total_pages * PAGE_SIZE + token_row, mask=t_ok, other=0.0)
      p_v = (p * v_scale.to(tl.float32)[None, :]).to(Q.dtype.element_ty)
      v = v.to(Q.dtype.element_ty)
    else:
      p_v = p.to(v.dtype)
    acc = tl.dot(p_v, v, acc * alpha[:, None], input_precision=PRECISION)
    m_i = m_new
  part = rows * splits + s
  tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=h_ok[:, None] & d_ok[None, :])
  tl.store(L_PART + part, l_i, mask=h_ok)
  tl.store(M_PART + part, m_i, mask=h_ok)
