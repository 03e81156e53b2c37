"""Paged grouped-query decoding attention: jax 0.11's ``jax.experimental.pallas.ops.gpu.paged_attention``
(`paged_attention`, `paged_attention_reference`) with the same names, arguments and results, run by our own
Triton kernels (kernels/paged.py: each split of a sequence's pages its own programs, keys gathered through the
block table; then kernels/decode.py's combine)::

    from jax_mosaic_ffi.ops.gpu import paged_attention   # was: from jax.experimental.pallas.ops.gpu import ...
    out = paged_attention.paged_attention(q, k_pages, v_pages, block_tables, lengths)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.call.launch_values import cdiv
from jax_mosaic_ffi.ops.gpu import calls
from jax_mosaic_ffi.ops.gpu import decode_calls
from jax_mosaic_ffi.ops.gpu.decode_calls import Split
from jax_mosaic_ffi.transforms.sharding import sharded
from jax_mosaic_ffi.transforms.sharding_rules import BatchDims

DEFAULT_MASK_VALUE = -0.7 * float(np.finfo(np.dtype("float32")).max)
# Tuned after Pallas's default (block_h 16, 8 pages per step, 8 warps, 2 stages), as (pages per step, warps,
# stages, block_h): fewer tokens per step pipeline deeper, wider head blocks read each page fewer times. Steps
# of more than _MOST_TOKENS tokens are left out (their key tiles spill registers).
_MORE = [(4, 4, 2, 16), (4, 4, 3, 16), (8, 4, 3, 16), (8, 8, 3, 16), (16, 8, 2, 16), (2, 4, 4, 16),
         (4, 4, 3, 32), (8, 8, 2, 64)]
_MOST_TOKENS = 256


def _split_reference(q, k_pages, v_pages, k_scales, v_scales, tables, lengths, split: Split, soft_cap, mask_value):
  """kernels/paged.py's ``split`` in jax.numpy: the pages gathered into dense keys, then each split's partials."""
  options = dict(split.options)
  b, hq, d = q.shape
  hkv, _, page_size, _ = k_pages.shape
  pages_per_seq = tables.shape[1]
  tokens = pages_per_seq * page_size
  gather = lambda pages: jnp.moveaxis(pages[:, tables], 0, 3).reshape(b, tokens, hkv, *pages.shape[3:])  # noqa: E731
  k, v = gather(k_pages).astype(jnp.float32), gather(v_pages).astype(jnp.float32)
  logits = jnp.einsum("bkgd,bskd->bkgs", q.reshape(b, hkv, hq // hkv, d).astype(jnp.float32), k)
  if options["HAS_K_SCALES"]:
    logits = logits * jnp.swapaxes(gather(k_scales[..., None])[..., 0], 1, 2)[:, :, None, :]
  if options["HAS_V_SCALES"]:
    v = v * gather(v_scales[..., None])
  if options["HAS_CAP"]:
    logits = soft_cap * jnp.tanh(logits / soft_cap)
  valid = jnp.ones((b, tokens), bool)
  if options["HAS_LENGTHS"]:
    positions = jnp.arange(tokens)[None, :]
    logits = jnp.where((positions < lengths[:, None])[:, None, None, :], logits, mask_value)
    valid = positions < ((lengths + page_size - 1) // page_size)[:, None] * page_size
  split_tokens = cdiv(pages_per_seq, split.k_splits) * page_size
  logits = decode_calls.by_splits(logits.reshape(b * hq, tokens), split.k_splits, split_tokens, 1)
  valid = decode_calls.by_splits(jnp.broadcast_to(valid[:, None, :], (b, hq, tokens)).reshape(b * hq, tokens),
                                 split.k_splits, split_tokens, 1)
  v_rows = jnp.repeat(jnp.swapaxes(v, 1, 2), hq // hkv, axis=1).reshape(b * hq, tokens, d)
  return decode_calls.split_partials(logits, valid, decode_calls.by_splits(v_rows, split.k_splits, split_tokens, 1))


@calls.cached
def _split_call(split: Split, page_size: int, head_dim: int, dtype: str, soft_cap: float, mask_value: float):
  constexprs = {"PAGE_SIZE": page_size, "HEAD_DIM": head_dim, "D_PAD": calls.padded(head_dim),
                "PRECISION": calls.precision(dtype)}

  def scalars(meta, q, k_pages, v_pages, k_scales, v_scales, tables, lengths):
    return (calls.i32(k_pages.shape[1]), calls.i32(tables.shape[1]), calls.i32(k_pages.shape[0]),
            calls.i32(q.shape[1] // k_pages.shape[0]), calls.i32(cdiv(tables.shape[1], split.k_splits)),
            calls.f32(soft_cap), calls.f32(mask_value))

  return decode_calls.launch(
      calls.kernels("paged").paged_split, split, constexprs, paged_timing_inputs,
      out_shape=lambda q, *_: decode_calls.partials_out_shape(q.shape[0] * q.shape[1], split.k_splits, head_dim),
      grid=lambda meta, q, k_pages, *_: (cdiv(q.shape[1] // k_pages.shape[0], meta["BLOCK_H"]), split.k_splits,
                                         q.shape[0] * k_pages.shape[0]),
      scalars=scalars,
      fallback=lambda *args: _split_reference(*args, split, soft_cap, mask_value))


@calls.cached
def _paged(split: Split, page_size: int, head_dim: int, dtype: str, soft_cap: float, mask_value: float):
  split_call = _split_call(split, page_size, head_dim, dtype, soft_cap, mask_value)
  combine = decode_calls.combine_call(True, head_dim, split.k_splits, dtype)

  def run(q, k_pages, v_pages, k_scales, v_scales, tables, lengths):
    o, _, _ = combine(*split_call(q, k_pages, v_pages, k_scales, v_scales, tables, lengths))
    return o.reshape(q.shape)

  rule = BatchDims(inputs=(0, None, None, None, None, 0, 0), outputs=0)
  return jax.jit(sharded(run, rule, name="paged_attention"))


def paged_timing_inputs(rng, q, k_pages, v_pages, k_scales, v_scales, tables, lengths):
  """What paged_split's configs are timed on: every sequence full (its length all its pages), its block table
  distinct pages scattered over the pool (as an allocator leaves them), int8 pages as int8 data, scales near 1;
  random small ints would make every length 0 to 3 tokens and every table one of four pages."""
  batch, per_seq = tables.shape
  total, page_size = k_pages.shape[1], k_pages.shape[2]
  pages = (rng.permutation(total)[:batch * per_seq] if total >= batch * per_seq
           else rng.integers(0, total, batch * per_seq))
  page_data = lambda a: (rng.integers(-127, 128, a.shape).astype(a.dtype) if np.dtype(a.dtype).kind == "i"  # noqa: E731
                         else decode_calls.normal(rng, a))
  scale = lambda a: rng.uniform(0.5, 1.5, a.shape).astype(a.dtype)  # noqa: E731
  return [decode_calls.normal(rng, q), page_data(k_pages), page_data(v_pages), scale(k_scales), scale(v_scales),
          pages.reshape(batch, per_seq).astype(np.int32), np.full(lengths.shape, per_seq * page_size, np.int32)]


def _config(block_h, pages_per_compute_block, page_size, num_warps, num_stages, pages_per_split) -> dict:
  pages = max(1, min(pages_per_compute_block, pages_per_split))
  return calls.config(num_warps, num_stages, BLOCK_H=block_h, PAGES_PER_BLOCK=pages,
                      BLOCK_T=calls.padded(pages * page_size))


def _configs(block_h, pages_per_compute_block, page_size, num_warps, num_stages, pages_per_split, group) -> list:
  """The given config first; at Pallas's defaults, `_MORE` after it (autotuned on `paged_timing_inputs`)."""
  most_h = calls.padded(group)
  configs = [_config(min(block_h, most_h), pages_per_compute_block, page_size, num_warps, num_stages,
                     pages_per_split)]
  if (block_h, pages_per_compute_block, num_warps, num_stages) == (16, 8, 8, 2):
    configs += [_config(min(h, most_h), pages, page_size, warps, stages, pages_per_split)
                for pages, warps, stages, h in _MORE if pages * page_size <= _MOST_TOKENS]
  return calls.clamp_configs(configs, {})


def paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, block_tables: jax.Array,
                    lengths: jax.Array | None, k_scales_pages: jax.Array | None = None,
                    v_scales_pages: jax.Array | None = None, *, block_h: int = 16, pages_per_compute_block: int = 8,
                    k_splits: int = 16, num_warps: int = 8, num_stages: int = 2, interpret: bool = False,
                    debug: bool = False, mask_value: float = DEFAULT_MASK_VALUE,
                    attn_logits_soft_cap: float | None = None) -> jax.Array:
  """Paged grouped-query attention (no softmax scale, as Pallas's), jax 0.11's Pallas ``paged_attention``
  argument for argument.

  Args:
    q: (batch_size, num_heads, head_dim).
    k_pages, v_pages: (num_kv_heads, total_num_pages, page_size, head_dim); int8 with scales, or q's dtype.
    block_tables: int32 (batch_size, pages_per_sequence), each entry a page in [0, total_num_pages).
    lengths: int32 (batch_size,): each sequence's length (tokens past it are masked), or None.
    k_scales_pages, v_scales_pages: (num_kv_heads, total_num_pages, page_size) per-token scales, or None.
    block_h: query heads per program, a multiple of 16.
    pages_per_compute_block: pages per step of a program's loop.
    k_splits: splits of each sequence's pages, each attended by its own programs, then merged (any
      pages_per_sequence: Pallas needed multiples).
    num_warps, num_stages: the split kernel's launch. Left at Pallas's defaults (with block_h and
      pages_per_compute_block at theirs), pages per step, warps, stages and head blocks are autotuned on the GPU,
      Pallas's first, timed on full sequences over scattered pages (`paged_timing_inputs`); otherwise used as
      given.
    interpret, debug: Pallas's interpreter and debug printing: accepted and ignored.
    mask_value: the logit of tokens past a sequence's length.
    attn_logits_soft_cap: when given, logits become ``cap * tanh(logits / cap)``.

  Returns:
    (batch_size, num_heads, head_dim) in q's dtype. Without a GPU the reference math runs::

    >>> from jax_mosaic_ffi.ops.gpu import paged_attention as pa
    >>> q, pages = jnp.ones((2, 16, 64), jnp.float16), jnp.ones((4, 32, 16, 64), jnp.float16)
    >>> tables = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
    >>> pa.paged_attention(q, pages, pages, tables, jnp.array([100, 37], jnp.int32), k_splits=4).shape
    (2, 16, 64)
  """
  del interpret, debug
  batch_size, num_heads, head_dim = q.shape
  num_kv_heads, _, page_size, head_dim_k = k_pages.shape
  if k_pages.shape != v_pages.shape:
    raise ValueError(f"k_pages and v_pages must have the same shape. Got {k_pages.shape} and {v_pages.shape}")
  if num_heads % num_kv_heads != 0:
    raise ValueError("Number of Q heads must be divisible by number of KV heads. Got "
                     f"{num_heads} and {num_kv_heads}.")
  if head_dim_k != head_dim:
    raise ValueError(f"head_dim of Q must be the same as that of K/V. Got {head_dim} and {head_dim_k}.")
  if block_tables.shape[0] != batch_size:
    raise ValueError("`block_tables` and `q` must have the same batch size")
  if lengths is not None:
    if lengths.shape != (batch_size,):
      raise ValueError("`lengths` and `q` must have the same batch size")
    if lengths.dtype != jnp.int32:
      raise ValueError(f"The dtype of `lengths` must be int32. Got {lengths.dtype}")
  if block_h % 16 or block_h & (block_h - 1):
    raise ValueError(f"block_h must divisible by 16 (and a power of two), but is {block_h}.")
  for name, scales in (("k_scales_pages", k_scales_pages), ("v_scales_pages", v_scales_pages)):
    if scales is not None and scales.shape != k_pages.shape[:3]:
      raise ValueError(f"paged_attention: {name} must be (num_kv_heads, total_num_pages, page_size) = "
                       f"{k_pages.shape[:3]}, got {scales.shape}")
  for name, pages, scales in (("k_pages", k_pages, k_scales_pages), ("v_pages", v_pages, v_scales_pages)):
    if scales is None and pages.dtype != q.dtype:
      raise ValueError(f"paged_attention: {name} must be q's dtype ({q.dtype}) unless it comes with its scales "
                       f"(int8 pages); got {pages.dtype}")
  if not isinstance(k_splits, int) or k_splits < 1:
    raise ValueError(f"paged_attention: k_splits must be a positive int, got {k_splits!r}")
  pages_per_split = cdiv(block_tables.shape[1], k_splits)
  configs = _configs(block_h, pages_per_compute_block, page_size, num_warps, num_stages, pages_per_split,
                     num_heads // num_kv_heads)
  options = (("HAS_CAP", attn_logits_soft_cap is not None), ("HAS_K_SCALES", k_scales_pages is not None),
             ("HAS_LENGTHS", lengths is not None), ("HAS_V_SCALES", v_scales_pages is not None))
  split = Split(decode_calls.frozen(configs), k_splits, options)
  none = jnp.zeros((1,), jnp.float32)
  fn = _paged(split, page_size, head_dim, str(jnp.dtype(q.dtype)), float(attn_logits_soft_cap or 0.0),
              float(mask_value))
  return fn(q, k_pages, v_pages, none if k_scales_pages is None else k_scales_pages,
            none if v_scales_pages is None else v_scales_pages, block_tables.astype(jnp.int32),
            jnp.zeros((batch_size,), jnp.int32) if lengths is None else lengths)


@functools.partial(jax.jit, static_argnames=["mask_value", "attn_logits_soft_cap"])
def paged_attention_reference(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array, *,
                              mask_value: float = DEFAULT_MASK_VALUE,
                              attn_logits_soft_cap: float | None = None) -> jax.Array:
  """Grouped-query attention over dense keys in jax.numpy, as jax 0.11's Pallas ``paged_attention_reference``:
  q (batch_size, num_heads, head_dim), k and v (batch_size, kv_seq_len, num_kv_heads, head_dim), lengths
  int32 (batch_size,) or None.

    >>> from jax_mosaic_ffi.ops.gpu import paged_attention as pa
    >>> kv = jnp.ones((2, 64, 2, 16))
    >>> pa.paged_attention_reference(jnp.ones((2, 4, 16)), kv, kv, jnp.array([10, 64], jnp.int32)).shape
    (2, 4, 16)
  """
  batch_size, num_heads, head_dim = q.shape
  _, kv_seq_len, num_kv_heads, _ = k.shape
  q_grouped = q.reshape(batch_size, num_kv_heads, num_heads // num_kv_heads, head_dim)
  logits = jnp.einsum("bkgd,bksd->bkgs", q_grouped, jnp.swapaxes(k, 1, 2),
                      preferred_element_type=jnp.float32).astype(jnp.float32)
  if attn_logits_soft_cap is not None:
    logits = jnp.tanh(logits / attn_logits_soft_cap) * attn_logits_soft_cap
  if lengths is not None:
    mask = jnp.broadcast_to((jnp.arange(kv_seq_len)[None, :] < lengths[:, None])[:, None, None, :], logits.shape)
    logits = jnp.where(mask, logits, mask_value)
  weights = jax.nn.softmax(logits, axis=-1)
  o = jnp.einsum("bkgs,bksd->bkgd", weights, jnp.swapaxes(v, 1, 2).astype(jnp.float32),
                 preferred_element_type=jnp.float32).astype(q.dtype)
  return o.reshape(q.shape)
