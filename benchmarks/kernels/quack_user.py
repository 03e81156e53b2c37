"""quack's softmax (quack-kernels' `Softmax` / `SoftmaxBackward` CuTe DSL classes) called from JAX as a user of
jax_mosaic_ffi writes it: a three-line `@cute.jit` launcher per class, `jmf.cute_call`, and `jmf.differentiable`
for the gradient quack's own JAX binding (`quack.softmax_jax.softmax`, through jax-tvm-ffi) defines with
`jax.custom_vjp`. The kernels are quack's, unchanged; only the launch differs.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import jax
import numpy as np
from quack.softmax import Softmax, SoftmaxBackward

import jax_mosaic_ffi as jmf


@cute.jit
def softmax_launch(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor, *, N: cutlass.Constexpr):
  Softmax(x.element_type, N)(x, y, stream)


@cute.jit
def softmax_backward_launch(stream: cuda.CUstream, dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor, *,
                            N: cutlass.Constexpr):
  SoftmaxBackward(dy.element_type, N)(dy, y, dx, stream)


def _like(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def softmax_forward(x):
  """Rows of a 2-D array, as quack.softmax_jax.softmax takes them (fp16, bf16, fp32)."""
  return jmf.cute_call(softmax_launch, output_shape_dtype=_like(x), N=x.shape[1])(x)


def softmax_backward(y, dy):
  return jmf.cute_call(softmax_backward_launch, output_shape_dtype=_like(dy), N=dy.shape[1])(dy, y)


softmax = jmf.differentiable(softmax_forward, bwd=softmax_backward, residuals=("out0",))


def softmax_reference(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)
