"""`cutile_call`: NVIDIA's ``cuda.tile.jax.cutile_call``, over this package's cuTile wing.

It has ``cutile_call``'s signature and behaviour (with `OutputPlaceholder` and `InputOutput`), so that
``import jax_mosaic_ffi.cutile_jax as ctj`` in place of ``import cuda.tile.jax as ctj`` is all a user changes;
underneath it is a `cutile_kernel` launched by `mosaic_kernel`: compiled once ever for any arch list, with vmap,
gradients (`jmf.differentiable`), sharding and `jax.export` (no disabled safety check, symbolic shapes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jax_mosaic_ffi.api import mosaic_kernel
from jax_mosaic_ffi.cutile.compiler import parameters as parameters_lib
from jax_mosaic_ffi.cutile.kernel import cutile_kernel

INT32 = (-(1 << 31), (1 << 31) - 1)


@dataclasses.dataclass
class OutputPlaceholder:
  """An output buffer of `cutile_call`, of ``shape`` and ``dtype``: allocated by JAX and returned by the call.

  As ``cuda.tile.jax.OutputPlaceholder``::

      >>> from jax_mosaic_ffi.cutile_jax import OutputPlaceholder
      >>> OutputPlaceholder((4, 8), jnp.float32)
      OutputPlaceholder(shape=(4, 8), dtype=<class 'jax.numpy.float32'>)
  """

  shape: tuple[int, ...]
  dtype: Any


@dataclasses.dataclass
class InputOutput:
  """An input of `cutile_call` that the kernel updates in place: its buffer is also an output, returned by the
  call (donate the array, ``jax.jit(f, donate_argnums=...)``, and nothing is copied). As
  ``cuda.tile.jax.InputOutput``::

      >>> from jax_mosaic_ffi.cutile_jax import InputOutput
      >>> InputOutput(jnp.zeros(4)).array.shape
      (4,)
  """

  array: Any


def _runtime_scalar(value, param, path: str, name: str):
  """A Python scalar as the kernel's runtime scalar, typed as cuda.tile.jax types it (bool and int: int32, or int64
  for ct.ScalarInt64; float: float32); a numpy scalar as it is."""
  if isinstance(value, np.generic):
    return value
  if isinstance(value, bool):
    return np.int32(value)
  if isinstance(value, int):
    if param.scalar_bits == 64:
      return np.int64(value)
    if not INT32[0] <= value <= INT32[1]:
      raise OverflowError(f"{name}: runtime int scalar {value} (argument {path}) doesn't fit in int32; annotate "
                          "the kernel parameter with ct.ScalarInt64")
    return np.int32(value)
  return np.float32(value)


def cutile_call(grid, kernel, args):
  """Launches a cuTile kernel from JAX: ``cuda.tile.jax.cutile_call``'s signature and behaviour, on
  jax_mosaic_ffi's runtime::

      @jax.jit
      def double(x):
        return cutile_call((ct.cdiv(x.shape[0], 1024),), scale, (x, OutputPlaceholder(x.shape, x.dtype), 2.0, 1024))

  Args:
    grid: up to 3 grid dimensions (padded with 1s).
    kernel: the ``@ct.kernel``.
    args: one per kernel parameter: a `jax.Array` (an input), an `OutputPlaceholder` (an output), an `InputOutput`
      (an input updated in place, also returned), a ``bool`` / ``int`` / ``float`` (a ``ct.Constant``'s value,
      compiled in, or a runtime scalar passed by value), a numpy scalar (a runtime scalar of its type), or a
      tuple of these for a tuple parameter. A Python scalar must be known when the call is traced (a static
      argument of ``jax.jit``), as in cuda.tile.jax.

  Returns:
    The output array, or a tuple of them (one per `OutputPlaceholder` / `InputOutput`, in order).

  Beyond cuda.tile.jax: it compiles without a GPU for any arch list (``JAX_MOSAIC_FFI_TARGETS``), through the
  compile cache, packs and the job share; vmap, `jmf.differentiable`, sharding, `jax.export` (symbolic shapes,
  no disabled safety check) work as for every `mosaic_kernel` call. Differences: :doc:`coming from cuda.tile.jax
  </guides/cutile_kernels>`.
  """
  params = parameters_lib.parameters(kernel)
  name = parameters_lib.python_function(kernel).__name__
  if not isinstance(args, (tuple, list)):
    raise TypeError(f"{name}: cutile_call's args is a tuple of the kernel's arguments, got {type(args).__name__}")
  if len(args) != len(params):
    raise TypeError(f"{name} expects {len(params)} arguments, got {len(args)}")
  inputs: list = []
  outputs: list[jax.ShapeDtypeStruct] = []
  scalars: list = []
  aliases: dict[int, int] = {}
  constants: dict[str, Any] = {}

  def input_of(array) -> str:
    # Each argument its own input, as cuda.tile.jax passes them: an array given twice is two operands (read-only
    # reads may share memory; an InputOutput's buffer is its own, XLA copies the array for any other use of it).
    inputs.append(array)
    return f"in{len(inputs) - 1}"

  def entry(value, param, path: str):
    if param.is_tuple and not param.constant:
      if not isinstance(value, tuple):
        raise TypeError(f"{name}: argument {path} is a tuple parameter; expected a tuple, got "
                        f"{type(value).__name__}")
      if param.items is not None and len(value) != len(param.items):
        raise TypeError(f"{name}: argument {path} expects a tuple of length {len(param.items)}, got {len(value)}")
      return tuple(entry(v, param.item(k), f"{path}[{k}]") for k, v in enumerate(value))
    if isinstance(value, OutputPlaceholder):
      outputs.append(jax.ShapeDtypeStruct(tuple(value.shape), value.dtype))
      return f"out{len(outputs) - 1}"
    if isinstance(value, InputOutput):
      slot = input_of(value.array)
      outputs.append(jax.ShapeDtypeStruct(value.array.shape, value.array.dtype))
      aliases[int(slot[2:])] = len(outputs) - 1
      return slot
    if isinstance(value, (jax.Array, np.ndarray)):
      return input_of(value)
    if isinstance(value, (bool, int, float, np.generic)) or (param.constant and isinstance(value, tuple)):
      if param.constant:
        return value  # compiled in
      scalars.append(_runtime_scalar(value, param, path, name))
      return f"scalar{len(scalars) - 1}"
    raise TypeError(f"Unexpected type for argument {path}: {type(value)}")

  order = []
  for k, (value, param) in enumerate(zip(args, params)):
    got = entry(value, param, f"{k} ('{param.name}')")
    if param.constant:
      if isinstance(value, (OutputPlaceholder, InputOutput, jax.Array, np.ndarray)):
        raise TypeError(f"{name}: argument {k} ('{param.name}') is annotated ct.Constant; expected a static scalar "
                        "argument")
      constants[param.name] = got
    else:
      order.append(got)
  if not outputs:
    raise TypeError(f"{name}: cutile_call needs at least one OutputPlaceholder or InputOutput argument")
  grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
  call = mosaic_kernel(cutile_kernel(kernel, **constants), tuple(outputs) if len(outputs) > 1 else outputs[0],
                       grid=grid, scalars=tuple(scalars), param_order=tuple(order),
                       input_output_aliases=aliases or None)
  return call(*inputs)
