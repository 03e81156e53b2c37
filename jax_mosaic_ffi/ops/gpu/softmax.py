"""Softmax over the last axis: jax 0.11's ``jax.experimental.pallas.ops.gpu.softmax`` (`softmax`) with the same
name, arguments and results, run by our own Triton kernel (kernels/softmax.py), plus `softmax_reference`::

    from jax_mosaic_ffi.ops.gpu import softmax   # was: from jax.experimental.pallas.ops.gpu import softmax
    probs = softmax.softmax(logits, axis=-1)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_mosaic_ffi.api import mosaic_kernel
from jax_mosaic_ffi.call.launch_values import cdiv
from jax_mosaic_ffi.ops.gpu import calls
from jax_mosaic_ffi.ops.gpu import norms
from jax_mosaic_ffi.transforms.autodiff import differentiable
from jax_mosaic_ffi.transforms.sharding_rules import BatchDims
from jax_mosaic_ffi.triton.kernel import triton_kernel


def softmax_reference(x: jax.Array, *, axis: int = -1) -> jax.Array:
  """`softmax` in jax.numpy (``jax.nn.softmax``, in float32, cast back to x's dtype); jax's Pallas module had no
  reference of its own.

    >>> from jax_mosaic_ffi.ops.gpu import softmax
    >>> softmax.softmax_reference(jnp.array([0.0, 0.0, 0.0, 0.0])).tolist()
    [0.25, 0.25, 0.25, 0.25]
  """
  return jax.nn.softmax(x.astype(jnp.float32), axis=axis).astype(x.dtype)


def _derivative(y, t):
  """d softmax at y applied to t (its own transpose): y * (t - sum(y * t))."""
  yf, tf = y.astype(jnp.float32), t.astype(jnp.float32)
  return (yf * (tf - jnp.sum(yf * tf, axis=-1, keepdims=True))).astype(y.dtype)


@calls.cached
def _function(n: int, rows_fill: int, num_warps: int | None):
  """(x (M, N),) -> softmax, with its derivative attached, jitted."""
  module = calls.kernels("softmax")
  options = dict(out_shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                 scalars=lambda meta, x: (calls.i32(x.shape[0]), calls.i32(x.shape[1])),
                 fallback=softmax_reference, sharding=BatchDims(0, 0))
  if n > norms.MAX_BLOCK_N:
    kernel = triton_kernel(module.softmax_forward_long, num_warps=num_warps or 8,
                           constexprs={"BLOCK_N": norms.LONG_BLOCK})
    call = mosaic_kernel(kernel, grid=lambda meta, x: x.shape[0], **options)
  else:
    configs = norms.row_configs(n, rows_fill, num_warps)
    grid = lambda meta, x: cdiv(x.shape[0], meta["BLOCK_M"])  # noqa: E731
    constexprs = {"BLOCK_N": calls.padded(n, 1)}
    if len(configs) == 1:
      fixed = dict(configs[0])
      warps, stages = fixed.pop("num_warps"), fixed.pop("num_stages")
      kernel = triton_kernel(module.softmax_forward, num_warps=warps, num_stages=stages,
                             constexprs={**constexprs, **fixed})
      call = mosaic_kernel(kernel, grid=grid, **options)
    else:
      call = mosaic_kernel(triton_kernel(module.softmax_forward, constexprs=constexprs), configs=configs, grid=grid,
                           **options)
  return jax.jit(differentiable(call, bwd=_derivative, jvp=_derivative, residuals=("out0",)))


def softmax(x: jax.Array, *, axis: int = -1, num_warps: int = 4, interpret: bool = False,
            debug: bool = False) -> jax.Array:
  """The softmax of x along ``axis`` (the last one only, as Pallas's), computed in float32, in x's dtype.

  jax 0.11's Pallas ``softmax``, argument for argument. ``num_warps`` left at 4 (the default) autotunes warps
  and rows per program on the GPU, Pallas's 4 warps and one row first; another value is used as given.
  ``interpret`` and ``debug`` were Pallas's: accepted and ignored. Unlike Pallas's, it has a gradient (and a
  JVP). Without a GPU the reference math runs::

    >>> from jax_mosaic_ffi.ops.gpu import softmax
    >>> softmax.softmax(jnp.zeros((2, 4))).tolist()[0]
    [0.25, 0.25, 0.25, 0.25]
  """
  del interpret, debug
  axis = axis if axis >= 0 else len(x.shape) + axis
  if axis != len(x.shape) - 1:
    raise NotImplementedError("reductions along non-trailing dimension unsupported")
  n = x.shape[-1]
  rows = x.size // n if n else 0
  fn = _function(n, calls.padded(rows, 1), None if num_warps == 4 else num_warps)
  return fn(x.reshape(rows, n)).reshape(x.shape)
