"""FlashAttention-4's Hopper kernels (flash-attn-4's CuTe DSL classes, unchanged) called from JAX as a user of
jax_mosaic_ffi writes it: short `@cute.jit` launchers and `jmf.cute_call`, the gradient given with
`jmf.differentiable`. FA4 itself has no JAX binding; its own launchers are `flash_attn.cute.flash_attn_func` (and
its torch autograd backward) on torch tensors.

Forward: `FlashAttentionForwardSm90`, with FA4's tiles for the H100/H200 (`_tile_size_fwd_sm90` in
flash_attn/cute/interface.py), by head dimension; its launcher also runs 384 threads (three warpgroups) and two
stages there.

Backward: the three kernels of FA4's `_flash_attn_bwd` on sm_90, with its `BwdConfig` (`_tile_size_bwd_sm90`):
the preprocess (dPsum = rowsum(dO * O) - dLSE, the LSE in log2 units, the fp32 dQ accumulator zeroed), the main
`FlashAttentionBackwardSm90` (dK and dV; dQ accumulated in fp32), and the postprocess (the fp32 dQ accumulator to
dQ, times the softmax scale). With grouped-query heads several query heads add into one dK and dV, so these are
fp32 accumulators too (zeroed by XLA) and two more postprocess calls convert them. The accumulators and
statistics are outputs of one call and inputs of the next, the dQ (and dK, dV) accumulators aliased through the
main call; their sequence lengths are rounded up to the tiles, their head dimensions as FA4 rounds them.
"""

import functools

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import jax
import jax.numpy as jnp
import numpy as np
from flash_attn.cute.flash_bwd_postprocess import FlashAttentionBackwardPostprocess
from flash_attn.cute.flash_bwd_preprocess import FlashAttentionBackwardPreprocess
from flash_attn.cute.flash_bwd_sm90 import FlashAttentionBackwardSm90
from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
from flash_attn.cute.interface import _tile_size_bwd_sm90

import jax_mosaic_ffi as jmf

F32 = jnp.float32


@cute.jit
def attention_launch(stream: cuda.CUstream, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
                     lse: cute.Tensor, *, head_dim: cutlass.Constexpr, head_dim_v: cutlass.Constexpr,
                     qhead_per_kvhead: cutlass.Constexpr, causal: cutlass.Constexpr, scale: cutlass.Constexpr,
                     tile_m: cutlass.Constexpr, tile_n: cutlass.Constexpr, mma_pv_is_rs: cutlass.Constexpr,
                     intra_wg_overlap: cutlass.Constexpr):
  FlashAttentionForwardSm90(q.element_type, head_dim, head_dim_v, qhead_per_kvhead, is_causal=causal,
                            pack_gqa=qhead_per_kvhead > 1, tile_m=tile_m, tile_n=tile_n, num_stages=2,
                            num_threads=384, intra_wg_overlap=intra_wg_overlap,
                            mma_pv_is_rs=mma_pv_is_rs)(q, k, v, o, lse, cutlass.Float32(scale), stream=stream)


@cute.jit
def backward_preprocess_launch(stream: cuda.CUstream, o: cute.Tensor, do: cute.Tensor, lse: cute.Tensor,
                               dlse: cute.Tensor, dpsum: cute.Tensor, lse_log2: cute.Tensor, dq_accum: cute.Tensor,
                               *, head_dim: cutlass.Constexpr, head_dim_v: cutlass.Constexpr,
                               tile_m: cutlass.Constexpr, hdim_multiple_of: cutlass.Constexpr):
  FlashAttentionBackwardPreprocess(o.element_type, head_dim, head_dim_v, tile_m, hdim_multiple_of=hdim_multiple_of)(
      o, do, dpsum, lse, lse_log2, dq_accum, None, None, dlse, None, None, cutlass.Float32(1.0), stream=stream)


@cute.jit
def backward_launch(stream: cuda.CUstream, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, do: cute.Tensor,
                    lse_log2: cute.Tensor, dpsum: cute.Tensor, dq_accum: cute.Tensor, dk: cute.Tensor,
                    dv: cute.Tensor, *, config: cutlass.Constexpr, head_dim: cutlass.Constexpr,
                    head_dim_v: cutlass.Constexpr, qhead_per_kvhead: cutlass.Constexpr, causal: cutlass.Constexpr,
                    scale: cutlass.Constexpr):
  c = config
  FlashAttentionBackwardSm90(
      q.element_type, head_dim, head_dim_v, qhead_per_kvhead, causal, tile_m=c.m_block_size,
      tile_n=c.n_block_size, Q_stage=c.num_stages_Q, dO_stage=c.num_stages_dO, PdS_stage=c.num_stages_PdS,
      SdP_swapAB=c.SdP_swapAB, dKV_swapAB=c.dKV_swapAB, dQ_swapAB=c.dQ_swapAB, AtomLayoutMSdP=c.AtomLayoutMSdP,
      AtomLayoutNdKV=c.AtomLayoutNdKV, AtomLayoutMdQ=c.AtomLayoutMdQ, num_threads=(c.num_wg + 1) * 128,
      q_subtile_factor=2, dQ_single_wg=c.dQ_single_wg,
  )(q, k, v, do, lse_log2, dpsum, dq_accum, dk, dv, cutlass.Float32(scale), stream=stream)


@cute.jit
def backward_postprocess_launch(stream: cuda.CUstream, accum: cute.Tensor, out: cute.Tensor, *,
                                head_dim: cutlass.Constexpr, tile: cutlass.Constexpr, num_threads: cutlass.Constexpr,
                                atom_layout: cutlass.Constexpr, swap_ab: cutlass.Constexpr,
                                hdim_multiple_of: cutlass.Constexpr, scale: cutlass.Constexpr):
  FlashAttentionBackwardPostprocess(out.element_type, head_dim, 90, tile, num_threads, atom_layout, swap_ab,
                                    hdim_multiple_of=hdim_multiple_of)(
      accum, out, cutlass.Float32(scale), None, None, None, stream=stream)


def sm90_tiles(head_dim: int, head_dim_v: int, causal: bool) -> dict:
  """FA4's forward tiles on sm_90 (tile_m, tile_n, P in registers for the PV product, overlap within a
  warpgroup)."""
  if head_dim <= 64:
    m, n, rs = 192, 128, True
  elif head_dim <= 96:
    m, n, rs = 192, (128 if causal else 144), False
  elif head_dim <= 128:
    m, n, rs = 128, 128, True
  elif head_dim <= 192:
    m, n, rs = 128, (128 if head_dim_v <= 128 else 112), True
  else:
    m, n, rs = 128, 80, True
  return {"tile_m": m, "tile_n": n, "mma_pv_is_rs": rs, "intra_wg_overlap": True}


def attention_forward(q, k, v, *, causal: bool, softmax_scale: float):
  """(output, log-sum-exp): FA4's forward kernel."""
  b, s, h, d = q.shape
  d_v = v.shape[-1]
  outputs = (jax.ShapeDtypeStruct((b, s, h, d_v), q.dtype), jax.ShapeDtypeStruct((b, h, s), F32))
  return jmf.cute_call(attention_launch, output_shape_dtype=outputs, head_dim=d, head_dim_v=d_v,
                       qhead_per_kvhead=h // k.shape[2], causal=causal, scale=softmax_scale,
                       **sm90_tiles(d, d_v, causal))(q, k, v)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def attention_backward(q, k, v, o, lse, do, dlse, *, causal: bool, softmax_scale: float):
  """(dq, dk, dv) from the forward's inputs, output and log-sum-exp and their cotangents: FA4's three (with
  grouped-query heads, five) backward kernels, as its `_flash_attn_bwd` runs them on sm_90."""
  (b, s, h, d), (s_k, h_k, d_v) = q.shape, v.shape[1:]
  c = _tile_size_bwd_sm90(d, d_v, causal, False)
  multiple = 64 if c.dKV_swapAB else 32  # the accumulators' head dimensions are rounded up to this
  d_r, d_v_r = _round_up(d, multiple), _round_up(d_v, multiple)
  s_r, s_k_r = _round_up(s, c.m_block_size), _round_up(s_k, c.n_block_size)
  mma_threads = c.num_wg * 128
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, F32)

  dpsum, lse_log2, dq_accum = jmf.cute_call(
      backward_preprocess_launch, output_shape_dtype=(f32(b, h, s_r), f32(b, h, s_r), f32(b, h, s_r * d_r)),
      head_dim=d, head_dim_v=d_v, tile_m=c.m_block_size, hdim_multiple_of=multiple)(o, do, lse, dlse)

  grouped = h != h_k
  if grouped:  # several query heads add into each dK and dV: fp32 accumulators, zeroed, aliased through the call
    dk_dv_in = (jnp.zeros((b, h_k, s_k_r * d_r), F32), jnp.zeros((b, h_k, s_k_r * d_v_r), F32))
    dk_dv_out = [f32(*a.shape) for a in dk_dv_in]
  else:
    dk_dv_in, dk_dv_out = (), [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
  dq_accum, dk, dv = jmf.cute_call(
      backward_launch, output_shape_dtype=(f32(*dq_accum.shape), *dk_dv_out),
      input_output_aliases={6: 0, 7: 1, 8: 2} if grouped else {6: 0},
      config=c, head_dim=d, head_dim_v=d_v, qhead_per_kvhead=h // h_k, causal=causal, scale=softmax_scale,
  )(q, k, v, do, lse_log2, dpsum, dq_accum, *dk_dv_in)

  def to_output(accum, like, head_dim, tile, num_threads, atom_layout, swap_ab, scale):
    return jmf.cute_call(backward_postprocess_launch, output_shape_dtype=jax.ShapeDtypeStruct(like.shape, like.dtype),
                         head_dim=head_dim, tile=tile, num_threads=num_threads, atom_layout=atom_layout,
                         swap_ab=swap_ab, hdim_multiple_of=multiple, scale=scale)(accum)

  dq = to_output(dq_accum, q, d, c.m_block_size, 128 if c.dQ_single_wg else mma_threads, c.AtomLayoutMdQ,
                 c.dQ_swapAB, softmax_scale)
  if grouped:
    dk = to_output(dk, k, d, c.n_block_size, mma_threads, c.AtomLayoutNdKV, c.dKV_swapAB, softmax_scale)
    dv = to_output(dv, v, d_v, c.n_block_size, mma_threads, c.AtomLayoutNdKV, c.dKV_swapAB, 1.0)
  return dq, dk, dv


@functools.cache
def _differentiable_attention(causal: bool, softmax_scale: float):
  """One `jmf.differentiable` per (causal, scale), so that its rules stay the same objects from call to call."""
  options = {"causal": causal, "softmax_scale": softmax_scale}
  return jmf.differentiable(functools.partial(attention_forward, **options),
                            bwd=functools.partial(attention_backward, **options),
                            residuals=("in0", "in1", "in2", "out0", "out1"))


def flash_attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None):
  """Attention over (batch, seqlen, heads, head_dim) arrays (fp16 or bf16; K and V may have fewer heads:
  grouped-query attention): the output, and the log-sum-exp of each row of scores, (batch, heads, seqlen_q).
  Differentiable (`jax.grad`, `jax.vjp`) in q, k and v, through both outputs, with FA4's backward kernels."""
  scale = float(softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5)
  return _differentiable_attention(bool(causal), scale)(q, k, v)


def attention_reference(q, k, v, *, causal: bool = False, softmax_scale: float | None = None):
  """(output, log-sum-exp) in float64 numpy."""
  out, lse, _ = _reference_with_weights(q, k, v, causal, softmax_scale)
  return out, lse


def attention_reference_grad(q, k, v, do, dlse=None, *, causal: bool = False, softmax_scale: float | None = None):
  """(dq, dk, dv) in float64 numpy: the gradient of <do, out> + <dlse, lse> (the standard softmax-attention
  backward: dP = dO V^T, dS = P * (dP - rowsum(dO * O) + dLSE))."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  do = np.asarray(do, np.float64)
  scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
  groups = q.shape[2] // k.shape[2]
  out, _, p = _reference_with_weights(q, k, v, causal, scale)
  k_, v_ = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
  dv = np.einsum("bhst,bshd->bthd", p, do)
  dp = np.einsum("bshd,bthd->bhst", do, v_)
  row = np.einsum("bshd,bshd->bhs", do, out)
  if dlse is not None:
    row = row - np.asarray(dlse, np.float64)
  ds = p * (dp - row[..., None]) * scale
  dq = np.einsum("bhst,bthd->bshd", ds, k_)
  dk = np.einsum("bhst,bshd->bthd", ds, q)
  fold = lambda g: g.reshape(g.shape[:2] + (k.shape[2], groups) + g.shape[3:]).sum(3)  # query heads -> kv heads
  return dq, fold(dk), fold(dv)


def _reference_with_weights(q, k, v, causal, softmax_scale):
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
  groups = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
  scores = np.einsum("bshd,bthd->bhst", q, k) * scale
  if causal:  # the bottom-right-aligned mask FA4 applies (seqlen_q == seqlen_k here: the usual lower triangle)
    s, t = scores.shape[-2:]
    scores = np.where(np.tril(np.ones((s, t), bool), k=t - s), scores, -np.inf)
  peak = scores.max(-1, keepdims=True)
  weights = np.exp(scores - peak)
  total = weights.sum(-1, keepdims=True)
  p = weights / total
  return np.einsum("bhst,bthd->bshd", p, v), (np.log(total) + peak)[..., 0], p
