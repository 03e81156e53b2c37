"""The ops of jax_mosaic_ffi.ops.gpu, each as a function of arrays with its reference and inputs of a given dtype,
for tests/test_pallas_ops.py (CPU: fallbacks, lowering, export, sharding, packs) and test_pallas_ops_gpu.py
(the kernels against the references on a GPU). Shapes are ragged on purpose (no length a multiple of a block)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.ops.gpu import attention, decode_attention, layer_norm, paged_attention, rms_norm, softmax

DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)
# Output tolerances (rtol = atol) by dtype: float32 runs exact float32 dots; 16-bit outputs round once.
TOLERANCE = {jnp.float32: 2e-4, jnp.float16: 1e-2, jnp.bfloat16: 4e-2}


@dataclasses.dataclass(frozen=True)
class Case:
  """One op on one problem: ``op(*inputs)`` against ``reference(*inputs)``, ``grads`` the inputs differentiated
  (None: the op has no gradient)."""
  name: str
  op: Callable
  reference: Callable
  make: Callable        # (rng, dtype) -> inputs
  grads: tuple | None = None


def _normal(rng, shape, dtype, scale=1.0):
  return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32).astype(dtype)


def _attention_inputs(rng, dtype, b=2, t=200, h=2, d=64, segments=False):
  q, k, v = (_normal(rng, (b, t, h, d), dtype) for _ in range(3))
  if not segments:
    return q, k, v
  cuts = np.sort(rng.choice(np.arange(1, t), 3, replace=False))
  ids = np.searchsorted(cuts, np.arange(t), side="right")
  return q, k, v, jnp.asarray(np.broadcast_to(ids, (b, t)), jnp.int32)


def _mha(causal, segments, **options):
  def op(q, k, v, seg=None):
    return attention.mha(q, k, v, seg, sm_scale=0.125, causal=causal, **options)

  def reference(q, k, v, seg=None):
    return attention.mha_reference(q, k, v, seg, sm_scale=0.125, causal=causal).astype(q.dtype)

  return op, reference


def _decode_inputs(rng, dtype, mqa, lengths):
  b, hq, hkv, s, d = 3, 16, 4, 1000, 64
  q = _normal(rng, (b, hq, d), dtype)
  kv_shape = (b, s, d) if mqa else (b, s, hkv, d)
  k, v = _normal(rng, kv_shape, dtype), _normal(rng, kv_shape, dtype)
  if not lengths:
    return q, k, v
  start = jnp.asarray(rng.integers(0, 100, b), jnp.int32)
  length = jnp.asarray(rng.integers(300, s + 1, b), jnp.int32)
  return q, k, v, start, length


def _decode(mqa: bool):
  fn, ref = (decode_attention.mqa, decode_attention.mqa_reference) if mqa else (decode_attention.gqa,
                                                                                 decode_attention.gqa_reference)
  return (lambda q, k, v, *lens: fn(q, k, v, *lens, k_splits=7),
          lambda q, k, v, *lens: ref(q, k, v, *lens))


def _paged_inputs(rng, dtype, quantized=False):
  b, hq, hkv, d, page, pages, per_seq = 3, 16, 2, 64, 16, 64, 13
  q = _normal(rng, (b, hq, d), dtype)
  if quantized:
    k_pages, v_pages = (jnp.asarray(rng.integers(-127, 128, (hkv, pages, page, d)), jnp.int8) for _ in range(2))
  else:
    k_pages, v_pages = _normal(rng, (hkv, pages, page, d), dtype), _normal(rng, (hkv, pages, page, d), dtype)
  tables = jnp.asarray(rng.permutation(pages)[: b * per_seq].reshape(b, per_seq), jnp.int32)
  lengths = jnp.asarray([per_seq * page, 77, 1 + rng.integers(0, per_seq * page)], jnp.int32)
  if not quantized:
    return q, k_pages, v_pages, tables, lengths
  scales = [jnp.asarray(rng.uniform(0.002, 0.02, (hkv, pages, page)), jnp.float32) for _ in range(2)]
  return q, k_pages, v_pages, tables, lengths, *scales


def dense(pages, tables):
  """(Hkv, P, page, D) pages gathered by (B, pages_per_seq) tables into (B, tokens, Hkv, D)."""
  b, per_seq = tables.shape
  return jnp.moveaxis(pages[:, tables], 0, 3).reshape(b, per_seq * pages.shape[2], pages.shape[0], *pages.shape[3:])


def _paged_op(q, k_pages, v_pages, tables, lengths, k_scales=None, v_scales=None, cap=None):
  return paged_attention.paged_attention(q, k_pages, v_pages, tables, lengths, k_scales, v_scales, k_splits=4,
                                         pages_per_compute_block=4, attn_logits_soft_cap=cap)


def _paged_reference(q, k_pages, v_pages, tables, lengths, k_scales=None, v_scales=None, cap=None):
  if k_scales is not None:
    k_pages = k_pages.astype(jnp.float32) * k_scales[..., None]
    v_pages = v_pages.astype(jnp.float32) * v_scales[..., None]
  return paged_attention.paged_attention_reference(q, dense(k_pages, tables), dense(v_pages, tables), lengths,
                                                   attn_logits_soft_cap=cap)


def _norm_inputs(rng, dtype, n=1000):
  x = _normal(rng, (3, 37, n), dtype, 2.0) + jnp.asarray(0.5, dtype)
  return x, _normal(rng, (n,), dtype), _normal(rng, (n,), dtype)


def cases() -> list[Case]:
  mha = lambda causal, segments: Case(  # noqa: E731
      f"mha{'-causal' if causal else ''}{'-segments' if segments else ''}", *_mha(causal, segments),
      functools.partial(_attention_inputs, segments=segments), grads=(0, 1, 2))
  return [
      mha(False, False), mha(True, False), mha(False, True), mha(True, True),
      Case("mqa", *_decode(True), functools.partial(_decode_inputs, mqa=True, lengths=False)),
      Case("mqa-lengths", *_decode(True), functools.partial(_decode_inputs, mqa=True, lengths=True)),
      Case("gqa", *_decode(False), functools.partial(_decode_inputs, mqa=False, lengths=False)),
      Case("gqa-lengths", *_decode(False), functools.partial(_decode_inputs, mqa=False, lengths=True)),
      Case("paged", _paged_op, _paged_reference, _paged_inputs),
      Case("paged-soft-cap", functools.partial(_paged_op, cap=20.0),
           functools.partial(_paged_reference, cap=20.0), _paged_inputs),
      Case("paged-int8", _paged_op, _paged_reference, functools.partial(_paged_inputs, quantized=True)),
      Case("layer_norm", layer_norm.layer_norm, lambda x, w, b: layer_norm.layer_norm_reference(x, w, b).astype(
          x.dtype), _norm_inputs, grads=(0, 1, 2)),
      Case("rms_norm", rms_norm.rms_norm, lambda x, w, b: rms_norm.rms_norm_reference(x, w, b).astype(x.dtype),
           _norm_inputs, grads=(0, 1, 2)),
      Case("layer_norm-long", layer_norm.layer_norm, lambda x, w, b: layer_norm.layer_norm_reference(
          x, w, b).astype(x.dtype), functools.partial(_norm_inputs, n=20000), grads=(0, 1, 2)),
      Case("softmax", softmax.softmax, softmax.softmax_reference,
           lambda rng, dtype: (_normal(rng, (4, 33, 500), dtype, 3.0),), grads=(0,)),
      Case("softmax-long", softmax.softmax, softmax.softmax_reference,
           lambda rng, dtype: (_normal(rng, (3, 20000), dtype, 3.0),), grads=(0,)),
  ]


CASES = {case.name: case for case in cases()}


def loss(fn, cotangent_seed: int = 0):
  """A scalar of fn's output with random weights (so every output element's gradient matters)."""
  def scalar(*args):
    out = fn(*args).astype(jnp.float32)
    weights = jax.random.normal(jax.random.key(cotangent_seed), out.shape, jnp.float32)
    return jnp.sum(out * weights)
  return scalar


def assert_close(got, want, dtype, what: str, scale: float = 1.0):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert got.shape == want.shape, (what, got.shape, want.shape)
  tol = TOLERANCE[dtype] * scale
  bound = tol * (1 + np.abs(want))
  worst = np.argmax(np.abs(got - want) - bound)
  assert np.all(np.abs(got - want) <= bound), (
      f"{what}: worst at {np.unravel_index(worst, got.shape)}: {got.flat[worst]} vs {want.flat[worst]} "
      f"(tolerance {tol})")
