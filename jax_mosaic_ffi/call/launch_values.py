"""The values of `mosaic_kernel`'s launch options, normalised: each option's checks and messages, once.

Pure functions of the values given (and, for callables, of what they returned for the input avals); the
caller says where (`errors.who`) for the message.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax.export import is_symbolic_dim
import ml_dtypes
import numpy as np

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.call.launch_programs import DimScalar, placeholder_scalar


def cdiv(a: int, b: int) -> int:
  """Ceiling division, for grids: ``cdiv(n, 256)`` blocks of 256 cover n. A symbolic size
  (jax.export with shape polymorphism) gives a symbolic expression, computed by the runtime.

    >>> jmf.cdiv(1000, 256)
    4
  """
  if is_symbolic_dim(a) or is_symbolic_dim(b):
    return (a + b - 1) // b if isinstance(b, (int, np.integer)) and b > 0 else -(-a // b)
  return -(-int(a) // int(b))


_SCALAR_KINDS = "biuf"
_EXTRA_SCALAR_TYPES = (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)


def integer(value, what: str, where: str) -> int:
  """A Python or numpy integer, nothing that only looks like one."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
    raise LaunchError(f"{where}: {what} must be an integer, got {value!r} ({type(value).__name__})")
  return int(value)


def dims(value, what: str, where: str, symbolic: bool = False) -> tuple[int, int, int]:
  """Up to 3 launch dimensions, padded with 1s; with ``symbolic``, an entry may be a symbolic expression."""
  if is_symbolic_dim(value) or (isinstance(value, (numbers.Integral, np.integer)) and
                                not isinstance(value, (bool, np.bool_))):
    value = (value,)
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
    raise LaunchError(f"{where}: {what} must be an int or a tuple of up to 3 ints, got {value!r}")
  if not 1 <= len(value) <= 3:
    raise LaunchError(f"{where}: {what} must have 1 to 3 dimensions, got {tuple(value)}")
  dims = tuple(v if symbolic and is_symbolic_dim(v) else integer(v, f"{what}[{i}]", where)
               for i, v in enumerate(value))
  return dims + (1,) * (3 - len(dims))


class Scalar(NamedTuple):
  """One scalar as the kernel gets it: its little-endian bytes, and its dtype's name (for the typed check)."""

  data: bytes
  dtype: str


def _scalar(value, index: int, where: str) -> Scalar:
  if isinstance(value, DimScalar):  # computed by the runtime (launch_programs.py)
    return Scalar(placeholder_scalar(value.dtype), np.dtype(value.dtype).name)
  if is_symbolic_dim(value):
    raise LaunchError(
        f"{where}: scalars[{index}] = {value} is a symbolic size, whose width the kernel's parameter cannot be "
        f"guessed from; pass jmf.dim_scalar({value}, np.int32) (or another integer dtype)")
  if isinstance(value, (jax.Array, jax.core.Tracer)):
    raise LaunchError(
        f"{where}: scalars[{index}] is a JAX array; scalars are baked into the launch "
        "at trace time, so pass a numpy scalar (np.int32(n)), or pass the value as an input array")
  if isinstance(value, (bool, np.bool_)):
    return Scalar(bytes([1 if value else 0]), "bool")
  if isinstance(value, (int, float)) and not isinstance(value, np.generic):
    kind = "np.int32(...) or np.int64(...)" if isinstance(value, int) else "np.float32(...) or np.float64(...)"
    raise LaunchError(
        f"{where}: scalars[{index}] is a Python {type(value).__name__}, whose width the "
        f"kernel's parameter cannot be guessed from; pass {kind}")
  if isinstance(value, np.generic) and (value.dtype.kind in _SCALAR_KINDS or isinstance(value, _EXTRA_SCALAR_TYPES)):
    if value.dtype.itemsize > 8:
      raise LaunchError(f"{where}: scalars[{index}] has dtype {value.dtype}, wider than 8 bytes")
    return Scalar(np.asarray(value).astype(value.dtype.newbyteorder("<")).tobytes(), value.dtype.name)
  raise LaunchError(
      f"{where}: scalars[{index}] has unsupported type {type(value).__name__}; scalars "
      "are numpy integer, float (float16/bfloat16/float32/float64) or bool values")


def scalars(values, where: str) -> tuple[Scalar, ...]:
  if isinstance(values, (np.generic, np.ndarray, jax.Array, str, bytes)) or not isinstance(values, Sequence):
    raise LaunchError(
        f"{where}: scalars must be a tuple of numpy scalars, got {values!r}; for one scalar write "
        "scalars=(np.int32(n),)")
  return tuple(_scalar(v, k, where) for k, v in enumerate(values))


def out_avals(out_shape, where: str) -> tuple[tuple[jax.core.ShapedArray, ...], bool]:
  """The output avals, and whether one output (not a sequence) was given."""
  single = hasattr(out_shape, "shape") and hasattr(out_shape, "dtype")
  if not single and (isinstance(out_shape, (str, bytes)) or not isinstance(out_shape, Sequence)):
    raise LaunchError(
        f"{where}: out_shape must be a jax.ShapeDtypeStruct or a sequence of them, got {out_shape!r}")
  shapes = (out_shape,) if single else tuple(out_shape)
  if not shapes:
    raise LaunchError(f"{where}: out_shape must name at least one output")
  avals = []
  for i, s in enumerate(shapes):
    if not (hasattr(s, "shape") and hasattr(s, "dtype")):
      raise LaunchError(f"{where}: out_shape[{i}] must be a jax.ShapeDtypeStruct, got {s!r}")
    if isinstance(s.shape, (str, bytes)) or not isinstance(s.shape, Sequence):
      raise LaunchError(f"{where}: out_shape[{i}].shape must be a tuple of ints, got {s.shape!r}")
    # A symbolic dimension (jax.export with shape polymorphism) is jax's to refine when the export is called.
    shape = tuple(d if is_symbolic_dim(d) else integer(d, f"out_shape[{i}] dimension {k}", where)
                  for k, d in enumerate(s.shape))
    if any(not is_symbolic_dim(d) and d < 0 for d in shape):
      raise LaunchError(f"{where}: out_shape[{i}] has a negative dimension: {shape}")
    try:
      dtype = jnp.dtype(s.dtype)
    except TypeError as e:
      raise LaunchError(f"{where}: out_shape[{i}] has dtype {s.dtype!r}, which is not a JAX dtype") from e
    avals.append(jax.core.ShapedArray(shape, dtype))
  return tuple(avals), single


def shape_dtype_tree(tree, what: str, where: str):
  """A pytree of outputs (each a ``jax.ShapeDtypeStruct``, or anything with ``shape`` and ``dtype``) as
  ShapeDtypeStructs: jax-triton's ``out_type``, cutlass_call's ``output_shape_dtype``. A leaf that is no shape and
  dtype is named by its path."""
  def leaf(path, value):
    shown = f"{what}{jax.tree_util.keystr(path)}"
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
      raise LaunchError(f"{where}: {shown} is {value!r} ({type(value).__name__}), not a shape and dtype; pass a "
                        "jax.ShapeDtypeStruct(shape, dtype) (or an array), or a pytree of them")
    try:
      return jax.ShapeDtypeStruct(value.shape, value.dtype)
    except (TypeError, ValueError) as e:
      raise LaunchError(f"{where}: {shown} has shape {value.shape!r} and dtype {value.dtype!r}, which make no "
                        f"jax.ShapeDtypeStruct ({e})") from None
  return jax.tree_util.tree_map_with_path(leaf, tree)


def has_symbolic_dim(value) -> bool:
  """Whether a launch value (an int, a tuple of them, numpy scalars) holds a jax.export symbolic dimension."""
  if is_symbolic_dim(value) or isinstance(value, DimScalar):
    return True
  if isinstance(value, (list, tuple)):
    return any(has_symbolic_dim(v) for v in value)
  return False


def symbolic_inputs(in_avals) -> list[str]:
  """The inputs whose shapes have symbolic dimensions, as "in0 float32[n, 128]"."""
  return [f"in{i} {a.dtype}[{', '.join(map(str, a.shape))}]" for i, a in enumerate(in_avals)
          if any(is_symbolic_dim(d) for d in a.shape)]


def symbolic_refusal(what: str, in_avals, where: str) -> str:
  """Why a launch value that depends on a symbolic dimension cannot be lowered, and what to do instead
  (Triton launches, whose compile specializes on the values)."""
  return (f"{where}: {what} depends on a symbolic dimension of the inputs ({'; '.join(symbolic_inputs(in_avals))}). "
          f"Launch values are fixed when the call is lowered, and jax.export with shape polymorphism only "
          f"knows those sizes when the exported function is called. Export once per concrete size, or make "
          f"{what} independent of the symbolic dimensions: e.g. a fixed grid with a grid-stride loop, the size "
          f"read inside the kernel from an input array (pass jnp.asarray(x.shape[0], jnp.int32).reshape(1)) "
          f"rather than a scalar. out_shape may use symbolic dimensions")


def constant_refusal(what: str, in_avals, where: str) -> str:
  """Why block, smem_bytes or scratch_bytes may not depend on a symbolic dimension."""
  inputs = f" ({'; '.join(symbolic_inputs(in_avals))})" if in_avals else ""
  return (f"{where}: {what} depends on a symbolic dimension of the inputs{inputs}. "
          f"Under jax.export with shape polymorphism the grid and integer scalars may follow the symbolic sizes "
          f"(the runtime computes them when the shapes are known), but block, smem_bytes and scratch_bytes must "
          f"be constants: they set the compiled launch's limits (threads per block against the kernel's "
          f"registers, shared memory against the device's), checked once when the kernel is loaded. Fix {what} "
          f"and let the grid follow the size, or export once per concrete size")


def inconclusive_refusal(what: str, in_avals, error: Exception, where: str) -> str:
  """A grid or scalars callable that did something a symbolic size cannot do (np.int32(n), int(n), max(n, 1))."""
  return (f"{where}: {what} could not be computed on the symbolic dimensions of the inputs "
          f"({'; '.join(symbolic_inputs(in_avals))}): {str(error).splitlines()[0].rstrip('.')}. Under jax.export "
          f"with shape polymorphism the grid and integer scalars may be expressions of the sizes (+, -, *, //, %, "
          f"jmf.cdiv), which the runtime computes when the shapes are known: write integer scalars as "
          f"jmf.dim_scalar(x.shape[0], np.int32) rather than np.int32(x.shape[0]), and avoid int(), math functions "
          f"and comparisons of symbolic sizes")


def evaluate(value, what: str, in_avals, where: str, *, meta: Mapping[str, Any] | None = None,
             follows_shapes: bool = False):
  """A launch value for one call: ``value`` itself, or what it returns if it is a callable. The one normaliser
  of "a value or a callable" every path uses (CUDA, Triton, autotuning configs, tensor descriptors).

  Without ``meta`` a callable gets the input avals; with it (a config's, or a compiled Triton kernel's
  constexprs and launch options), ``(meta, *avals)``, or ``meta`` alone when it takes one argument.
  Under jax.export with shape polymorphism a value that ``follows_shapes`` (out_shape, and the grid and scalars
  of a kernel compiled once) may be a symbolic expression, which the runtime computes; any other may not, and
  nothing computed from ``meta`` may, as the compile ``meta`` selects is fixed when the call is lowered."""
  if not callable(value):
    return value
  refusal = symbolic_refusal if meta is not None else constant_refusal
  try:
    result = value(*_arguments(value, meta, in_avals))
  except jax.errors.InconclusiveDimensionOperation as e:
    if follows_shapes:
      raise LaunchError(inconclusive_refusal(what, in_avals, e, where)) from e
    raise LaunchError(refusal(what, in_avals, where)) from e
  except LaunchError:  # worded already, naming its call (a front end's callable around the user's: triton_call's)
    raise
  except Exception as e:
    of = "the input avals" if meta is None else f"(meta, *input avals) (meta {dict(meta)})"
    raise LaunchError(f"{where}: {what}, a callable of {of}, raised {type(e).__name__}: {e}") from e
  if not follows_shapes and has_symbolic_dim(result):
    raise LaunchError(refusal(what, in_avals, where))
  return result


def _arguments(fn, meta, in_avals) -> tuple:
  """What a launch callable is called with (see `evaluate`)."""
  if meta is None:
    return tuple(in_avals)
  try:
    params = inspect.signature(fn).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    one = len(positional) == 1 and not any(p.kind == p.VAR_POSITIONAL for p in params)
  except (TypeError, ValueError):
    one = False
  return (meta,) if one else (meta, *in_avals)


def scratch_bytes(value, where: str) -> int:
  nbytes = integer(value, "scratch_bytes", where)
  if not 0 <= nbytes <= 1 << 40:
    raise LaunchError(f"{where}: scratch_bytes = {nbytes} is out of range 0..2^40")
  return nbytes


def left_out(value, default) -> bool:
  """Whether an option is at its default (None, False, nothing for a sequence, 0 for a size): what a front end
  that does not take it lets pass, refusing any other value by the option's name (call/front_end.py)."""
  if value is None or value is False:
    return True
  if isinstance(default, tuple) and isinstance(value, (tuple, list)):
    return not value
  return (isinstance(default, int) and not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Number)
          and value == default)


def flag(value, what: str, where: str) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise LaunchError(f"{where}: {what} must be True or False, got {value!r}")
  return bool(value)


def cost_estimate(value, where: str) -> str | None:
  """``cost_estimate`` as the JSON the custom call carries (``cost_estimate_json``, as jax-triton writes it):
  a mapping of names (``flops``, ``bytes_accessed``, ...) to finite non-negative numbers, or None."""
  if value is None:
    return None

  def number(v) -> float | None:  # as a float, or None where it is no finite non-negative number
    if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)):
      return None
    try:
      f = float(v)
    except (OverflowError, ValueError):  # an int past float's range
      return None
    return f if math.isfinite(f) and f >= 0 else None

  numbers_ = {k: number(v) for k, v in value.items()} if isinstance(value, Mapping) else None
  if numbers_ is None or not all(isinstance(k, str) and f is not None for k, f in numbers_.items()):
    raise LaunchError(f"{where}: cost_estimate must map names such as 'flops' and 'bytes_accessed' to finite "
                      f"non-negative numbers, got {value!r}")
  return json.dumps({k: int(value[k]) if isinstance(value[k], numbers.Integral) else int(f) if f.is_integer() else f
                     for k, f in numbers_.items()})


def zero_outputs_option(value, where: str):
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, str) or not isinstance(value, Sequence) or \
      not all(isinstance(o, (int, np.integer)) and not isinstance(o, bool) for o in value):
    raise LaunchError(f"{where}: zero_outputs must be True (every output) or a sequence of output indices, "
                      f"got {value!r}")
  return tuple(int(o) for o in value)


def zeroed(option, n_out: int, aliases, where: str) -> tuple[int, ...]:
  """The outputs zeroed before every launch: the kernel accumulates into them."""
  aliased = {o for _, o in aliases}
  if option is True:
    return tuple(o for o in range(n_out) if o not in aliased)
  if option is False:
    return ()
  for o in option:
    if not 0 <= o < n_out:
      raise LaunchError(f"{where}: zero_outputs names output {o}, but the call has {n_out} output(s)")
    if o in aliased:
      raise LaunchError(f"{where}: zero_outputs names output {o}, which an input aliases: zeroing it would "
                        "erase that input; leave it out, or zero the input before the call")
  return tuple(sorted(set(option)))


def aliases(aliases, where: str) -> tuple[tuple[int, int], ...]:
  if not aliases:
    return ()
  if not isinstance(aliases, Mapping):
    raise LaunchError(f"{where}: input_output_aliases must be a dict {{input_index: output_index}}, got {aliases!r}")
  pairs = [(integer(i, "an input_output_aliases key", where), integer(o, "an input_output_aliases value", where))
           for i, o in aliases.items()]
  outputs = [o for _, o in pairs]
  if len(set(outputs)) != len(outputs):
    raise LaunchError(f"{where}: input_output_aliases maps two inputs to one output")
  return tuple(sorted(pairs))
