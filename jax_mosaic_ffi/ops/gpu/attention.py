"""Fused multi-head attention, forward and backward: jax 0.11's ``jax.experimental.pallas.ops.gpu.attention``
(`mha`, `mha_reference`, `BlockSizes`, `segment_mask`) with the same names, arguments and results, run by our
own Triton kernels. ``from jax_mosaic_ffi.ops.gpu import attention`` in place of
``from jax.experimental.pallas.ops.gpu import attention`` is the whole switch::

    out = attention.mha(q, k, v, segment_ids=None, sm_scale=0.125, causal=True)   # q, k, v: (B, T, H, D)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.ops.gpu import attention_calls
from jax_mosaic_ffi.ops.gpu import calls
from jax_mosaic_ffi.ops.gpu.attention_calls import Static
from jax_mosaic_ffi.transforms.autodiff import differentiable

DEFAULT_MASK_VALUE = -0.7 * float(np.finfo(np.dtype("float32")).max)


@dataclasses.dataclass(frozen=True, slots=True)
class BlockSizes:
  """Tile sizes of the attention kernels, as jax's Pallas kernel takes them.

  ``block_q`` and ``block_k`` tile the forward kernel (queries, keys); ``block_q_dkv`` and ``block_kv_dkv`` the
  dK/dV kernel; ``block_q_dq`` and ``block_kv_dq`` the dQ kernel. Each is a power of two (a block larger than
  its sequence is cut to it). `get_default` (Pallas's defaults) means: autotune, when `mha`'s ``num_warps`` and
  ``num_stages`` are left at theirs too: every block size the kernels take is tried on the GPU, Pallas's
  first; other sizes are used as given::

    >>> from jax_mosaic_ffi.ops.gpu.attention import BlockSizes
    >>> BlockSizes.get_default().has_backward_blocks
    True
    >>> BlockSizes(block_q=64, block_k=64).has_backward_blocks   # then mha has no backward pass
    False
  """
  block_q: int
  block_k: int

  block_q_dkv: int | None = None
  block_kv_dkv: int | None = None
  block_q_dq: int | None = None
  block_kv_dq: int | None = None

  @classmethod
  def get_default(cls):
    """Pallas's defaults: 128 x 128 forward tiles, 32 x 32 backward tiles."""
    return BlockSizes(block_q=128, block_k=128, block_q_dkv=32, block_kv_dkv=32, block_q_dq=32, block_kv_dq=32)

  @property
  def has_backward_blocks(self) -> bool:
    """Whether all four backward block sizes are set (the backward pass needs them)."""
    return all(b is not None for b in (self.block_q_dkv, self.block_kv_dkv, self.block_q_dq, self.block_kv_dq))


def segment_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array):
  """True where a query's segment id equals a key's: (B, T, S) from (B, T) and (B, S), or (T, S) from 1-D ids.

    >>> from jax_mosaic_ffi.ops.gpu.attention import segment_mask
    >>> segment_mask(jnp.array([0, 0, 1]), jnp.array([0, 1, 1])).astype(int).tolist()
    [[1, 0, 0], [1, 0, 0], [0, 1, 1]]
  """
  q_segment_ids = jnp.expand_dims(q_segment_ids, axis=-1)
  kv_segment_ids = (jnp.expand_dims(kv_segment_ids, axis=0) if kv_segment_ids.ndim == 1
                    else jnp.expand_dims(kv_segment_ids, axis=1))
  return jnp.equal(q_segment_ids, kv_segment_ids).astype(jnp.bool_)


def _block(value: int, name: str) -> int:
  if not isinstance(value, int) or value < 1 or value & (value - 1):
    raise ValueError(f"mha: BlockSizes.{name} must be a power of two (Triton's blocks are), got {value!r}")
  return value


def _static(q, k, segment_ids, sm_scale, causal, block_sizes, num_warps, num_stages, grid) -> Static:
  """Pallas's static arguments, resolved for these shapes: the kernels' configs (one: fixed; several: tuned)."""
  seq_q, seq_k, head_dim = q.shape[1], k.shape[1], q.shape[3]
  # Read by field, so that jax 0.11's own BlockSizes (a program half switched) means the same.
  sizes = tuple(getattr(block_sizes, f.name, None) for f in dataclasses.fields(BlockSizes))
  default = dataclasses.astuple(BlockSizes.get_default())
  if sizes == default and num_warps is None and num_stages == 2 and grid is None:
    dkdv, dq = attention_calls.backward_configs(q.dtype, seq_q, seq_k)
    forward = attention_calls.forward_configs(q.dtype, head_dim, seq_q, seq_k)
  else:
    fill_q, fill_k = calls.padded(seq_q), calls.padded(seq_k)
    names = [f.name for f in dataclasses.fields(BlockSizes)]
    blocks = {name: None if b is None else _block(b, name) for name, b in zip(names, sizes)}
    forward = [calls.config(num_warps or (4 if head_dim <= 64 else 8), num_stages,
                            BLOCK_Q=min(blocks["block_q"], fill_q), BLOCK_K=min(blocks["block_k"], fill_k))]
    dkdv = dq = ()
    if all(blocks[name] is not None for name in names[2:]):  # Pallas's backward: its warps, two stages
      small = min(blocks["block_q_dkv"] * blocks["block_kv_dkv"], blocks["block_q_dq"] * blocks["block_kv_dq"])
      warps = num_warps or (4 if small < 128 * 128 else 8)
      dkdv = [calls.config(warps, 2, BLOCK_Q=min(blocks["block_q_dkv"], fill_q),
                           BLOCK_K=min(blocks["block_kv_dkv"], fill_k))]
      dq = [calls.config(warps, 2, BLOCK_Q=min(blocks["block_q_dq"], fill_q),
                         BLOCK_K=min(blocks["block_kv_dq"], fill_k))]
  freeze = lambda configs: tuple(tuple(sorted(c.items())) for c in configs)  # noqa: E731
  return Static(float(sm_scale), bool(causal), segment_ids is not None, freeze(forward), freeze(dkdv), freeze(dq),
                None if grid is None else tuple(grid))


def _thawed(static: Static) -> Static:
  thaw = lambda configs: tuple(dict(c) for c in configs)  # noqa: E731
  return static._replace(forward_configs=thaw(static.forward_configs), dkdv_configs=thaw(static.dkdv_configs),
                         dq_configs=thaw(static.dq_configs))


@calls.cached
def _function(frozen: Static, head_dim: int, dtype: str, seq_q: int, backward_pass_impl: str):
  """mha's forward call with its backward attached (`jmf.differentiable`), jitted."""
  static = _thawed(frozen)
  forward = attention_calls.forward_call(static, head_dim, dtype)
  n_in = 4 if static.segments else 3

  def backward(*args):
    inputs, (out, lse, d_out, d_lse) = args[:n_in], args[n_in:]
    if backward_pass_impl == "xla":
      _, vjp = jax.vjp(lambda q, k, v: attention_calls.forward_reference(static, q, k, v, *inputs[3:]),
                       *inputs[:3])
      return vjp((d_out, d_lse))
    if not static.dkdv_configs:
      raise ValueError("mha: Backward block sizes must all be set (BlockSizes.block_q_dkv, block_kv_dkv, "
                       "block_q_dq, block_kv_dq), or backward_pass_impl='xla'")
    delta = attention_calls.delta_call(head_dim, dtype, seq_q)(out, d_out, d_lse)
    dk, dv = attention_calls.dkdv_call(static, head_dim, dtype)(*inputs, d_out, lse, delta)
    dq = attention_calls.dq_call(static, head_dim, dtype)(*inputs, d_out, lse, delta)
    return dq, dk, dv

  residuals = tuple(f"in{i}" for i in range(n_in)) + ("out0", "out1")
  return jax.jit(differentiable(forward, bwd=backward, residuals=residuals))


def mha(q, k, v, segment_ids: jnp.ndarray | None, sm_scale: float = 1.0, causal: bool = False,
        block_sizes: BlockSizes = BlockSizes.get_default(), backward_pass_impl: str = "triton",  # noqa: B008  (Pallas's)
        num_warps: int | None = None, num_stages: int = 2, grid: tuple[int, ...] | None = None,
        interpret: bool = False, debug: bool = False, return_residuals: bool = False):
  """Multi-head attention, ``softmax(q k^T * sm_scale) v`` per batch and head, FlashAttention-style.

  jax 0.11's Pallas ``mha``, argument for argument. On a GPU our Triton kernels run (forward, and with
  `jax.grad` the backward: delta, dK/dV, dQ); elsewhere `mha_reference`'s math (each kernel's fallback).

  Args:
    q: (batch, seq_len, num_heads, head_dim); k, v: (batch, kv_seq_len, num_heads, head_dim). float32,
      float16 or bfloat16; any lengths and head_dim (Pallas needed multiples of the blocks).
    segment_ids: None, or (batch, seq_len) int32: a query sees only keys of its segment (seq_len ==
      kv_seq_len).
    sm_scale: the logits' scale.
    causal: a query at position i sees keys 0..i.
    block_sizes: `BlockSizes`; left at `BlockSizes.get_default()` (with ``num_warps`` and ``num_stages`` at
      theirs, and no ``grid``), every kernel is autotuned on the GPU; otherwise the sizes are used as given.
    backward_pass_impl: ``"triton"`` (our backward kernels) or ``"xla"`` (autodiff of the reference math).
    num_warps, num_stages: the forward kernel's launch (the backward's ``num_warps`` too, as Pallas).
    grid: the forward's grid, Pallas's axes: (query blocks, batch, heads).
    interpret, debug: Pallas's interpreter and debug printing, which mean nothing here: accepted, ignored.
    return_residuals: also return the (batch, num_heads, seq_len) float32 log-sum-exp, in base 2 of the scaled
      logits, as Pallas's; unlike Pallas, gradients flow through it as well.

  Returns:
    The output, q's shape and dtype (and the log-sum-exp with ``return_residuals``).

  Without a GPU the reference math runs::

    >>> from jax_mosaic_ffi.ops.gpu import attention
    >>> q = k = v = jnp.ones((1, 128, 2, 64), jnp.float16)
    >>> attention.mha(q, k, v, segment_ids=None, causal=True).shape
    (1, 128, 2, 64)
  """
  del interpret, debug  # Pallas's interpreter and its debug prints: nothing of ours
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"mha takes q, k, v of rank 4 (batch, seq_len, num_heads, head_dim); got {q.shape=}, "
                     f"{k.shape=}, {v.shape=}")
  if (q.shape[-1] != k.shape[-1]) or (q.shape[-1] != v.shape[-1]):
    raise ValueError(f"This kernel expects q, k, and v to have the same head dimension, but found {q.shape=}, "
                     f"{k.shape=}, {v.shape=}.")
  if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
    raise ValueError(f"mha: k and v must have one shape, and q their batch and heads; got {q.shape=}, "
                     f"{k.shape=}, {v.shape=}")
  if not q.dtype == k.dtype == v.dtype:
    raise ValueError(f"mha: q, k and v must have one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
  if segment_ids is not None and (segment_ids.shape != (q.shape[0], q.shape[1]) or q.shape[1] != k.shape[1]):
    raise ValueError(f"mha: segment_ids must be (batch, seq_len) with seq_len == kv_seq_len; got "
                     f"{segment_ids.shape=}, {q.shape=}, {k.shape=}")
  if backward_pass_impl not in ("triton", "xla"):
    raise ValueError(f"Invalid backward pass implementation: {backward_pass_impl}")
  static = _static(q, k, segment_ids, sm_scale, causal, block_sizes, num_warps, num_stages, grid)
  fn = _function(static, q.shape[3], str(jnp.dtype(q.dtype)), q.shape[1], backward_pass_impl)
  args = (q, k, v) if segment_ids is None else (q, k, v, segment_ids.astype(jnp.int32))
  out, lse = fn(*args)
  return (out, lse) if return_residuals else out


@functools.partial(jax.jit, static_argnames=["sm_scale", "causal"])
def mha_reference(q, k, v, segment_ids: jnp.ndarray | None, sm_scale=1.0, causal: bool = False):
  """Attention in jax.numpy, as jax 0.11's Pallas ``mha_reference``: float32 logits and output.

    >>> from jax_mosaic_ffi.ops.gpu import attention
    >>> q = k = v = jnp.ones((1, 4, 1, 8))
    >>> attention.mha_reference(q, k, v, None, causal=True).shape
    (1, 4, 1, 8)
  """
  q_seq_len, kv_seq_len = q.shape[1], k.shape[1]
  logits = jnp.einsum("bqhc,bkhc->bhqk", q, k, preferred_element_type=jnp.float32)
  mask = None
  if segment_ids is not None:
    mask = jnp.broadcast_to(jnp.expand_dims(segment_mask(segment_ids, segment_ids), 1), logits.shape)
  if causal:
    causal_mask = jnp.broadcast_to(jnp.tril(jnp.ones((1, 1, q_seq_len, kv_seq_len), dtype=bool)), logits.shape)
    mask = causal_mask if mask is None else jnp.logical_and(mask, causal_mask)
  logits = logits if mask is None else jnp.where(mask, logits, float("-inf"))
  weights = jax.nn.softmax(logits * sm_scale)
  return jnp.einsum("bhqk,bkhc->bqhc", weights, v, preferred_element_type=jnp.float32)
