"""The `mosaic_kernel` primitive: the call that binds it, abstract eval, vmap, and the missing derivative.

Each call of `kernel_call`'s function builds the launch for its input avals
(`CheckedLaunch.spec`), has the runtime's validator check it, and binds one
`mosaic_kernel` primitive. The CUDA lowering is in `lowering.py`; the
public entry point, `mosaic_kernel`, in `api.py`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.extend
import jax.numpy as jnp
from jax._src import dispatch
from jax.interpreters import ad, batching
from jax.interpreters import partial_eval as pe

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call import launch_spec
from jax_mosaic_ffi.call.launch_options import CheckedLaunch


# Set while a derivative rule (jmf.differentiable's) runs its forward function: the kernels bound there
# carry its name in their spec, so that differentiating them again (a second derivative) says so,
# even when that happens later, from a staged jaxpr.
_derivative_rule: contextvars.ContextVar[str | None] = contextvars.ContextVar("jmf_derivative_rule", default=None)

SECOND_DERIVATIVE_ADVICE = (
    "second derivatives (jax.hessian, grad of grad, jvp of grad) are not supported: {rule} gives first "
    "derivatives only, and JAX cannot see inside the kernels. For a second derivative, differentiate a "
    "jax.numpy version of the function, or a jax.custom_jvp of it whose jvp rule is itself differentiable")


@contextlib.contextmanager
def in_derivative_rule(rule: str):
  """Marks the kernel calls made inside ``rule`` (a derivative rule, named as messages name it)."""
  token = _derivative_rule.set(rule)
  try:
    yield
  finally:
    _derivative_rule.reset(token)


def kernel_call(launch: CheckedLaunch, fallback: fallback_lib.Fallback | None) -> Callable[..., Any]:
  """The function of arrays that launches a checked kernel call: one `mosaic_kernel_p` per trace."""
  kernel = launch.kernel

  def call(*args):
    in_avals = tuple(jax.typeof(a) for a in args)
    spec, out_avals, single = launch.spec(in_avals, source_location.current())
    if launch_spec.empty_outputs(out_avals):
      # Nothing to write, so nothing to launch.
      aliased = {o: i for i, o in spec.aliases}
      outs = [args[aliased[o]] if o in aliased else jnp.zeros(a.shape, a.dtype) for o, a in enumerate(out_avals)]
      return outs[0] if single else tuple(outs)
    launch.check(spec, in_avals, out_avals)
    returned = len(out_avals) - spec.num_scratch
    if fallback is not None:
      fallback_lib.check(fallback, in_avals, out_avals[:returned], single, who(kernel, spec.call_site))
      spec = dataclasses.replace(spec, fallback=fallback_lib.with_scratch(fallback, out_avals[returned:]))
    rule = _derivative_rule.get()
    if rule is not None:
      spec = dataclasses.replace(spec, derivative_rule=rule)
    outs = mosaic_kernel_p.bind(*args, kernel=kernel, out_avals=out_avals, spec=spec)[:returned]
    return outs[0] if single else tuple(outs)

  call.__qualname__ = kernel.name  # how messages (jmf.differentiable's) name the wrapper
  return call


mosaic_kernel_p = jax.extend.core.Primitive("mosaic_kernel")
mosaic_kernel_p.multiple_results = True
mosaic_kernel_p.__doc__ = """The JAX primitive of one kernel launch, bound by every `mosaic_kernel` call.

It shows in jaxprs as ``mosaic_kernel``; its parameters are the kernel, the
output avals and the checked launch. Look for it in a jaxpr
(``jax.make_jaxpr``) or register rules for it; to launch a kernel, call
`mosaic_kernel` instead of binding it::

  >>> kernel = jmf.cuda_kernel('extern "C" __global__ void copy(const float* x, float* y) {}', "copy")
  >>> copy = jmf.mosaic_kernel(kernel, lambda x: x, grid=1, block=8)
  >>> [e.primitive for e in jax.make_jaxpr(copy)(jnp.ones(8)).eqns] == [jmf.mosaic_kernel_p]
  True
"""
# Outside jit, a call compiles the primitive alone (jax.grad runs the forward eagerly).
mosaic_kernel_p.def_impl(functools.partial(dispatch.apply_primitive, mosaic_kernel_p))


@mosaic_kernel_p.def_abstract_eval
def _abstract_eval(*avals, kernel, out_avals, spec):
  return out_avals


def _batching_rule(args, dims, *, kernel, out_avals, spec):
  """vmap as one call: every buffer gets a leading batch axis, and the kernel
  runs once per element (or once, on a longer grid axis, with batch_grid_axis).
  A TMA descriptor (TensorMap) is encoded per element, at that element's address.

  Inputs no element changes stay shared (stride 0). A call that is batched
  already (nested vmap) has its batch axes merged into one: buffers batched
  at only one level are broadcast, so each element sits one stride after the
  last. Aliased inputs are batched too, since each element updates its own.
  """
  where = who(kernel, spec.call_site)
  if spec.collective is not None:
    raise LaunchError(
        f"{where}: a collective kernel cannot be vmapped: its peers are devices, not batch elements. "
        "Call it inside shard_map over a mesh axis instead")
  if spec.launch_programs:
    raise LaunchError(
        f"{where}: a kernel whose grid or scalars depend on symbolic dimensions (jax.export) cannot be vmapped: "
        "the batch would change the shapes its launch is computed from. Call it in a lax.map, or export once per "
        "concrete size")
  if spec.tensor_maps and spec.batch_grid_axis is not None:
    raise LaunchError(
        f"{where}: a kernel with TensorMap parameters cannot be vmapped on a grid axis (batch_grid_axis): its one "
        "launch would get one element's descriptors. Leave batch_grid_axis out (each element is then launched "
        "with descriptors of its own), or give the kernel the batch as a leading array axis")
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  inner = spec.batch_size
  inner_batched = [s > 0 for s in spec.batch_strides[:len(args)]] if inner > 1 else [False] * len(args)
  aliased = {i for i, _ in spec.aliases}
  total = size * inner
  new_args = []
  for i, (a, d, was_batched) in enumerate(zip(args, dims, inner_batched)):
    if d is None and not was_batched and i not in aliased:
      new_args.append(a)
      continue
    a = jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size, *a.shape))
    if inner > 1:
      if not was_batched:
        a = jnp.broadcast_to(a[:, None], (size, inner, *a.shape[1:]))
      a = a.reshape((total, *a.shape[2:]))
    new_args.append(a)
  per_element_out = [a.shape[1:] if inner > 1 else a.shape for a in out_avals]
  new_out_avals = tuple(jax.core.ShapedArray((total, *shape), a.dtype) for shape, a in zip(per_element_out, out_avals))
  strides = [0 if (d is None and not b and i not in aliased) else _element_bytes(a, total)
             for i, (a, d, b) in enumerate(zip(new_args, dims, inner_batched))]
  strides += [_element_bytes(a, total) for a in new_out_avals]
  # What the compiled code assumes of its buffers' addresses (a front end's kernel says), which each batch
  # element's offset must keep.
  misaligned = kernel.batch_misalignment(tuple(strides), spec.param_order, len(args))
  if misaligned:
    raise LaunchError(f"{where}: under vmap {misaligned}")
  if total == 0:
    outs = [jnp.zeros(a.shape, a.dtype) for a in new_out_avals]
  else:
    fallback = spec.fallback and spec.fallback.vmapped(tuple(0 if s else None for s in strides[:len(args)]))
    batched = dataclasses.replace(spec, batch_size=total, batch_strides=tuple(strides), fallback=fallback)
    launch_spec.check_launch(kernel, batched, [jax.typeof(a) for a in new_args], new_out_avals)
    outs = mosaic_kernel_p.bind(*new_args, kernel=kernel, out_avals=new_out_avals, spec=batched)
  outs = [o.reshape((size, inner, *shape)) if inner > 1 else o for o, shape in zip(outs, per_element_out)]
  return outs, [0] * len(outs)


def _element_bytes(aval, batch: int) -> int:
  return math.prod(aval.shape) * aval.dtype.itemsize // max(batch, 1)


batching.primitive_batchers[mosaic_kernel_p] = _batching_rule


def _dce_rule(used_outputs, *rest):
  """A call with unused results is dropped, unless it has side effects (``has_side_effect``). The rule's
  arguments are (used_outputs, eqn) in jax 0.11 and (used_outputs, live_inputs, eqn) in jax 0.12."""
  eqn = rest[-1]
  if not any(used_outputs) and not eqn.params["spec"].has_side_effect:
    return [False] * len(eqn.invars), None
  return [True] * len(eqn.invars), eqn


pe.dce_rules[mosaic_kernel_p] = _dce_rule


def _no_derivative(primals, tangents, *, kernel, spec, **_):
  if spec.derivative_rule is not None:
    raise NotImplementedError(f"{who(kernel, spec.call_site)}: "
                              + SECOND_DERIVATIVE_ADVICE.format(rule=spec.derivative_rule))
  raise TypeError(
      f"{who(kernel, spec.call_site)} has no derivative: JAX cannot see inside a hand-written "
      "kernel. Attach one with jmf.differentiable(forward, bwd=..., residuals=(...)), whose backward (and "
      "jvp) can be other mosaic_kernel calls; docs/guides/transformations.md (grad and jvp) shows how.")


ad.primitive_jvps[mosaic_kernel_p] = _no_derivative

__all__ = ["SECOND_DERIVATIVE_ADVICE", "in_derivative_rule", "kernel_call", "mosaic_kernel_p"]
