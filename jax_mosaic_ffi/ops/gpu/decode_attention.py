"""Decoding attention (one query per head against a long key/value cache), split along the keys: jax 0.11's
``jax.experimental.pallas.ops.gpu.decode_attention`` (`mqa`, `gqa`, `mqa_reference`, `mha_reference`,
`gqa_reference`) with the same names, arguments and results, run by our own Triton kernels (each split of the
keys a program, then one kernel merging the splits)::

    from jax_mosaic_ffi.ops.gpu import decode_attention   # was: from jax.experimental.pallas.ops.gpu import ...
    out = decode_attention.gqa(q, k, v, kv_seq_len=lengths)   # q (B, Hq, D), k and v (B, S, Hkv, D)
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jax_mosaic_ffi.call.launch_values import cdiv
from jax_mosaic_ffi.ops.gpu import calls
from jax_mosaic_ffi.ops.gpu import decode_calls
from jax_mosaic_ffi.ops.gpu.decode_calls import Split
from jax_mosaic_ffi.transforms.sharding import sharded
from jax_mosaic_ffi.transforms.sharding_rules import BatchDims

# Tuned configs after the default one (Pallas's block_h and block_k, 4 warps, 2 stages): wider head blocks read
# the keys fewer times, shorter key blocks pipeline deeper, longer ones with 8 warps keep more loads in flight
# (Hopper's bandwidth wants many bytes in flight per SM).
_MORE = [calls.config(4, 3, BLOCK_H=16, BLOCK_K=64), calls.config(4, 3, BLOCK_H=16, BLOCK_K=128),
         calls.config(4, 4, BLOCK_H=16, BLOCK_K=64), calls.config(8, 3, BLOCK_H=16, BLOCK_K=128),
         calls.config(8, 2, BLOCK_H=16, BLOCK_K=256), calls.config(4, 3, BLOCK_H=32, BLOCK_K=64),
         calls.config(4, 2, BLOCK_H=64, BLOCK_K=64), calls.config(8, 3, BLOCK_H=64, BLOCK_K=128)]


def _split(name, q, k, start_idx, kv_seq_len, block_h, block_k, k_splits, num_warps, num_stages, default_k) -> Split:
  group = q.shape[1] // k.shape[2]
  split_len = cdiv(k.shape[1], k_splits)
  for value, what in ((block_h, "block_h"), (block_k, "block_k")):
    if not isinstance(value, int) or value < 16 or value & (value - 1):
      raise ValueError(f"{name}: {what} must be a power of two, at least 16 (tl.dot's least), got {value!r}")
  if not isinstance(k_splits, int) or k_splits < 1:
    raise ValueError(f"{name}: k_splits must be a positive int, got {k_splits!r}")
  first = calls.config(num_warps or 4, num_stages, BLOCK_H=block_h, BLOCK_K=block_k)
  # With start_idx or kv_seq_len too: the configs are timed on full lengths (decode_calls.decode_timing_inputs).
  tuned = block_h == 16 and block_k == default_k and num_warps is None and num_stages == 2
  limits = {"BLOCK_H": calls.padded(group), "BLOCK_K": calls.padded(split_len)}
  configs = calls.clamp_configs([first] + (_MORE if tuned else []), limits)
  options = (("HAS_LENGTH", kv_seq_len is not None), ("HAS_START", start_idx is not None))
  return Split(decode_calls.frozen(configs), k_splits, options)


@calls.cached
def _decode(split: Split, sm_scale: float, head_dim: int, dtype: str, normalize: bool):
  """(q (B, Hq, D), k and v (B, S, Hkv, D), start, length (B,)) -> (o, l, m), sharded by batch under jit."""
  split_call = decode_calls.decode_split_call(split, sm_scale, head_dim, dtype)
  combine = decode_calls.combine_call(normalize, head_dim, split.k_splits, dtype)

  def run(q, k, v, start, length):
    o, sums, maxes = combine(*split_call(q, k, v, start, length))
    b, hq = q.shape[:2]
    return o.reshape(b, hq, head_dim), sums.reshape(b, hq), maxes.reshape(b, hq)

  return jax.jit(sharded(run, BatchDims(0, 0), name="decode_attention"))


def _attend(name, q, k4, v4, start_idx, kv_seq_len, sm_scale, block_h, block_k, k_splits, num_warps, num_stages,
            return_residuals, normalize_output, default_k):
  if not q.dtype == k4.dtype == v4.dtype:
    raise ValueError(f"{name}: q, k and v must have one dtype; got {q.dtype}, {k4.dtype}, {v4.dtype}")
  batch = q.shape[0]
  split = _split(name, q, k4, start_idx, kv_seq_len, block_h, block_k, k_splits, num_warps, num_stages, default_k)
  start = (jnp.zeros((batch,), jnp.int32) if start_idx is None
           else jnp.broadcast_to(jnp.asarray(start_idx, jnp.int32), (batch,)))
  length = (jnp.full((batch,), k4.shape[1], jnp.int32) if kv_seq_len is None
            else jnp.broadcast_to(jnp.asarray(kv_seq_len, jnp.int32), (batch,)))
  sm_scale = sm_scale if sm_scale is not None else 1 / math.sqrt(q.shape[-1])
  fn = _decode(split, float(sm_scale), q.shape[-1], str(jnp.dtype(q.dtype)), bool(normalize_output))
  o, sums, maxes = fn(q, k4, v4, start, length)
  return (o, (sums, maxes)) if return_residuals else o


def mqa(q, k, v, start_idx=None, kv_seq_len=None, sm_scale: float | None = None, block_h: int = 16,
        block_k: int = 256, k_splits: int = 16, num_warps: int | None = None, num_stages: int = 2,
        grid: tuple[int, ...] | None = None, interpret: bool = False, debug: bool = False,
        return_residuals: bool = False, normalize_output: bool = True):
  """Multi-query decoding attention: every query head against one shared key/value head.

  jax 0.11's Pallas ``mqa``, argument for argument: q (batch, num_heads, head_dim), k and v (batch, k_seq_len,
  head_dim); keys at positions in [start_idx, kv_seq_len) count ((batch,) or scalars; None: all). The keys are
  cut into ``k_splits`` splits (any length: Pallas needed multiples), each attended by its own programs in
  ``block_h`` heads x ``block_k`` keys tiles, then merged. At the defaults the tiles, warps and stages are
  autotuned on the GPU, Pallas's first, timed with every key attended (whatever start_idx and kv_seq_len will
  be); otherwise used as given. ``sm_scale`` defaults to 1/sqrt(head_dim).

  ``grid``, ``interpret`` and ``debug`` were Pallas's (its grid override, interpreter and debug printing):
  accepted and ignored. With ``return_residuals``, returns ``(o, (l, m))``: each head's softmax sum and max
  (batch, num_heads) float32, natural units of the scaled logits; ``normalize_output=False`` leaves o
  undivided by l, as Pallas's. Without a GPU the reference math runs::

    >>> from jax_mosaic_ffi.ops.gpu import decode_attention
    >>> q, kv = jnp.ones((2, 8, 64), jnp.float16), jnp.ones((2, 512, 64), jnp.float16)
    >>> decode_attention.mqa(q, kv, kv, kv_seq_len=jnp.array([100, 512])).shape
    (2, 8, 64)
  """
  del grid, interpret, debug
  if q.ndim != 3 or k.ndim != 3 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
    raise ValueError(f"mqa takes q (batch, num_heads, head_dim) and k, v (batch, k_seq_len, head_dim); got "
                     f"{q.shape=}, {k.shape=}, {v.shape=}")
  return _attend("mqa", q, k[:, :, None, :], v[:, :, None, :], start_idx, kv_seq_len, sm_scale, block_h,
                 block_k, k_splits, num_warps, num_stages, return_residuals, normalize_output, 256)


def gqa(q, k, v, start_idx=None, kv_seq_len=None, sm_scale: float | None = None, block_h: int = 16,
        block_k: int = 128, k_splits: int = 16, num_warps: int | None = None, num_stages: int = 2,
        grid: tuple[int, ...] | None = None, interpret: bool = False, debug: bool = False,
        return_residuals: bool = False, normalize_output: bool = True):
  """Grouped-query decoding attention: q (batch, num_q_heads, head_dim), k and v (batch, k_seq_len,
  num_kv_heads, head_dim), each key/value head shared by num_q_heads / num_kv_heads query heads.

  jax 0.11's Pallas ``gqa``, argument for argument, as `mqa` (``block_k`` defaults to 128); as Pallas,
  ``normalize_output=False`` needs ``return_residuals``::

    >>> from jax_mosaic_ffi.ops.gpu import decode_attention
    >>> q, kv = jnp.ones((2, 8, 64), jnp.bfloat16), jnp.ones((2, 512, 2, 64), jnp.bfloat16)
    >>> decode_attention.gqa(q, kv, kv).shape
    (2, 8, 64)
  """
  del grid, interpret, debug
  if not normalize_output and not return_residuals:
    raise NotImplementedError("When normalize_output is False, attention residuals must be returned.")
  if (q.ndim != 3 or k.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[2]
      or q.shape[1] % k.shape[2]):
    raise ValueError(f"gqa takes q (batch, num_q_heads, head_dim) and k, v (batch, k_seq_len, num_kv_heads, "
                     f"head_dim), num_q_heads a multiple of num_kv_heads; got {q.shape=}, {k.shape=}, {v.shape=}")
  for name, value in (("start_idx", start_idx), ("kv_seq_len", kv_seq_len)):
    if value is not None and jnp.ndim(value) not in (0, 1):
      raise ValueError(f"gqa: {name} must be a scalar or (batch,), got shape {jnp.shape(value)}")
  out = _attend("gqa", q, k, v, start_idx, kv_seq_len, sm_scale, block_h, block_k, k_splits, num_warps, num_stages,
                return_residuals, normalize_output, 128)
  return out


def _masked_logits(logits, k_seq_len, start_idx, kv_seq_len, bs, expand):
  if start_idx is None and kv_seq_len is None:
    return logits
  start_idx = jnp.broadcast_to(0 if start_idx is None else start_idx, (bs,))
  kv_seq_len = jnp.broadcast_to(k_seq_len if kv_seq_len is None else kv_seq_len, (bs,))
  positions = jnp.arange(k_seq_len)[None, :]
  mask = expand((positions >= start_idx[:, None]) & (positions < kv_seq_len[:, None]))
  return logits + (~mask) * (0.7 * jnp.finfo(logits.dtype).min)


@functools.partial(jax.jit, static_argnames=["sm_scale", "return_residuals", "normalize_output"])
def mqa_reference(q, k, v, start_idx=None, kv_seq_len=None, sm_scale=None, return_residuals=False,
                  normalize_output=True):
  """`mqa` in jax.numpy, as jax 0.11's Pallas ``mqa_reference``.

    >>> from jax_mosaic_ffi.ops.gpu import decode_attention
    >>> decode_attention.mqa_reference(jnp.ones((1, 4, 16)), jnp.ones((1, 32, 16)), jnp.ones((1, 32, 16))).shape
    (1, 4, 16)
  """
  original_dtype = q.dtype
  q, k = q.astype(jnp.float32), k.astype(jnp.float32)
  sm_scale = sm_scale if sm_scale is not None else (1 / math.sqrt(q.shape[-1]))
  logits = jnp.einsum("bnd,bsd->bns", q, k).astype(jnp.float32) * sm_scale
  logits = _masked_logits(logits, k.shape[1], start_idx, kv_seq_len, q.shape[0], lambda m: m[:, None, :])
  m = logits.max(axis=-1)
  s = jnp.exp(logits - m[..., None])
  sums = s.sum(axis=-1)
  if normalize_output:
    s = s / sums[..., None]
  o = jnp.einsum("bns,bsd->bnd", s, v).astype(original_dtype)
  return (o, (sums, m)) if return_residuals else o


@jax.jit(static_argnames=["sm_scale"])
def mha_reference(q, k, v, start_idx=None, kv_seq_len=None, sm_scale=None):
  """Multi-head decoding attention in jax.numpy (k and v with as many heads as q), as jax 0.11's Pallas
  ``decode_attention.mha_reference``.

    >>> from jax_mosaic_ffi.ops.gpu import decode_attention
    >>> kv = jnp.ones((1, 32, 4, 16))
    >>> decode_attention.mha_reference(jnp.ones((1, 4, 16)), kv, kv).shape
    (1, 4, 16)
  """
  sm_scale = sm_scale if sm_scale is not None else (1 / math.sqrt(q.shape[-1]))
  assert q.shape[1] == k.shape[2]
  logits = jnp.einsum("bnd,bsnd->bns", q, k).astype(jnp.float32)
  logits = _masked_logits(logits, k.shape[1], start_idx, kv_seq_len, q.shape[0], lambda m: m[:, None, :])
  weights = jax.nn.softmax(logits * sm_scale).astype(q.dtype)
  return jnp.einsum("bns,bsnd->bnd", weights, v)


@functools.partial(jax.jit, static_argnames=["sm_scale", "return_residuals", "normalize_output"])
def gqa_reference(q, k, v, start_idx=None, kv_seq_len=None, sm_scale=None, return_residuals=False,
                  normalize_output=True):
  """`gqa` in jax.numpy, as jax 0.11's Pallas ``gqa_reference``.

    >>> from jax_mosaic_ffi.ops.gpu import decode_attention
    >>> kv = jnp.ones((1, 32, 2, 16))
    >>> decode_attention.gqa_reference(jnp.ones((1, 4, 16)), kv, kv).shape
    (1, 4, 16)
  """
  original_dtype = q.dtype
  q, k = q.astype(jnp.float32), k.astype(jnp.float32)
  sm_scale = sm_scale if sm_scale is not None else (1 / math.sqrt(q.shape[-1]))
  bs, num_q_heads, head_dim = q.shape
  num_kv_heads = k.shape[2]
  assert num_q_heads % num_kv_heads == 0
  q_grouped = q.reshape(bs, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
  logits = jnp.einsum("bkgd,bksd->bkgs", q_grouped, jnp.swapaxes(k, 1, 2)).astype(jnp.float32) * sm_scale
  logits = _masked_logits(logits, k.shape[1], start_idx, kv_seq_len, bs, lambda m: m[:, None, None, :])
  m = logits.max(axis=-1)
  s = jnp.exp(logits - m[..., None])
  sums = s.sum(axis=-1)
  if normalize_output:
    s = s / sums[..., None]
  o = jnp.einsum("bkgs,bksd->bkgd", s, jnp.swapaxes(v, 1, 2)).astype(original_dtype).reshape(bs, num_q_heads,
                                                                                                 head_dim)
  if return_residuals:
    return o, (sums.reshape(bs, num_q_heads), m.reshape(bs, num_q_heads))
  return o
