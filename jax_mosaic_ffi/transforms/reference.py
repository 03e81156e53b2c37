"""A function's reference: the same function with every kernel call replaced by its fallback, and every derivative
rule around kernels (`jmf.differentiable`'s) dropped, so that JAX differentiates the fallbacks themselves.

    ref = reference(fn)        # jax.numpy only: jit, vmap, grad and jvp of it are JAX's own

It is an interpreter of ``fn``'s jaxpr: a ``mosaic_kernel`` equation evaluates its fallback (vmapped for a batched
call, with zeros for the scratch buffer); a ``custom_jvp`` / ``custom_vjp`` whose function calls kernels evaluates
that function (the rule is what a check compares against autodiff of this); ``jit``, ``checkpoint`` and other calls
are inlined; a sharded call (``mosaic_sharded``) evaluates its function; any other equation with kernels in its
jaxprs (``cond``, ``scan``, ``while``) gets those jaxprs interpreted. Equations without kernels are bound as they
are, custom derivative rules of jax.numpy code (``jax.nn.relu``'s) included.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
from jax._src import core

from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p
from jax_mosaic_ffi.transforms.autodiff import mosaic_linear_p
from jax_mosaic_ffi.transforms.sharding import mosaic_sharded_p

# Equations that only wrap a jaxpr: inlined.
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "remat2", "checkpoint", "custom_lin"})
# Custom derivatives: their function evaluated, their rule dropped, when the function calls kernels.
_CUSTOM = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})
_OURS = (mosaic_kernel_p, mosaic_sharded_p, mosaic_linear_p)
_ClosedJaxpr = getattr(core, "ClosedJaxpr", core.Jaxpr)  # one class since jax 0.12


class MissingFallback(LaunchError):
  """A kernel call without a fallback, where a check needs its reference."""


def reference(fn: Callable, on_rule: Callable | None = None) -> Callable:
  """``fn`` with every kernel replaced by its fallback (see the module's docstring). ``on_rule(eqn, args)`` is
  called for each custom derivative rule around kernels met, with its operands."""

  @functools.wraps(fn)
  def ref(*args):
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    jaxpr, consts = parts(closed)
    outs = evaluate(jaxpr, consts, jax.tree.leaves(args), on_rule)
    return jax.tree.unflatten(jax.tree.structure(shape), outs)

  return ref


def parts(value) -> tuple:
  """(the jaxpr to walk, its consts) of a closed or open jaxpr, in jax 0.11's classes or 0.12's."""
  return getattr(value, "jaxpr", value), list(getattr(value, "consts", ()))


def jaxprs(params) -> list:
  found = []
  for value in params.values():
    for v in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(v, (core.Jaxpr, _ClosedJaxpr)):
        found.append(v)
  return found


def calls_kernels(value) -> bool:
  """Whether a jaxpr (closed or open) calls a kernel anywhere inside."""
  jaxpr, _ = parts(value)
  return any(eqn.primitive in _OURS or any(calls_kernels(j) for j in jaxprs(eqn.params)) for eqn in jaxpr.eqns)


def bind(eqn, args) -> list:
  """The equation applied to ``args`` as jaxpr evaluation binds it (``get_bind_params``: jax 0.11 returns the
  subfunctions too)."""
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns, params = params if isinstance(params, tuple) else ((), params)
  out = eqn.primitive.bind(*subfuns, *args, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def evaluate(jaxpr, consts, args, on_rule=None) -> list:
  env = {}
  read = lambda v: v.val if isinstance(v, core.Literal) else env[v]  # noqa: E731
  for var, value in zip([*jaxpr.constvars, *jaxpr.invars], [*consts, *args]):
    env[var] = value
  for eqn in jaxpr.eqns:
    outs = _equation(eqn, [read(v) for v in eqn.invars], on_rule)
    for var, value in zip(eqn.outvars, outs):
      if not isinstance(var, core.DropVar):
        env[var] = value
  return [read(v) for v in jaxpr.outvars]


def _equation(eqn, args, on_rule) -> list:
  name = eqn.primitive.name
  if eqn.primitive is mosaic_kernel_p:
    spec = eqn.params["spec"]
    if spec.fallback is None:
      raise MissingFallback(
          f"{who(eqn.params['kernel'], spec.call_site)} has no fallback, so there is nothing to check it against: "
          "give it mosaic_kernel(..., fallback=fn) (a jax.numpy function of the same inputs returning the same "
          "outputs), or pass jmf.check(..., reference=fn) for the whole function")
    return list(spec.fallback.flat(*args))
  if eqn.primitive is mosaic_sharded_p:
    return _traced(lambda *a: list(eqn.params["fn"](*a)), args, on_rule)
  if eqn.primitive is mosaic_linear_p:  # a derivative applied inside fn itself: its rule, on the fallbacks
    forward, out_avals = eqn.params["forward"], eqn.params["out_avals"]
    if forward is None:
      return bind(eqn, args)  # raises the rule's own message
    outs = _traced(lambda *a: jax.tree.leaves(forward(*a), is_leaf=lambda x: x is None), args, on_rule)
    return [jax.numpy.zeros(a.shape, a.dtype) if o is None else o for o, a in zip(outs, out_avals)]
  inner = jaxprs(eqn.params)
  if not any(calls_kernels(j) for j in inner):
    return bind(eqn, args)
  if name in _CUSTOM or name in _CALLS:
    key = "call_jaxpr" if "call_jaxpr" in eqn.params else "fun_jaxpr" if "fun_jaxpr" in eqn.params else "jaxpr"
    if name in _CUSTOM and on_rule is not None:
      on_rule(eqn, args)
    jaxpr, consts = parts(eqn.params[key])
    return evaluate(jaxpr, consts, args, on_rule)
  # Control flow (cond, scan, while...): the same equation over interpreted jaxprs of the same types.
  params = {k: _interpreted(v, eqn, on_rule) for k, v in eqn.params.items()}
  return bind(eqn.replace(params=params), args)


def _traced(fn, args, on_rule) -> list:
  closed = jax.make_jaxpr(fn)(*args)
  jaxpr, consts = parts(closed)
  return evaluate(jaxpr, consts, args, on_rule)


def _interpreted(value, eqn, on_rule):
  if isinstance(value, (tuple, list)):
    return type(value)(_interpreted(v, eqn, on_rule) for v in value)
  if not isinstance(value, (core.Jaxpr, _ClosedJaxpr)) or not calls_kernels(value):
    return value
  jaxpr, consts = parts(value)
  new = jax.make_jaxpr(lambda *a: evaluate(jaxpr, consts, a, on_rule))(*value.in_avals)
  new_jaxpr, new_consts = parts(new)
  if new_consts and not consts:
    raise NotImplementedError(
        f"jmf.check cannot look inside this {eqn.primitive.name}: the fallbacks of the kernels it calls capture "
        "arrays. Build those arrays inside the fallbacks (jnp.asarray of a constant), or pass reference=")
  if value is jaxpr and not isinstance(value, _ClosedJaxpr):  # an open jaxpr (jax 0.11): its own class again
    return new_jaxpr
  return new
