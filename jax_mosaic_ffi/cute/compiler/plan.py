"""What one CuTe DSL specialization is, and the host function's arguments it implies.

A `Plan` is everything `cute.compile` is given besides the user's launcher: each buffer of the XLA call as a
`TensorArg` (shape, dtype and the `cutlass.jax.TensorSpec` fields that shape the `cute.Tensor` the launcher
sees), the pytrees of the inputs and outputs, the aliased outputs the launcher does not get, and the
constexpr keyword arguments. It decides the compiled host function's arguments after the stream: per buffer
its device address, then, unless the tensor is static, each dimension as an int64 (read by the runtime from
XLA's buffer shape at every call, so symbolic shapes under `jax.export` need no recompile). `host_args` says
so to the runtime (docs/contract.md, the CuTe target). Needs no DSL: the wrapper that builds the tensors from
those arguments is `wrapper.py`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
from jax.export import is_symbolic_dim

from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.errors import ValueKeyError
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.cute.compiler import keys as cute_keys

ADDRESS = core.LIMITS["host_arg_address"]
DIMENSION = core.LIMITS["host_arg_dimension"]
XLA_BUFFER_ALIGNMENT = core.LIMITS["buffer_alignment"]
# The extent of a dynamic tensor's batch axis (cute_kernel(batch_mode=)): read at run time like any dynamic
# dimension, and no divisor known, so one compile serves every batch size.
BATCH = "batch"


@dataclasses.dataclass(frozen=True)
class TensorArg:
  """One buffer as the launcher's `cute.Tensor`: cutlass_call's TensorSpec semantics.

  ``order`` is the compact stride order (CuTe's minor-to-major: ``order[i]`` is dimension i's stride rank, 0
  innermost), ``mode`` the permutation the kernel sees, ``divisibility`` per dimension (None: unknown),
  ``static`` bakes shape and strides into the code."""

  shape: tuple[Any, ...]  # ints, jax.export symbolic dimensions, or BATCH
  dtype: str
  order: tuple[int, ...]
  mode: tuple[int, ...]
  static: bool
  divisibility: tuple[int | None, ...]
  align: int = XLA_BUFFER_ALIGNMENT

  @property
  def rank(self) -> int:
    return len(self.shape)

  @property
  def row_major(self) -> bool:
    return self.order == tuple(reversed(range(self.rank)))

  def minor_to_major(self) -> tuple[int, ...]:
    """``order`` as XLA writes a layout: the dimensions from the innermost (stride 1) out."""
    return tuple(sorted(range(self.rank), key=lambda d: self.order[d]))

  def describe(self) -> str:
    shape = [d if isinstance(d, int) else str(d) for d in self.shape]
    return json.dumps([shape, self.dtype, self.order, self.mode, self.static, self.divisibility, self.align])

  def dim_divisibility(self) -> tuple[int, ...]:
    """Each dimension's known divisor: the explicit hint, else a concrete extent, else 1 (as cutlass_call)."""
    out = []
    for d, hint in zip(self.shape, self.divisibility):
      if hint is not None:
        out.append(int(hint))
      elif isinstance(d, (int, np.integer)) and not is_symbolic_dim(d) and int(d) > 0:
        out.append(int(d))
      else:
        out.append(1)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Plan:
  """One specialization of a launcher: its tensors (inputs, then outputs), pytrees, aliases and constexprs."""

  tensors: tuple[TensorArg, ...]
  num_inputs: int
  input_tree: Any          # jax PyTreeDef of the inputs the launcher gets (None for absent ones)
  output_tree: Any         # of the outputs it gets (aliased ones left out)
  input_present: tuple[bool, ...]  # per input leaf (None leaves included): whether it is a tensor
  aliased_outputs: tuple[int, ...]  # outputs (by index) that alias an input: the launcher writes the input
  constexprs: tuple[tuple[str, Any], ...]

  def host_arg_kinds(self) -> tuple[int, ...]:
    kinds = []
    for t in self.tensors:
      kinds.append(module_format.HOST_ARG_POINTER)
      if not t.static:
        kinds += [module_format.HOST_ARG_INT64] * t.rank
    return tuple(kinds)

  def host_args(self) -> tuple[int, ...]:
    """The `host_args` attribute: (kind, buffer, dimension) per host-function argument after the stream."""
    args = []
    for b, t in enumerate(self.tensors):
      args += [ADDRESS, b, 0]
      if not t.static:
        for d in range(t.rank):
          args += [DIMENSION, b, d]
    return tuple(args)

  def describe(self) -> tuple[str, bool]:
    """Everything of the plan that changes the compiled code, as text for cache keys, and whether that text is
    exact. Each constexpr is keyed whole (`keys.exact_key`: an array by its bytes, a float by its 8 bytes,
    a function or an object by its code and every attribute), never by its printed text; one the reader cannot
    read whole is written by its type alone, and the text is not exact: the caller keys the specialization by a
    trace, which holds the value's effect."""
    constexprs, exact = [], True
    for k, v in self.constexprs:
      try:
        constexprs.append([k, cute_keys.exact_key(v, ir=True).hex()])
      except (ValueKeyError, RecursionError):
        constexprs.append([k, f"{type(v).__module__}.{type(v).__qualname__}: not keyed"])
        exact = False
    return json.dumps([[t.describe() for t in self.tensors], self.num_inputs, str(self.input_tree),
                       str(self.output_tree), self.input_present, self.aliased_outputs, constexprs]), exact
