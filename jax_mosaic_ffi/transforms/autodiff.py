"""`differentiable`: derivatives for a kernel call, given as other kernels (or any JAX functions).

    softmax = jmf.differentiable(softmax_fwd, bwd=softmax_bwd, jvp=softmax_jvp, residuals=("out0",))

The derivative of ``fwd`` at a point is a linear map that depends on a few
saved values, the residuals (forward inputs ``inN`` and outputs ``outN``,
by name). ``jvp(*residuals, *tangents)`` applies it forwards;
``bwd(*residuals, *cotangents)`` applies its transpose. Both are optional
ways to compute the same map, and a kernel often serves as both ends.

How the pieces fit, in JAX's terms: the result is a `jax.custom_jvp`
whose rule runs ``fwd`` and then one `mosaic_linear` primitive on the
residuals and the tangents. That primitive is linear in the tangents and
its transpose is the same primitive with ``jvp`` and ``bwd`` swapped,
so `jax.jvp` evaluates ``jvp``, and `jax.grad` / `jax.vjp` stage it and
transpose it into ``bwd``. Only the named residuals are saved. (JAX's own
`jax.custom_derivatives.linear_call` does the same but has no vmap rule,
and `jax.custom_vjp` refuses forward mode; this primitive has both.)

* ``linear=True``: ``fwd`` is linear in its inputs (a scale, a transpose,
  an FFT), so its JVP is ``fwd`` applied to the tangents and ``bwd`` is its
  transpose; no ``jvp`` is needed.
* no ``jvp`` and not linear: reverse mode only; `jax.jvp` raises, saying
  what to add.

Integer inputs and outputs (indices) have no tangents: ``jvp`` gets the
tangents of the floating-point inputs only, in order, and returns those of
the floating-point outputs; ``bwd`` gets the cotangents of the
floating-point outputs and returns those of the floating-point inputs
(None for zero). One array, or a tuple when there are several.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import dispatch
from jax._src.interpreters import mlir
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call.operands import Kind
from jax_mosaic_ffi.call.primitive import SECOND_DERIVATIVE_ADVICE, in_derivative_rule

def _floating(x) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _leaves(out) -> list:
  return list(out) if isinstance(out, (tuple, list)) else [out]


def differentiable(fwd: Callable, *, bwd: Callable, residuals: Sequence[str] = (), jvp: Callable | None = None,
                   linear: bool = False) -> Callable:
  """``fwd`` with derivatives: ``bwd`` for reverse mode, ``jvp`` (or ``linear=True``) for forward mode.

  JAX cannot see inside a hand-written kernel, so its derivatives are given, as other kernel calls or any
  JAX functions of a few saved values, the residuals (:doc:`grad and jvp </guides/transformations>`)::

    >>> kernel = jmf.cuda_kernel(
    ...     'extern "C" __global__ void square(const float* x, float* y, int n) {'
    ...     '  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] * x[i]; }', "square")
    >>> square = jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256), block=256,
    ...                            scalars=lambda x: (np.int32(x.size),), fallback=lambda x: x * x)
    >>> square_d = jmf.differentiable(square, bwd=lambda x, g: 2 * x * g, jvp=lambda x, t: 2 * x * t,
    ...                               residuals=("in0",))        # d(x^2) = 2 x dx: keeps x
    >>> jax.grad(lambda x: square_d(x).sum())(jnp.arange(3.0)).tolist()
    [0.0, 2.0, 4.0]

  Args:
    fwd: arrays in, one array or a tuple of arrays out; typically a
      `mosaic_kernel` call.
    bwd: ``bwd(*residuals, *cotangents)`` -> the cotangents of the
      floating-point inputs (one array, or a tuple; None for zero).
    residuals: what ``bwd`` and ``jvp`` need, by name: ``"in0"``,
      ``"out1"``... Only these are kept for the backward pass.
    jvp: ``jvp(*residuals, *tangents)`` -> the tangents of the
      floating-point outputs. Makes `jax.jvp` work.
    linear: ``fwd`` is linear in its inputs, so its JVP is ``fwd`` itself.

  Returns:
    A function like ``fwd`` that `jax.grad`, `jax.vjp`, `jax.jvp` (with ``jvp`` or ``linear``), `jax.vmap`
    and `jax.checkpoint` accept in any nesting; second derivatives are refused.
  """
  where = f"jmf.differentiable({getattr(fwd, '__qualname__', fwd)!r})"
  if not callable(fwd) or not callable(bwd) or (jvp is not None and not callable(jvp)):
    raise TypeError(f"{where}: fwd, bwd (and jvp, if given) must be functions of arrays")
  if jvp is not None and linear:
    raise TypeError(f"{where}: give jvp= or linear=True, not both (linear=True means the JVP is fwd itself)")
  refs = None if isinstance(residuals, str) else [operands.parse(r) for r in residuals]
  if refs is None or not all(ref is not None and ref.kind in (Kind.IN, Kind.OUT) for ref in refs):
    raise TypeError(f"{where}: residuals must be a sequence of names like ('in0', 'out0'), got {residuals!r}")
  residuals = tuple(refs)
  # Made once, so eager calls of the linear map hit JAX's compile cache.
  linear_forward = _drop_residuals(fwd, len(residuals)) if linear else None

  @jax.custom_jvp
  def call(*args):
    return fwd(*args)

  @call.defjvp
  def _rule(primals, tangents):
    with in_derivative_rule(where):
      outs = fwd(*primals)
    out_leaves = _leaves(outs)
    saved = []
    for ref in residuals:
      pool = primals if ref.kind is Kind.IN else out_leaves
      if ref.index >= len(pool):
        raise LaunchError(f"{where}: residual {str(ref)!r} names nothing; the call has {len(primals)} inputs and "
                          f"{len(out_leaves)} outputs")
      saved.append(pool[ref.index])
    diff_in = [i for i, x in enumerate(primals) if _floating(x)]
    diff_out = [o for o, y in enumerate(out_leaves) if _floating(y)]
    forward = jvp
    if linear:
      if len(diff_in) != len(primals) or len(diff_out) != len(out_leaves):
        raise LaunchError(f"{where}: linear=True needs floating-point inputs and outputs only; for integer "
                          "ones (indices) give jvp= with the indices as residuals")
      forward = linear_forward
    t_out = mosaic_linear_p.bind(
        *saved, *(tangents[i] for i in diff_in),
        forward=forward, transpose=bwd, names=("jvp", "bwd"), num_res=len(saved), where=where,
        out_avals=tuple(_aval(out_leaves[o]) for o in diff_out),
        in_avals=tuple(_aval(primals[i]) for i in diff_in))
    tangent_leaves = [np.zeros(jnp.shape(y), jax.dtypes.float0) for y in out_leaves]
    for o, t in zip(diff_out, t_out):
      tangent_leaves[o] = t
    return outs, (type(outs)(tangent_leaves) if isinstance(outs, (tuple, list)) else tangent_leaves[0])

  return call


def _aval(x) -> jax.core.ShapedArray:
  return jax.core.ShapedArray(jnp.shape(x), jnp.result_type(x))


def _drop_residuals(fn: Callable, num_res: int) -> Callable:
  return lambda *args: fn(*args[num_res:])


# --------------------------------------------------------- the primitive
#
# mosaic_linear(*residuals, *linear_args): forward(*residuals, *linear_args),
# linear in linear_args, with transpose(*residuals, *cotangents) as its
# transpose. Python callables ride in the params (compared by identity).

mosaic_linear_p = Primitive("mosaic_linear")
mosaic_linear_p.multiple_results = True
mosaic_linear_p.def_abstract_eval(lambda *avals, out_avals, **_: out_avals)
mosaic_linear_p.def_impl(functools.partial(dispatch.apply_primitive, mosaic_linear_p))
# Run eagerly (jax.grad without jit), it is lowered on its own; a sharded call inside its transpose (sharding= on a
# backward kernel, as the transformations guide suggests) needs the devices then, as mosaic_sharded_p does.
dispatch.prim_requires_devices_during_lowering.add(mosaic_linear_p)


def _evaluate(fn, args, *, out_avals, names, where) -> list:
  """Calls ``fn`` and checks that it returns what its transpose takes."""
  if fn is None:
    raise TypeError(
        f"{where} has no forward-mode derivative (jax.jvp, jax.linearize, jax.jacfwd): pass "
        "jvp=fn, with fn(*residuals, *tangents) returning the tangents of the outputs, or linear=True if "
        "the forward function is linear in its inputs")
  out = fn(*args)
  leaves = _leaves(out)
  if len(leaves) != len(out_avals):
    raise LaunchError(f"{where}: {names[0]} returned {len(leaves)} values; it must return "
                      f"{len(out_avals)} (one per floating-point {'output' if names[0] == 'jvp' else 'input'})")
  result = []
  for k, (o, a) in enumerate(zip(leaves, out_avals)):
    if o is None:
      result.append(jnp.zeros(a.shape, a.dtype))
      continue
    if tuple(jnp.shape(o)) != a.shape or jnp.result_type(o) != a.dtype:
      raise LaunchError(f"{where}: {names[0]} returned {jnp.result_type(o)}{list(jnp.shape(o))} at position {k}, "
                        f"where {a.dtype}{list(a.shape)} is needed; return that shape and dtype (use .astype)")
    result.append(o)
  return result


def _lowering(ctx, *operands, forward, out_avals, names, where, **_):
  run = functools.partial(_evaluate, forward, out_avals=out_avals, names=names, where=where)
  return mlir.lower_fun(lambda *args: run(args), multiple_results=True)(ctx, *operands)


def _transpose(cts, *args, forward, transpose, names, num_res, out_avals, in_avals, where):
  residuals = args[:num_res]
  if any(ad.is_undefined_primal(r) for r in residuals):
    raise NotImplementedError(f"{where}: a residual depends on the differentiated inputs here: "
                              + SECOND_DERIVATIVE_ADVICE.format(rule=where))
  cts = [ad.instantiate_zeros(ct) if type(ct) is ad.Zero else ct for ct in cts]
  outs = mosaic_linear_p.bind(*residuals, *cts, forward=transpose, transpose=forward, names=names[::-1],
                              num_res=num_res, out_avals=in_avals, in_avals=out_avals, where=where)
  return [None] * num_res + list(outs)


def _jvp(primals, tangents, *, num_res, where, **params):
  if any(type(t) is not ad.Zero for t in tangents[:num_res]):
    raise NotImplementedError(f"{where}: " + SECOND_DERIVATIVE_ADVICE.format(rule=where))
  outs = mosaic_linear_p.bind(*primals, num_res=num_res, where=where, **params)
  lin = [ad.instantiate_zeros(t) for t in tangents[num_res:]]
  return outs, mosaic_linear_p.bind(*primals[:num_res], *lin, num_res=num_res, where=where, **params)


def _batching(args, dims, *, forward, transpose, num_res, out_avals, in_avals, **params):
  """Residuals keep their batch dimension (or none); linear arguments and
  outputs are batched along 0, so the transpose's batched inputs are what
  the forward's batched outputs are."""
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  res = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args[:num_res], dims[:num_res])]
  lin = [jnp.broadcast_to(a, (size,) + a.shape) if d is None else jnp.moveaxis(a, d, 0)
         for a, d in zip(args[num_res:], dims[num_res:])]
  axes = [None if d is None else 0 for d in dims[:num_res]] + [0] * len(lin)
  batch = lambda fn: None if fn is None else jax.vmap(fn, in_axes=tuple(axes), out_axes=0)  # noqa: E731
  grow = lambda avals: tuple(jax.core.ShapedArray((size,) + a.shape, a.dtype) for a in avals)  # noqa: E731
  outs = mosaic_linear_p.bind(*res, *lin, forward=batch(forward), transpose=batch(transpose), num_res=num_res,
                              out_avals=grow(out_avals), in_avals=grow(in_avals), **params)
  return outs, [0] * len(outs)


mlir.register_lowering(mosaic_linear_p, _lowering)
ad.primitive_transposes[mosaic_linear_p] = _transpose
ad.primitive_jvps[mosaic_linear_p] = _jvp
batching.primitive_batchers[mosaic_linear_p] = _batching
