"""jmf.differentiable: gradients, JVPs and their transformations, with kernels for the derivative.

On the CPU, jax.numpy stand-ins (and kernels with fallbacks) test the
plumbing; on a GPU, a CUDA softmax and its backward kernel are checked
against jax.nn.softmax and finite differences.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals
from jax.test_util import check_grads

import jax_mosaic_ffi as jmf

import kernel_sources

ROWS, COLS = 8, 100


def softmax_derivative(y, d):
  """Both the JVP (d a tangent) and the VJP (d a cotangent) of a row softmax."""
  return y * (d - jnp.sum(y * d, axis=-1, keepdims=True))


def reference_softmax(x):
  return jax.nn.softmax(x, axis=-1)


def standin_softmax(**kwargs):
  return jmf.differentiable(reference_softmax, bwd=softmax_derivative, residuals=("out0",), **kwargs)


def kernel_softmax(*, fallbacks: bool):
  """The CUDA softmax; with fallbacks, it also runs on the CPU."""
  fwd = jmf.mosaic_kernel(
      jmf.cuda_kernel(kernel_sources.SOFTMAX, "softmax_fwd"), out_shape=lambda x: x,
      grid=lambda x: x.size // x.shape[-1], block=256, scalars=lambda x: (np.int32(x.shape[-1]),),
      fallback=reference_softmax if fallbacks else None)
  bwd = jmf.mosaic_kernel(
      jmf.cuda_kernel(kernel_sources.SOFTMAX, "softmax_bwd"), out_shape=lambda y, d: y,
      grid=lambda y, d: y.size // y.shape[-1], block=256, scalars=lambda y, d: (np.int32(y.shape[-1]),),
      fallback=softmax_derivative if fallbacks else None)
  return jmf.differentiable(fwd, bwd=bwd, jvp=bwd, residuals=("out0",))


def normal(rng, *shape):
  return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def check_softmax(softmax, rng, rtol=1e-6, atol=1e-7):
  """Every autodiff entry point of ``softmax`` against jax.nn.softmax's, under jit and vmap."""
  x, w, t = normal(rng, ROWS, COLS), normal(rng, ROWS, COLS), normal(rng, ROWS, COLS)
  loss = lambda f: lambda x: jnp.sum(f(x) * w)  # noqa: E731
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)  # noqa: E731
  expected = jax.grad(loss(reference_softmax))(x)
  close(jax.grad(loss(softmax))(x), expected)
  close(jax.jit(jax.grad(loss(softmax)))(x), expected)
  close(jax.jit(jax.grad(jax.checkpoint(loss(softmax))))(x), expected)
  value, grad = jax.value_and_grad(loss(softmax))(x)
  close(value, loss(reference_softmax)(x))
  close(grad, expected)
  y, pullback = jax.vjp(softmax, x)
  close(y, reference_softmax(x))
  close(pullback(w)[0], expected)
  close(jax.jvp(softmax, (x,), (t,))[1], jax.jvp(reference_softmax, (x,), (t,))[1])
  close(jax.jit(lambda x, t: jax.jvp(softmax, (x,), (t,)))(x, t)[1], jax.jvp(reference_softmax, (x,), (t,))[1])
  # Per-example gradients: the loss of each row alone.
  per_row = lambda f: lambda row, w_row: jnp.sum(f(row) * w_row)  # noqa: E731
  expected_rows = jax.vmap(jax.grad(per_row(reference_softmax)))(x, w)
  close(jax.vmap(jax.grad(per_row(softmax)))(x, w), expected_rows)
  close(jax.jit(jax.vmap(jax.grad(per_row(softmax))))(x, w), expected_rows)
  close(jax.grad(lambda x: jnp.sum(jax.vmap(softmax)(x) * w))(x), expected)
  check_grads(softmax, (x,), order=1, modes=("fwd", "rev"))


def test_a_jax_numpy_stand_in_behaves_like_the_function_it_stands_for(rng):
  check_softmax(standin_softmax(jvp=softmax_derivative), rng)


@pytest.mark.parametrize("residuals, saved", [(("out0",), 1), (("in0", "out0"), 2)])
def test_only_the_named_residuals_are_kept_for_the_backward_pass(rng, residuals, saved):
  softmax = jmf.differentiable(reference_softmax, bwd=lambda *args: softmax_derivative(args[-2], args[-1]),
                               residuals=residuals)
  x = normal(rng, ROWS, COLS)
  kept = [aval for aval, _ in saved_residuals(softmax, x)]
  assert len(kept) == saved and all(a.shape == (ROWS, COLS) for a in kept)


def test_without_a_jvp_reverse_mode_works_and_forward_mode_says_what_to_add(rng):
  softmax = standin_softmax()
  x = normal(rng, ROWS, COLS)
  np.testing.assert_allclose(jax.grad(lambda x: softmax(x)[0, 0])(x), jax.grad(lambda x: reference_softmax(x)[0, 0])(x),
                             rtol=1e-6, atol=1e-7)
  for jvp in (jax.jvp, jax.jit(jax.jvp, static_argnums=0)):
    with pytest.raises(TypeError, match=r"no forward-mode derivative .*pass jvp=fn.* or linear=True"):
      jvp(softmax, (x,), (x,))


def test_second_derivatives_are_refused_by_name(rng):
  softmax = standin_softmax(jvp=softmax_derivative)
  with pytest.raises(NotImplementedError, match=r"jmf.differentiable\('reference_softmax'\): second derivatives"):
    jax.hessian(lambda x: softmax(x)[0, 0])(normal(rng, 2, 3))


def test_a_linear_function_gets_its_jvp_from_itself(rng):
  tripled = jmf.differentiable(lambda x: 3.0 * x, bwd=lambda g: 3.0 * g, linear=True)
  x, t = normal(rng, 16), normal(rng, 16)
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(tripled(x) ** 2))(x), 18.0 * x, rtol=1e-6)
  np.testing.assert_allclose(jax.jvp(tripled, (x,), (t,))[1], 3.0 * t, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(lambda x: tripled(x)[0])))(x.reshape(4, 4))[:, 0], 3.0)
  check_grads(tripled, (x,), order=1, modes=("fwd", "rev"))


def test_several_inputs_and_outputs_with_an_integer_input_and_a_zero_cotangent(rng):
  def fwd(a, b, idx):
    return a * b, (a + b)[idx]

  def jvp(a, b, idx, ta, tb):  # residuals in0, in1, in2, then the tangents of a and b
    return ta * b + a * tb, (ta + tb)[idx]

  def bwd(a, b, idx, g_prod, g_gather):
    g_sum = jnp.zeros_like(a).at[idx].add(g_gather)
    return g_prod * b + g_sum, None  # b's cotangent dropped on purpose: zero

  f = jmf.differentiable(fwd, bwd=bwd, jvp=jvp, residuals=("in0", "in1", "in2"))
  a, b, idx = normal(rng, 6), normal(rng, 6), jnp.array([5, 0, 0])
  ga, gb = jax.grad(lambda a, b: jnp.sum(f(a, b, idx)[0]) + jnp.sum(f(a, b, idx)[1]), argnums=(0, 1))(a, b)
  np.testing.assert_allclose(ga, b + np.bincount(np.asarray(idx), minlength=6), rtol=1e-6)
  np.testing.assert_array_equal(gb, np.zeros(6))
  tangents = jax.jvp(lambda a, b: f(a, b, idx), (a, b), (jnp.ones(6), jnp.zeros(6)))[1]
  np.testing.assert_allclose(tangents[0], b, rtol=1e-6)
  np.testing.assert_array_equal(tangents[1], np.ones(3))
  batched = jax.vmap(jax.grad(lambda a, i: f(a, b, i)[1].sum()))(jnp.stack([a, a]), jnp.stack([idx, idx[::-1]]))
  np.testing.assert_array_equal(batched, np.stack([np.bincount(np.asarray(idx), minlength=6)] * 2))


def test_plumbing_kernels_with_fallbacks_differentiate_on_the_cpu(rng, isolated_disk_cache):
  """Plumbing only: the fallbacks are the references, so this checks that every
  autodiff entry point reaches them, not the kernels. The kernels themselves
  are compared with jax's softmax by the GPU tests at the end of this file."""
  if jax.default_backend() != "cpu":
    pytest.skip("the GPU tests below run the kernels")
  check_softmax(kernel_softmax(fallbacks=True), rng)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(bwd=softmax_derivative, residuals="out0"), TypeError, r"residuals must be a sequence of names"),
    (dict(bwd=softmax_derivative, residuals=("y",)), TypeError, r"residuals must be a sequence of names"),
    (dict(bwd=softmax_derivative, jvp=softmax_derivative, linear=True), TypeError, r"not both"),
    (dict(bwd=None), TypeError, r"must be functions"),
])
def test_bad_arguments_are_refused_when_the_wrapper_is_made(kwargs, error, message):
  with pytest.raises(error, match=message):
    jmf.differentiable(reference_softmax, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(bwd=softmax_derivative, residuals=("out1",)), r"residual 'out1' names nothing; the call has 1 inputs"),
    (dict(bwd=lambda y, g: g[:, :2], residuals=("out0",)),
     r"bwd returned float32\[8, 2\] at position 0, where float32\[8, 100\] is needed"),
    (dict(bwd=lambda y, g: (g, g), residuals=("out0",)), r"bwd returned 2 values; it must return 1"),
])
def test_derivatives_of_the_wrong_shape_are_refused_by_name(rng, kwargs, message):
  f = jmf.differentiable(reference_softmax, **kwargs)
  with pytest.raises(jmf.LaunchError, match=r"jmf.differentiable\('reference_softmax'\): " + message):
    jax.grad(lambda x: f(x).sum())(normal(rng, ROWS, COLS))


def test_linear_needs_floating_point_inputs():
  f = jmf.differentiable(lambda x, i: x[i], bwd=lambda g: g, linear=True)
  with pytest.raises(jmf.LaunchError, match="linear=True needs floating-point inputs"):
    jax.grad(lambda x: f(x, jnp.array([0])).sum())(jnp.ones(3))


# ---------------------------------------------------------------- on a GPU

@pytest.mark.gpu
def test_cuda_softmax_gradients_match_jax_and_finite_differences(rng, isolated_disk_cache):
  # expf and the block reductions round differently from XLA's softmax.
  check_softmax(kernel_softmax(fallbacks=False), rng, rtol=2e-5, atol=1e-6)


@pytest.mark.gpu
def test_cuda_softmax_on_rows_longer_than_a_block_under_jit_and_vmap(rng, isolated_disk_cache):
  softmax = kernel_softmax(fallbacks=False)
  x, w = normal(rng, 3, 5, 1000), normal(rng, 3, 5, 1000)
  loss = lambda f: lambda x, w: jnp.sum(f(x) * w)  # noqa: E731
  got = jax.jit(jax.vmap(jax.value_and_grad(loss(softmax))))(x, w)
  expected = jax.vmap(jax.value_and_grad(loss(reference_softmax)))(x, w)
  np.testing.assert_allclose(np.asarray(got[0]), np.asarray(expected[0]), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got[1]), np.asarray(expected[1]), rtol=2e-5, atol=1e-6)
