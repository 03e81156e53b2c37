"""cutlass_call's ``input_spec`` / ``output_spec`` (``cutlass.jax.TensorSpec``) read into `TensorArg`s.

The same rules as cutlass_call: no spec is a row-major tensor of the array's own shape, its divisibility the
concrete extents; a spec's ``layout`` is its compact stride order (CuTe's minor-to-major; XLA lays the buffer
out so, copying where the array is laid out otherwise), ``mode`` the
dimensions the kernel sees, ``static`` compiles shape and strides in (``use_static_tensors`` is the
default), ``divisibility`` the known divisors (an int: of the stride-1 dimension), ``ptr_assumed_align``.
A bare tuple of ints is a ``mode`` (cutlass_call's legacy shorthand). Specs may list the present tensors, or
mirror the inputs' pytree with None for absent ones.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
from jax.export import is_symbolic_dim

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.cute.compiler import dsl
from jax_mosaic_ffi.cute.compiler.plan import XLA_BUFFER_ALIGNMENT, TensorArg


def _is_spec_leaf(x) -> bool:
  if x is None or type(x).__name__ == "TensorSpec":
    return True
  return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)


def flat_specs(spec: Any, n_present: int, present: Sequence[bool], what: str, where: str) -> list:
  """One TensorSpec (or None) per present tensor."""
  if spec is None:
    return [None] * n_present
  tensor_spec = dsl.tensor_spec_class()
  leaves = jax.tree_util.tree_leaves(spec, is_leaf=_is_spec_leaf)
  out = []
  for leaf in leaves:
    if leaf is None or isinstance(leaf, tensor_spec):
      out.append(leaf)
    elif isinstance(leaf, (list, tuple)):
      out.append(tensor_spec(mode=tuple(leaf)))
    else:
      raise LaunchError(f"{where}: {what} holds {leaf!r} ({type(leaf).__name__}); it takes cutlass.jax.TensorSpec "
                        "values (or None), one per tensor")
  if len(out) == n_present:
    return out
  if len(out) == len(present):  # mirrors the inputs, None for the absent ones
    if any(s is not None for s, p in zip(out, present) if not p):
      raise LaunchError(f"{where}: an absent (None) input must have a None {what} entry")
    return [s for s, p in zip(out, present) if p]
  raise LaunchError(f"{where}: {what} has {len(out)} entries for {n_present} tensors; give one per tensor")


def _permutation(name: str, perm, rank: int, index: int, what: str, where: str) -> tuple[int, ...]:
  perm = tuple(perm)
  if sorted(perm) != list(range(rank)) or any(isinstance(p, bool) for p in perm):
    raise LaunchError(f"{where}: {what} #{index} has {name}={perm}, which is not a permutation of "
                      f"0..{rank - 1} for a tensor of rank {rank}")
  return perm


def tensor_arg(spec, aval, use_static: bool, index: int, what: str, where: str) -> TensorArg:
  """The `TensorArg` of one buffer under its spec (None: the defaults)."""
  rank = len(aval.shape)
  row_major = tuple(reversed(range(rank)))
  order = row_major if spec is None or spec.layout is None else _permutation("layout", spec.layout, rank, index, what,
                                                                              where)
  mode = tuple(range(rank)) if spec is None or spec.mode is None else _permutation("mode", spec.mode, rank, index,
                                                                                    what, where)
  static = use_static if spec is None or spec.static is None else bool(spec.static)
  symbolic = any(is_symbolic_dim(d) for d in aval.shape)
  if static and symbolic:
    raise LaunchError(f"{where}: {what} #{index} is static (shapes compiled in), but its shape {aval.shape} has "
                      "symbolic dimensions (jax.export); make it dynamic (TensorSpec(static=False))")
  divisibility = None if spec is None else spec.divisibility
  if isinstance(divisibility, int) and not isinstance(divisibility, bool):
    expanded = [None] * rank
    if rank:
      expanded[order.index(0)] = divisibility
    divisibility = tuple(expanded)
  divisibility = tuple(divisibility) if divisibility is not None else (None,) * rank
  if len(divisibility) != rank:
    raise LaunchError(f"{where}: {what} #{index} has divisibility {divisibility} for a tensor of rank {rank}")
  for d, (extent, hint) in enumerate(zip(aval.shape, divisibility)):
    if hint is None:
      continue
    if isinstance(hint, bool) or not isinstance(hint, int) or hint <= 0:
      raise LaunchError(f"{where}: {what} #{index}: divisibility of dimension {d} must be a positive int or None, "
                        f"got {hint!r}")
    if not is_symbolic_dim(extent) and int(extent) % hint:
      raise LaunchError(f"{where}: {what} #{index}: divisibility {hint} of dimension {d} does not divide its "
                        f"extent {extent}")
  align = XLA_BUFFER_ALIGNMENT if spec is None else int(spec.ptr_assumed_align)
  if align <= 0 or align & (align - 1) or align > XLA_BUFFER_ALIGNMENT:
    raise LaunchError(f"{where}: {what} #{index}: ptr_assumed_align={align} must be a power of two up to the "
                      f"{XLA_BUFFER_ALIGNMENT} bytes XLA aligns buffers to")
  shape = tuple(d if is_symbolic_dim(d) else int(d) for d in aval.shape)
  return TensorArg(shape, str(aval.dtype), order, mode, static, divisibility, align)
