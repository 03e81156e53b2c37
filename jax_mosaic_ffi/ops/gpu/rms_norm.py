"""RMS normalization with a fused backward: jax 0.11's ``jax.experimental.pallas.ops.gpu.rms_norm``
(`rms_norm`, `rms_norm_reference`) with the same names, arguments and results, run by our own Triton kernels
(kernels/norms.py, without the mean)::

    from jax_mosaic_ffi.ops.gpu import rms_norm   # was: from jax.experimental.pallas.ops.gpu import rms_norm
    y = rms_norm.rms_norm(x, weight, bias)        # x (batch, seq_len, N), weight and bias (N,)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jax_mosaic_ffi.ops.gpu import norms


def rms_norm(x, weight, bias, num_warps: int | None = None, num_stages: int | None = 3, eps: float = 1e-5,
             backward_pass_impl: str = "triton", interpret: bool = False):
  """``x / sqrt(mean(x**2) + eps) * weight + bias`` over x's last axis; jax 0.11's Pallas ``rms_norm``,
  argument for argument, with a gradient for x, weight and bias. The arguments are `layer_norm`'s.

    >>> from jax_mosaic_ffi.ops.gpu import rms_norm
    >>> x = jnp.full((1, 2, 4), 2.0)
    >>> [round(float(y), 3) for y in rms_norm.rms_norm(x, jnp.ones(4), jnp.zeros(4))[0, 0]]
    [1.0, 1.0, 1.0, 1.0]
  """
  del num_stages, interpret
  norm = norms.Norm(False, float(eps), num_warps, backward_pass_impl)
  return norms.apply(norm, "rms_norm", x, weight, bias)


@jax.jit(static_argnames=["eps"])
@functools.partial(jax.vmap, in_axes=(0, None, None), out_axes=0)
def rms_norm_reference(x, weight, bias, *, eps: float = 1e-5):
  """`rms_norm` in jax.numpy, as jax 0.11's Pallas ``rms_norm_reference``: x (batch, seq_len, N).

    >>> from jax_mosaic_ffi.ops.gpu import rms_norm
    >>> rms_norm.rms_norm_reference(jnp.ones((2, 3, 4)), jnp.ones(4), jnp.zeros(4)).shape
    (2, 3, 4)
  """
  var = jnp.mean(jnp.square(x), axis=1)
  mul = lax.rsqrt(var + eps)
  return x * mul[:, None] * weight[None] + bias[None]
