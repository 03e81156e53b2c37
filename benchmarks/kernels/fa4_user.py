"""FlashAttention-4's Hopper forward kernel (flash-attn-4's `FlashAttentionForwardSm90` CuTe DSL class, unchanged)
called from JAX as a user of jax_mosaic_ffi writes it: one `@cute.jit` launcher and `jmf.cute_call`. FA4 itself
has no JAX binding; its own launcher is `flash_attn.cute.flash_attn_func` on torch tensors.

The tiles are FA4's own choice for the H100/H200 (`_tile_size_fwd_sm90` in flash_attn/cute/interface.py), by head
dimension; its launcher also runs 384 threads (three warpgroups) and two stages there.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import jax
import jax.numpy as jnp
import numpy as np
from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90

import jax_mosaic_ffi as jmf


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


def flash_attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None):
  """Attention over (batch, seqlen, heads, head_dim) arrays (fp16 or bf16; K and V may have fewer heads:
  grouped-query attention): the output, and the log-sum-exp of each row of scores, (batch, heads, seqlen_q)."""
  b, s, h, d = q.shape
  dv = v.shape[-1]
  scale = float(softmax_scale if softmax_scale is not None else d ** -0.5)
  outputs = (jax.ShapeDtypeStruct((b, s, h, dv), q.dtype), jax.ShapeDtypeStruct((b, h, s), jnp.float32))
  return jmf.cute_call(attention_launch, output_shape_dtype=outputs, head_dim=d, head_dim_v=dv,
                       qhead_per_kvhead=h // k.shape[2], causal=bool(causal), scale=scale,
                       **sm90_tiles(d, dv, causal))(q, k, v)


def attention_reference(q, k, v, *, causal: bool = False, softmax_scale: float | None = None):
  """(output, log-sum-exp) in float64 numpy."""
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
  out = np.einsum("bhst,bthd->bshd", weights / total, v)
  return out, (np.log(total) + peak)[..., 0]
