"""`mosaic_kernel(..., configs=[...], fallback=fn)` where no config can be timed (no GPU): nothing compiled,
nothing chosen, nothing said, unless a program is lowered for CUDA.

Without a GPU the fallback runs, so building and picking a config at trace time (as `Autotuned` does) would
compile a kernel that never runs and warn that it was not timed. Here the call binds
`mosaic_autotuned_untimed_p` instead, whose outputs are the fallback's. Off CUDA it lowers to the fallback;
lowered for CUDA (a ``jax.export`` or ``.lower(lowering_platforms=("cuda",))`` from this machine), it builds the
autotuner's choice there (the ``default`` config, with `AutotuneSkipped`) and lowers that call: the kernel
is compiled only for a program that holds it.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Sequence

import jax
import jax.extend
from jax._src import dispatch
from jax._src.interpreters import mlir
from jax.interpreters import ad, batching

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.call.comparison import shadow
from jax_mosaic_ffi.transforms import autotune as autotune_lib
from jax_mosaic_ffi.transforms import tuning_packs

mosaic_autotuned_untimed_p = jax.extend.core.Primitive("mosaic_autotuned_untimed")
mosaic_autotuned_untimed_p.multiple_results = True


class WithFallback(autotune_lib.Autotuned):
  """An `Autotuned` whose every config's call has the same ``fallback``: where nothing can be timed, a call of
  it binds `mosaic_autotuned_untimed_p` instead of building a config (the rest is `Autotuned`'s)."""

  def __init__(self, factory: Callable[[dict], Callable], configs, *, fallback: Callable, **kwargs):
    super().__init__(factory, configs, **kwargs)
    self.fallback = fallback

  def __call__(self, *args):
    if _can_time():
      return super().__call__(*args)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in map(jax.typeof, args)]
    if tuning_packs.recording():  # recording for a pack: every config is built here, and the decision noted
      self.choose(*avals)
    out = jax.eval_shape(self.fallback, *avals)
    single = not isinstance(out, (tuple, list))
    outs = mosaic_autotuned_untimed_p.bind(
        *args, tuned=self, fallback=_flat(self.fallback), site=source_location.current(), in_axes=(),
        out_avals=tuple(jax.core.ShapedArray(o.shape, o.dtype) for o in ([out] if single else out)))
    return outs[0] if single else tuple(outs)


def _can_time() -> bool:
  """Whether `Autotuned` times configs here: on a GPU, or on the CPU where asked (autotune.CPU_ENV)."""
  return jax.devices()[0].platform in ("gpu", "cuda") or os.environ.get(autotune_lib.CPU_ENV) == "1"


def _flat(fn: Callable) -> Callable:
  def flat(*args):
    out = fn(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]
  return flat


def _vmapped(fn: Callable, in_axes: Sequence[tuple]) -> Callable:
  """``fn`` under the vmaps ``in_axes`` names, innermost first (each batches its outputs on axis 0)."""
  for axes in in_axes:
    fn = jax.vmap(fn, in_axes=axes)
  return fn


def _element_avals(avals, in_axes: Sequence[tuple]) -> list:
  """The avals of one element of every vmap: what the autotuner chooses by."""
  shapes = [list(a.shape) for a in avals]
  for axes in reversed(in_axes):
    for shape, axis in zip(shapes, axes):
      if axis is not None:
        del shape[axis]
  return [jax.ShapeDtypeStruct(tuple(s), a.dtype) for s, a in zip(shapes, avals)]


def _abstract_eval(*avals, out_avals, **_):
  return out_avals


def _fallback_lowering(ctx, *operands, fallback, in_axes, tuned: WithFallback, site: str, **_):
  """Off CUDA: the fallback, standing in for the kernel, as a plain call's lowering notes for a check (jmf.check,
  the shadow mode), whose report then says that no kernel ran."""
  verification = shadow.active()
  if verification is not None:
    platforms = ", ".join(ctx.module_context.platforms)
    verification.note(f"{tuned.name} at {site}",
                      f"the program ran on {platforms}, where each kernel's fallback runs in its place")
  return mlir.lower_fun(_vmapped(fallback, in_axes), multiple_results=True)(ctx, *operands)


def _cuda_lowering(ctx, *operands, tuned: WithFallback, site: str, in_axes, **_):
  """The autotuner's choice for this machine (its default config, untimed), built now and lowered here. The
  config's call checks its fallback (the same) against its kernel, as any call does."""
  with source_location.pinned(site):
    call = tuned._call_for(tuned.choose(*_element_avals(ctx.avals_in, in_axes)))  # noqa: SLF001  (its subclass)
    return mlir.lower_fun(_vmapped(_flat(call), in_axes), multiple_results=True)(ctx, *operands)


def _batching_rule(args, dims, *, fallback, in_axes, **params):
  """vmap: one more level of `in_axes`, the outputs batched on axis 0 (as jax.vmap batches them)."""
  in_axes = (*in_axes, tuple(None if d is None else int(d) for d in dims))  # None: not batched
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in map(jax.typeof, args)]
  outs = jax.eval_shape(_vmapped(fallback, in_axes), *avals)
  params["out_avals"] = tuple(jax.core.ShapedArray(o.shape, o.dtype) for o in outs)
  results = mosaic_autotuned_untimed_p.bind(*args, fallback=fallback, in_axes=in_axes, **params)
  return results, [0] * len(results)


def _no_derivative(primals, tangents, *, tuned: WithFallback, site: str, **_):
  raise TypeError(f"{tuned.name} at {site} has no derivative: JAX cannot see inside a hand-written kernel. Attach "
                  "one with jmf.differentiable(forward, bwd=..., residuals=(...)); docs/guides/transformations.md "
                  "(grad and jvp) shows how.")


mosaic_autotuned_untimed_p.def_impl(functools.partial(dispatch.apply_primitive, mosaic_autotuned_untimed_p))
mosaic_autotuned_untimed_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(mosaic_autotuned_untimed_p, _fallback_lowering)
mlir.register_lowering(mosaic_autotuned_untimed_p, _cuda_lowering, platform="cuda")
batching.primitive_batchers[mosaic_autotuned_untimed_p] = _batching_rule
ad.primitive_jvps[mosaic_autotuned_untimed_p] = _no_derivative

