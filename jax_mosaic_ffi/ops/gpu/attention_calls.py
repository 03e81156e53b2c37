"""mha's kernel calls (kernels/attention_forward.py, kernels/attention_backward.py) and their jax.numpy
fallbacks, which are also what `jmf.check` compares each kernel with: the forward gives the output and the
base-2 log-sum-exp, the backward delta, then dK/dV and dQ.

Layouts: q, o, do (B, T, H, D); k, v (B, S, H, D); segment ids (B, S) int32 (T == S); lse, delta (B, H, T)
float32. Every kernel's batch and head dimensions may be split under ``jit`` (`ShardingRule`), the backward's as
the forward's; sequences and the head dimension stay whole on each device.
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
from jax_mosaic_ffi.transforms.sharding_rules import ShardingRule
from jax_mosaic_ffi.triton.kernel import triton_kernel

LOG2E = math.log2(math.e)
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

# Tried in this order; the first is jax's Pallas default (its blocks and warps), so a tuned call is never slower
# than the config Pallas ran, and it is the one used where nothing is timed (lowering on a CPU). After it, the
# Hopper choices of Triton's own attention (128-query blocks, 8 warps, 3 to 4 stages: on sm_90 a 128-row block
# is two warpgroups' wgmma) and smaller tiles for short sequences.
_FORWARD = {
    "small": [calls.config(4, 2, BLOCK_Q=128, BLOCK_K=128), calls.config(4, 3, BLOCK_Q=128, BLOCK_K=64),
              calls.config(4, 3, BLOCK_Q=64, BLOCK_K=64), calls.config(8, 3, BLOCK_Q=128, BLOCK_K=64),
              calls.config(8, 3, BLOCK_Q=128, BLOCK_K=128), calls.config(4, 4, BLOCK_Q=128, BLOCK_K=64),
              calls.config(4, 4, BLOCK_Q=128, BLOCK_K=32)],
    "large": [calls.config(8, 2, BLOCK_Q=128, BLOCK_K=128), calls.config(8, 3, BLOCK_Q=128, BLOCK_K=64),
              calls.config(8, 3, BLOCK_Q=128, BLOCK_K=128), calls.config(8, 4, BLOCK_Q=128, BLOCK_K=64),
              calls.config(4, 3, BLOCK_Q=128, BLOCK_K=64), calls.config(4, 3, BLOCK_Q=64, BLOCK_K=64),
              calls.config(8, 4, BLOCK_Q=128, BLOCK_K=32)],
    "float32": [calls.config(8, 2, BLOCK_Q=128, BLOCK_K=128), calls.config(4, 2, BLOCK_Q=64, BLOCK_K=64),
                calls.config(4, 2, BLOCK_Q=64, BLOCK_K=32), calls.config(4, 2, BLOCK_Q=32, BLOCK_K=32)],
}
# The backward's: Pallas's 32 x 32 blocks, 4 warps, 2 stages first; then Triton's Hopper choice (dK/dV over
# 128 keys a program walking 32 queries a step, dQ the transpose, 4 warps, 5 stages) and neighbours of it.
_DKDV = [calls.config(4, 2, BLOCK_Q=32, BLOCK_K=32), calls.config(4, 3, BLOCK_Q=32, BLOCK_K=128),
         calls.config(4, 5, BLOCK_Q=32, BLOCK_K=128), calls.config(8, 3, BLOCK_Q=64, BLOCK_K=128),
         calls.config(4, 3, BLOCK_Q=64, BLOCK_K=64), calls.config(8, 2, BLOCK_Q=64, BLOCK_K=128),
         calls.config(4, 3, BLOCK_Q=32, BLOCK_K=64)]
_DQ = [calls.config(4, 2, BLOCK_Q=32, BLOCK_K=32), calls.config(4, 3, BLOCK_Q=128, BLOCK_K=32),
       calls.config(4, 5, BLOCK_Q=128, BLOCK_K=32), calls.config(8, 3, BLOCK_Q=128, BLOCK_K=64),
       calls.config(4, 3, BLOCK_Q=64, BLOCK_K=64), calls.config(8, 2, BLOCK_Q=128, BLOCK_K=64),
       calls.config(4, 3, BLOCK_Q=64, BLOCK_K=32)]


class Static(NamedTuple):
  """What fixes mha's kernels besides the shapes: Pallas's static arguments, resolved."""
  sm_scale: float
  causal: bool
  segments: bool
  forward_configs: tuple      # one config: fixed; several: autotuned
  dkdv_configs: tuple
  dq_configs: tuple
  grid: tuple | None


def forward_configs(dtype, head_dim: int, seq_q: int, seq_k: int) -> list[dict]:
  """The forward's autotuning configs for this problem, Pallas's default first."""
  kind = "float32" if jnp.dtype(dtype) == jnp.float32 else ("small" if head_dim <= 64 else "large")
  return calls.clamp_configs(_FORWARD[kind], {"BLOCK_Q": calls.padded(seq_q), "BLOCK_K": calls.padded(seq_k)})


def backward_configs(dtype, seq_q: int, seq_k: int) -> tuple[list[dict], list[dict]]:
  """The dK/dV and dQ kernels' autotuning configs, Pallas's blocks (32 x 32, 4 warps) first."""
  limits = {"BLOCK_Q": calls.padded(seq_q), "BLOCK_K": calls.padded(seq_k)}
  big = jnp.dtype(dtype) == jnp.float32
  keep = lambda c: not big or c["BLOCK_Q"] * c["BLOCK_K"] <= 64 * 64  # noqa: E731  (float32 dots: small tiles)
  return (calls.clamp_configs([c for c in _DKDV if keep(c)], limits),
          calls.clamp_configs([c for c in _DQ if keep(c)], limits))


# The factors of the kernels' sharding rules: batch (b) and heads (h) may be split; query positions (t), key
# positions (s) and the head dimension (d) stay whole on each device.
_Q, _KV, _ROWS = "b t h d", "b s h d", "b h t"
_KEPT = ("t", "s", "d")


def _rule(inputs: list[str], outputs: list[str]) -> ShardingRule:
  """The rule of a call of these operands' and results' factors, the whole ones those of `_KEPT` it has."""
  kept = tuple(f for f in _KEPT if any(f in m.split() for m in inputs + outputs))
  return ShardingRule(f"{', '.join(inputs)} -> {', '.join(outputs)}", replicated=kept)


def _attention_inputs(segments: bool) -> list[str]:
  """q, k, v and the segment ids (keyed by key position) when there are some."""
  return [_Q, _KV, _KV] + (["b s"] if segments else [])


def _mask(static: Static, seq_q: int, seq_k: int, segment_ids):
  """(B or 1, 1, T, S) True where a query sees a key."""
  mask = jnp.ones((1, 1, seq_q, seq_k), bool)
  if static.causal:
    mask = mask & jnp.tril(jnp.ones((seq_q, seq_k), bool))[None, None]
  if segment_ids is not None:
    mask = mask & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
  return mask


def _scaled_logits(static: Static, q, k, segment_ids):
  logits = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * static.sm_scale
  return jnp.where(_mask(static, q.shape[1], k.shape[1], segment_ids), logits, MASK_VALUE)


def forward_reference(static: Static, q, k, v, segment_ids=None):
  """What the forward kernel computes: (out in q's dtype, base-2 log-sum-exp of the scaled logits)."""
  logits = _scaled_logits(static, q, k, segment_ids)
  lse = jax.nn.logsumexp(logits, axis=-1)
  weights = jnp.exp(logits - lse[..., None])
  out = jnp.einsum("bhts,bshd->bthd", weights, v.astype(jnp.float32))
  return out.astype(q.dtype), lse * LOG2E


def _grid(static: Static, meta, q):
  return static.grid or (cdiv(q.shape[1], meta["BLOCK_Q"]), q.shape[0], q.shape[2])


def _constexprs(head_dim: int, dtype: str, **more) -> dict:
  return {"HEAD_DIM": head_dim, "D_PAD": calls.padded(head_dim), "PRECISION": calls.precision(dtype), **more}


def _tuned(configs) -> dict:
  configs = [dict(c) for c in configs]
  if len(configs) == 1:  # fixed blocks: the kernel's constexprs, no autotuning
    return {"fixed": configs[0]}
  return {"configs": configs}


def _launch(fn, configs, constexprs, **options):
  """mosaic_kernel of ``fn`` with one fixed config or several to tune."""
  plan = _tuned(configs)
  if "fixed" in plan:
    fixed = dict(plan["fixed"])
    kernel = triton_kernel(fn, num_warps=fixed.pop("num_warps"), num_stages=fixed.pop("num_stages"),
                           constexprs={**constexprs, **fixed})
    return mosaic_kernel(kernel, **options)
  return mosaic_kernel(triton_kernel(fn, constexprs=constexprs), configs=plan["configs"], **options)


def forward_call(static: Static, head_dim: int, dtype: str):
  """The forward kernel's call: (q, k, v[, segment_ids]) -> (out, lse)."""
  module = calls.kernels("attention_forward")
  fn = module.mha_forward_segments if static.segments else module.mha_forward_plain
  return _launch(
      fn, static.forward_configs, _constexprs(head_dim, dtype, CAUSAL=static.causal),
      out_shape=lambda q, *_: (jax.ShapeDtypeStruct(q.shape, q.dtype),
                               jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1]), jnp.float32)),
      grid=lambda meta, q, *_: _grid(static, meta, q),
      scalars=lambda meta, q, k, *_: (calls.f32(static.sm_scale * LOG2E), calls.i32(q.shape[1]),
                                      calls.i32(k.shape[1]), calls.i32(q.shape[2])),
      fallback=lambda *args: forward_reference(static, *args),
      sharding=_rule(_attention_inputs(static.segments), [_Q, _ROWS]))


def backward_reference(static: Static, q, k, v, segment_ids, do, lse, delta):
  """What the dK/dV and dQ kernels compute, from the saved lse and delta: (dq, dk, dv)."""
  logits = _scaled_logits(static, q, k, segment_ids)
  p = jnp.exp2(logits * LOG2E - lse[..., None])
  p = jnp.where(_mask(static, q.shape[1], k.shape[1], segment_ids), p, 0.0)
  dp = jnp.einsum("bthd,bshd->bhts", do, v, preferred_element_type=jnp.float32)
  ds = p * (dp - delta[..., None])
  dv = jnp.einsum("bhts,bthd->bshd", p, do.astype(jnp.float32))
  dk = jnp.einsum("bhts,bthd->bshd", ds, q.astype(jnp.float32)) * static.sm_scale
  dq = jnp.einsum("bhts,bshd->bthd", ds, k.astype(jnp.float32)) * static.sm_scale
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def delta_call(head_dim: int, dtype: str, seq_q: int):
  """(out, do, dlse) -> delta = rowsum(out * do) - log2(e) * dlse, (B, H, T) float32."""
  block = min(64, calls.padded(seq_q))
  constexprs = _constexprs(head_dim, dtype, BLOCK_Q=block)
  del constexprs["PRECISION"]
  kernel = triton_kernel(calls.kernels("attention_backward").mha_delta, constexprs=constexprs)
  return mosaic_kernel(
      kernel, out_shape=lambda o, do, dlse: jax.ShapeDtypeStruct(dlse.shape, jnp.float32),
      grid=lambda meta, o, do, dlse: (cdiv(o.shape[1], block), o.shape[0], o.shape[2]),
      scalars=lambda meta, o, *_: (calls.i32(o.shape[1]), calls.i32(o.shape[2])),
      fallback=lambda o, do, dlse: jnp.einsum("bthd,bthd->bht", o.astype(jnp.float32),
                                              do.astype(jnp.float32)) - LOG2E * dlse,
      sharding=_rule([_Q, _Q, _ROWS], [_ROWS]))


def _backward_rule(static: Static, outputs: list[str]) -> ShardingRule:
  """(q, k, v[, segment_ids], do, lse, delta) -> ``outputs``: split as the forward is."""
  return _rule(_attention_inputs(static.segments) + [_Q, _ROWS, _ROWS], outputs)


def _backward_scalars(static: Static):
  return lambda meta, q, k, *_: (calls.f32(static.sm_scale * LOG2E), calls.f32(static.sm_scale),
                                 calls.i32(q.shape[1]), calls.i32(k.shape[1]), calls.i32(q.shape[2]))


def _split_segments(static: Static, args):
  if static.segments:
    q, k, v, seg, *rest = args
  else:
    (q, k, v, *rest), seg = args, None
  return q, k, v, seg, rest


def dkdv_call(static: Static, head_dim: int, dtype: str):
  """(q, k, v[, segment_ids], do, lse, delta) -> (dk, dv)."""
  module = calls.kernels("attention_backward")
  fn = module.mha_dkdv_segments if static.segments else module.mha_dkdv_plain
  constexprs = _constexprs(head_dim, dtype, CAUSAL=static.causal)

  def fallback(*args):
    q, k, v, seg, (do, lse, delta) = _split_segments(static, args)
    return backward_reference(static, q, k, v, seg, do, lse, delta)[1:]

  return _launch(fn, static.dkdv_configs, constexprs,
                 out_shape=lambda q, k, v, *_: (jax.ShapeDtypeStruct(k.shape, k.dtype),
                                                jax.ShapeDtypeStruct(v.shape, v.dtype)),
                 grid=lambda meta, q, k, *_: (cdiv(k.shape[1], meta["BLOCK_K"]), k.shape[0], k.shape[2]),
                 fallback=fallback, scalars=_backward_scalars(static), sharding=_backward_rule(static, [_KV, _KV]))


def dq_call(static: Static, head_dim: int, dtype: str):
  """(q, k, v[, segment_ids], do, lse, delta) -> dq."""
  module = calls.kernels("attention_backward")
  fn = module.mha_dq_segments if static.segments else module.mha_dq_plain
  constexprs = _constexprs(head_dim, dtype, CAUSAL=static.causal)

  def fallback(*args):
    q, k, v, seg, (do, lse, delta) = _split_segments(static, args)
    return backward_reference(static, q, k, v, seg, do, lse, delta)[0]

  return _launch(fn, static.dq_configs, constexprs,
                 out_shape=lambda q, *_: jax.ShapeDtypeStruct(q.shape, q.dtype),
                 grid=lambda meta, q, *_: (cdiv(q.shape[1], meta["BLOCK_Q"]), q.shape[0], q.shape[2]),
                 fallback=fallback, scalars=_backward_scalars(static), sharding=_backward_rule(static, [_Q]))
