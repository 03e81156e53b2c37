"""Layer normalization with a fused backward: jax 0.11's ``jax.experimental.pallas.ops.gpu.layer_norm``
(`layer_norm`, `layer_norm_reference`) with the same names, arguments and results, run by our own Triton
kernels (kernels/norms.py: a row read once and written once, each program's dw and db sums made by the dx kernel)::

    from jax_mosaic_ffi.ops.gpu import layer_norm   # was: from jax.experimental.pallas.ops.gpu import layer_norm
    y = layer_norm.layer_norm(x, weight, bias)      # x (batch, seq_len, N), weight and bias (N,)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jax_mosaic_ffi.ops.gpu import norms


def layer_norm(x, weight, bias, num_warps: int | None = None, num_stages: int | None = 3, eps: float = 1e-5,
               backward_pass_impl: str = "triton", interpret: bool = False):
  """``(x - mean) / sqrt(var + eps) * weight + bias`` over x's last axis; jax 0.11's Pallas ``layer_norm``,
  argument for argument, with a gradient for x, weight and bias.

  Args:
    x: (batch, seq_len, N), as Pallas's (any rank works: the last axis is normalized); float32, float16 or
      bfloat16. Statistics are float32.
    weight, bias: (N,).
    num_warps: None (the default) autotunes warps and rows per program on the GPU, Pallas's choice first;
      a number is used as given (Pallas ignored it).
    num_stages: Pallas's software pipelining, which a one-pass row kernel does not use: accepted, ignored.
    eps: added to the variance.
    backward_pass_impl: ``"triton"`` (our backward kernel) or ``"xla"`` (autodiff of the reference math).
    interpret: Pallas's interpreter: accepted, ignored.

  Returns:
    x's shape and dtype. Without a GPU the reference math runs::

    >>> from jax_mosaic_ffi.ops.gpu import layer_norm
    >>> x = jnp.arange(8.0).reshape(1, 2, 4)
    >>> [round(float(y), 3) for y in layer_norm.layer_norm(x, jnp.ones(4), jnp.zeros(4))[0, 0]]
    [-1.342, -0.447, 0.447, 1.342]
  """
  del num_stages, interpret
  norm = norms.Norm(True, float(eps), num_warps, backward_pass_impl)
  return norms.apply(norm, "layer_norm", x, weight, bias)


@jax.jit(static_argnames=["eps"])
@functools.partial(jax.vmap, in_axes=(0, None, None), out_axes=0)
def layer_norm_reference(x, weight, bias, *, eps: float = 1e-5):
  """`layer_norm` in jax.numpy, as jax 0.11's Pallas ``layer_norm_reference``: x (batch, seq_len, N).

    >>> from jax_mosaic_ffi.ops.gpu import layer_norm
    >>> layer_norm.layer_norm_reference(jnp.ones((2, 3, 4)), jnp.ones(4), jnp.zeros(4)).shape
    (2, 3, 4)
  """
  mean = jnp.mean(x, axis=1)
  mean2 = jnp.mean(jnp.square(x), axis=1)
  var = jnp.maximum(0., mean2 - jnp.square(mean))
  y = x - mean[:, None]
  mul = lax.rsqrt(var + eps)
  return y * mul[:, None] * weight[None] + bias[None]
