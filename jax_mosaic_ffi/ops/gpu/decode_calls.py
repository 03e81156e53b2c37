"""The split-K decoding calls shared by `decode_attention` and `paged_attention`: each split's partial output
and softmax statistics (kernels/decode.py's ``split``, kernels/paged.py's), then ``combine``; and the
jax.numpy fallbacks of each, which compute the very partials the kernels write (so `jmf.check` compares them).

Partials: o (B * Hq, SPLITS, D), l and m (B * Hq, SPLITS) float32, natural units of the (scaled) logits; a split
with no key has l = 0 and m = `EMPTY`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.api import mosaic_kernel
from jax_mosaic_ffi.call.launch_values import cdiv
from jax_mosaic_ffi.ops.gpu import calls
from jax_mosaic_ffi.triton.kernel import triton_kernel

EMPTY = -float(np.finfo(np.float32).max)
EPS = float(np.finfo(np.float32).eps)


class Split(NamedTuple):
  """What fixes a decoding split call besides shapes."""
  configs: tuple       # of sorted (name, value) pairs: BLOCK_H, BLOCK_K (or PAGES_PER_BLOCK), warps, stages
  k_splits: int
  options: tuple = ()  # the kernel's other constexprs, sorted pairs


def frozen(configs) -> tuple:
  return tuple(tuple(sorted(c.items())) for c in configs)


def partials_out_shape(rows: int, splits: int, head_dim: int):
  return (jax.ShapeDtypeStruct((rows, splits, head_dim), jnp.float32),
          jax.ShapeDtypeStruct((rows, splits), jnp.float32), jax.ShapeDtypeStruct((rows, splits), jnp.float32))


def launch(fn, split: Split, constexprs: dict, timing_inputs, **options):
  """mosaic_kernel of a split kernel: one config fixed, several autotuned on ``timing_inputs(rng, *avals)``
  (lengths and block tables that make the kernel do its whole work, not random small integers)."""
  configs = [dict(c) for c in split.configs]
  constexprs = {**constexprs, **dict(split.options)}
  if len(configs) == 1:
    fixed = configs[0]
    warps, stages = fixed.pop("num_warps"), fixed.pop("num_stages")
    return mosaic_kernel(triton_kernel(fn, num_warps=warps, num_stages=stages, constexprs={**constexprs, **fixed}),
                         **options)
  return mosaic_kernel(triton_kernel(fn, constexprs=constexprs), configs=configs, autotune_inputs=timing_inputs,
                       **options)


def normal(rng, aval):
  """Normal floats of ``aval`` (a timing input)."""
  return rng.standard_normal(aval.shape, dtype=np.float32).astype(aval.dtype)


def decode_timing_inputs(rng, q, k, v, start, length):
  """What decode_split's configs are timed on: normal q, k and v, every key attended (start 0, length S), as a
  full cache is; random small lengths would time a split that reads almost nothing."""
  return [normal(rng, q), normal(rng, k), normal(rng, v), np.zeros(start.shape, np.int32),
          np.full(length.shape, k.shape[1], np.int32)]


def split_partials(logits, valid, v_rows):
  """Each split's (o, l, m) from logits (R, SPLITS, L) float32, valid (R or 1, SPLITS, L) and the values
  (R, SPLITS, L, D): what a split kernel writes."""
  masked = jnp.where(valid, logits, -jnp.inf)
  m = jnp.max(masked, axis=-1)
  some = jnp.any(jnp.broadcast_to(valid, logits.shape), axis=-1)
  m = jnp.where(some, m, EMPTY)
  p = jnp.where(valid, jnp.exp(logits - m[..., None]), 0.0)
  o = jnp.einsum("rsl,rsld->rsd", p, v_rows.astype(jnp.float32))
  return o, jnp.sum(p, axis=-1), m


def by_splits(x, splits: int, split_len: int, axis: int):
  """x with its ``axis`` (keys) padded to splits * split_len and split in two: (..., SPLITS, split_len, ...)."""
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, splits * split_len - x.shape[axis])
  x = jnp.pad(x, pad)
  return x.reshape(x.shape[:axis] + (splits, split_len) + x.shape[axis + 1:])


def combine_reference(o_part, l_part, m_part, normalize: bool, dtype):
  m = jnp.max(m_part, axis=1)
  weight = jnp.exp(m_part - m[:, None])
  sums = jnp.sum(l_part * weight, axis=1)
  o = jnp.sum(o_part * weight[..., None], axis=1)
  if normalize:
    o = o / (sums[:, None] + EPS)
  return o.astype(dtype), sums, m


@calls.cached
def combine_call(normalize: bool, head_dim: int, splits: int, dtype: str):
  """(o_part, l_part, m_part) -> (o (B * Hq, D) in ``dtype``, l, m)."""
  kernel = triton_kernel(calls.kernels("decode").decode_combine, num_warps=4 if head_dim * splits <= 4096 else 8,
                         constexprs={"NORMALIZE": normalize, "HEAD_DIM": head_dim, "D_PAD": calls.padded(head_dim),
                                     "SPLITS_PAD": calls.padded(splits, 2)})
  return mosaic_kernel(
      kernel, out_shape=lambda o, sums, m: (jax.ShapeDtypeStruct((o.shape[0], head_dim), jnp.dtype(dtype)),
                                            jax.ShapeDtypeStruct(m.shape[:1], jnp.float32),
                                            jax.ShapeDtypeStruct(m.shape[:1], jnp.float32)),
      grid=lambda meta, o, *_: o.shape[0], scalars=lambda meta, *_: (calls.i32(splits),),
      fallback=lambda *parts: combine_reference(*parts, normalize, jnp.dtype(dtype)))


def decode_split_reference(q, k, v, start, length, sm_scale, k_splits, has_start, has_length):
  """kernels/decode.py's ``split`` in jax.numpy: q (B, Hq, D), k and v (B, S, Hkv, D), start and length (B,)."""
  b, hq, d = q.shape
  seq_k, hkv = k.shape[1], k.shape[2]
  split_len = cdiv(seq_k, k_splits)
  logits = jnp.einsum("bkgd,bskd->bkgs", q.reshape(b, hkv, hq // hkv, d).astype(jnp.float32),
                      k.astype(jnp.float32)) * sm_scale
  keys = jnp.arange(seq_k)[None, :]
  valid = jnp.ones((b, seq_k), bool)
  if has_start:
    valid = valid & (keys >= start[:, None])
  if has_length:
    valid = valid & (keys < length[:, None])
  logits = by_splits(logits.reshape(b * hq, seq_k), k_splits, split_len, 1)
  valid = by_splits(jnp.broadcast_to(valid[:, None, :], (b, hq, seq_k)).reshape(b * hq, seq_k), k_splits,
                    split_len, 1)
  v_rows = jnp.repeat(jnp.swapaxes(v, 1, 2), hq // hkv, axis=1).reshape(b * hq, seq_k, d)
  return split_partials(logits, valid, by_splits(v_rows, k_splits, split_len, 1))


@calls.cached
def decode_split_call(split: Split, sm_scale: float, head_dim: int, dtype: str):
  """(q, k, v, start, length) -> partials; q (B, Hq, D), k and v (B, S, Hkv, D), start and length (B,) int32
  (read only where the options say HAS_START / HAS_LENGTH)."""
  options = dict(split.options)
  constexprs = {"HEAD_DIM": head_dim, "D_PAD": calls.padded(head_dim), "PRECISION": calls.precision(dtype)}
  qk_scale = calls.f32(sm_scale * math.log2(math.e))
  return launch(
      calls.kernels("decode").decode_split, split, constexprs, decode_timing_inputs,
      out_shape=lambda q, k, *_: partials_out_shape(q.shape[0] * q.shape[1], split.k_splits, head_dim),
      grid=lambda meta, q, k, *_: (cdiv(q.shape[1] // k.shape[2], meta["BLOCK_H"]), split.k_splits,
                                   q.shape[0] * k.shape[2]),
      scalars=lambda meta, q, k, *_: (qk_scale, calls.i32(k.shape[1]), calls.i32(k.shape[2]),
                                      calls.i32(q.shape[1] // k.shape[2]), calls.i32(cdiv(k.shape[1], split.k_splits))),
      fallback=lambda q, k, v, start, length: decode_split_reference(
          q, k, v, start, length, sm_scale, split.k_splits, options["HAS_START"], options["HAS_LENGTH"]))
