"""The CPU path: `mosaic_kernel(..., fallback=fn)`, a jax.numpy function computing what the kernel computes.

The fallback takes the kernel's inputs and returns its outputs (one array, or
a tuple when ``out_shape`` is a sequence). It is checked against the kernel's
outputs on every trace, on every machine, so it cannot drift from the kernel
unnoticed. It is lowered instead of the kernel:

* on every platform but CUDA: the CPU backend, ``jax.default_device(cpu)``,
  ``JAX_PLATFORMS=cpu`` (the lowering registered for all platforms, in
  lowering.py, comes here);
* on CUDA when ``JAX_MOSAIC_FFI_REFERENCE=1`` is set as the program is
  lowered: a reference mode for debugging a kernel's numerics.

Nothing else touches it, so ``jax.export(..., platforms=["cuda"])`` never
lowers it; ``platforms=["cuda", "cpu"]`` exports both.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Sequence

import jax
from jax._src.interpreters import mlir

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base.errors import LaunchError, how_to_give_fallback

REFERENCE_ENV = flags.REFERENCE


class Fallback:
  """A user's fallback function. Equality is identity (the default), so a
  `LaunchSpec` holding one stays hashable and two wrappers never share a
  jaxpr cache entry by accident."""

  def __init__(self, fn: Callable, per_element: "Fallback | None" = None, compared: int | None = None):
    self.fn = fn
    # None for the user's function itself: a reference to self would be a cycle, which only the cycle
    # collector frees (and with it whatever the function holds).
    self._per_element = per_element
    # How many leading outputs are the user's function's, when the rest are a front end's scratch buffers filled
    # with zeros (Triton's): what the shadow mode compares. None: all but the call's scratch_bytes buffer.
    self.compared = compared

  @property
  def per_element(self) -> "Fallback":
    """The user's function itself, before any vmap: a batch of batches (a nested vmap) is one merged batch of it."""
    return self._per_element or self

  def flat(self, *args) -> list:
    """The outputs as a flat list, for `mlir.lower_fun`."""
    out = self.fn(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]

  def vmapped(self, in_axes, out_axes=0) -> "Fallback":
    """The user's function over one leading batch axis of the operands named
    in ``in_axes`` (0) and shared ones (None): what a batched primitive computes."""
    return Fallback(jax.vmap(self.per_element.fn, in_axes=in_axes, out_axes=out_axes), self.per_element,
                    self.compared)

  def __repr__(self) -> str:
    return f"Fallback({getattr(self.fn, '__qualname__', self.fn)!r})"


def create(fn, where: str) -> Fallback | None:
  if fn is None:
    return None
  if not callable(fn):
    raise TypeError(f"{where}: fallback must be a function of the input arrays returning the outputs "
                    f"(a jax.numpy version of the kernel), got {fn!r}")
  return Fallback(fn)


def with_scratch(fallback: Fallback, scratch_avals) -> Fallback:
  """The fallback plus zeros for the call's scratch outputs, which the primitive has and the user's function lacks."""
  if not scratch_avals:
    return fallback

  def fn(*args):
    out = fallback.fn(*args)
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return out + tuple(jax.numpy.zeros(a.shape, a.dtype) for a in scratch_avals)

  return Fallback(fn)


def _describe(avals) -> str:
  return ", ".join(f"{a.dtype}{list(a.shape)}" for a in avals)


def check(fallback: Fallback, in_avals, out_avals, single: bool, where: str) -> None:
  """The fallback returns the kernel's outputs: same number, shapes and dtypes."""
  args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
  try:
    out = jax.eval_shape(fallback.fn, *args)
  except Exception as e:
    raise LaunchError(f"{where}: its fallback raised {type(e).__name__} when called with inputs "
                      f"({_describe(in_avals)}): {e}") from e
  leaves = list(out) if isinstance(out, (tuple, list)) else [out]
  if not all(hasattr(o, "shape") and hasattr(o, "dtype") for o in leaves) or \
      (not single and not isinstance(out, (tuple, list))):
    raise LaunchError(f"{where}: its fallback must return {'an array' if single else 'a tuple of arrays'} "
                      f"like out_shape, got {out!r}")
  got = [(tuple(o.shape), jax.numpy.dtype(o.dtype)) for o in leaves]
  want = [(tuple(a.shape), a.dtype) for a in out_avals]
  if got != want:
    raise LaunchError(
        f"{where}: its fallback returns ({_describe(leaves)}) but the kernel's out_shape is "
        f"({_describe(out_avals)}); make the fallback return the same shapes and dtypes "
        "(for instance with .astype(...))")


def reference_mode() -> bool:
  """JAX_MOSAIC_FFI_REFERENCE, read when a program is lowered."""
  return os.environ.get(REFERENCE_ENV, "") not in ("", "0")


def lower(ctx, operands: Sequence, fallback: Fallback):
  got = [(tuple(o.shape), o.dtype) for o in jax.eval_shape(fallback.flat, *ctx.avals_in)]
  if got != [(tuple(a.shape), a.dtype) for a in ctx.avals_out]:
    # The call checked the fallback against its avals; a transformation that
    # rebinds the primitive with other avals must transform it too (vmapped).
    raise LaunchError(f"{fallback!r} returns {got} for the operands {list(ctx.avals_in)}, not the primitive's "
                      f"outputs {list(ctx.avals_out)}: the transformation that bound it must adapt its fallback")
  return mlir.lower_fun(fallback.flat, multiple_results=True)(ctx, *operands)


def warn_no_reference(where: str, call_site=None) -> None:
  warnings.warn(f"{REFERENCE_ENV} is set, but {where} has no fallback, so the kernel itself runs; "
                f"give {how_to_give_fallback(call_site, short=True)} to compare it with a jax.numpy reference",
                stacklevel=2)


def missing_message(where: str, platforms: str, call_site=None) -> str:
  return (f"{where} runs only on CUDA GPUs, but this computation is lowered for {platforms}. Put its "
          "inputs on a GPU, export with platforms=['cuda'], or give the kernel a CPU path, run instead of the "
          f"kernel on {platforms}: {how_to_give_fallback(call_site)}.")
