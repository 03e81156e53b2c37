"""A `triton_call`'s arguments as one `mosaic_kernel` call's operands, bound as jax-triton binds them.

    an array (or a Ref's value)         ->  an input, input K in param_order
    a scalar (int, float, bool)         ->  a scalar, typed as jax-triton types it, scalar J
    a tuple of them                     ->  a Triton tuple parameter: a tuple in param_order
    a jax-triton TensorDescriptor       ->  an input, and a jmf.TensorDescriptor of input K in param_order (its
                                            layout too: a Gluon kernel's); of a Ref: updated in place, as a Ref

jax-triton's own `TensorDescriptor` (of an array) and `strides_from_shape` live here too; jax_mosaic_ffi.jax_triton
re-exports them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Sequence

import jax
import numpy as np
from jax import tree_util
from jax._src.state import types as state_types

from jax_mosaic_ffi.call import operands as operand_refs
from jax_mosaic_ffi.call.tensor_map import row_major_strides
from jax_mosaic_ffi.triton import tensor_descriptor


def strides_from_shape(shape: Sequence[int]) -> tuple[int, ...]:
  """Row-major strides, in elements, of an array of this shape (jax-triton's helper; as jax-triton's, all 0
  for an array without elements).

      >>> import jax_mosaic_ffi.jax_triton as jt
      >>> jt.strides_from_shape((4, 8, 16))
      (128, 16, 1)
  """
  shape = tuple(shape)
  return (0,) * len(shape) if 0 in shape else row_major_strides(shape)


@tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
  """A host-side tensor descriptor of an array, as jax-triton's `TensorDescriptor`: a `triton_call` operand
  for a kernel parameter Triton takes as a ``TensorDescriptor`` (TMA loads and stores on sm_90 and newer).

      desc = jax_triton.TensorDescriptor.from_array(x, block_shape=[64, 64])
      y = jax_triton.triton_call(desc, kernel=copy_tile, out_type=x, grid=1, M=64, N=64)

  It becomes a `jmf.TensorDescriptor` of the array's input in ``param_order``, so the kernel gets exactly what
  Triton's launcher passes (:doc:`tensor descriptors </guides/triton_kernels>`). ``shape`` and ``strides`` (elements,
  outermost first, the last stride 1) describe a view of ``base``. A pytree: ``base`` is its one leaf.
  """

  base: Any
  shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  strides: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  block_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  layout: Any = dataclasses.field(default=None, metadata=dict(static=True))
  padding: Literal["zero", "nan"] | str = dataclasses.field(default="zero", metadata=dict(static=True))
  round_f32_to_tf32: bool = dataclasses.field(default=False, metadata=dict(static=True))

  def __post_init__(self):
    if self.padding not in ("zero", "nan"):
      raise ValueError(f"padding must be 'zero' or 'nan', got {self.padding!r}")
    if not (len(self.shape) == len(self.strides) == len(self.block_shape)):
      raise ValueError(f"shape, strides, and block_shape must have the same length, got {len(self.shape)}, "
                       f"{len(self.strides)}, {len(self.block_shape)}")

  @classmethod
  def from_array(cls, array, block_shape: Sequence[int], layout: Any = None, padding: str = "zero",
                 round_f32_to_tf32: bool = False) -> "TensorDescriptor":
    """A descriptor of the whole array, row-major."""
    return cls(array, tuple(array.shape), strides_from_shape(array.shape), tuple(block_shape), layout, padding,
               round_f32_to_tf32)


def is_ref(value) -> bool:
  """A `jax.Ref` (or a view of one): updated in place by the call."""
  return isinstance(value, (jax.Ref, state_types.TransformedRef))


def is_array(value) -> bool:
  """An array argument (a JAX or numpy array)."""
  return isinstance(value, (jax.Array, np.ndarray))


def _scalar(value, param: str, where: str):
  """A static scalar argument as jax-triton types it (`get_type_id`), as the numpy scalar we pass: a Python int
  is i32, u32, i64 or u64 by its range, a Python float fp32 (fp64 when fp32 cannot hold it), a bool i1; a
  numpy scalar keeps its own type (jax-triton refuses those other than np.float32)."""
  if type(value).__name__ == "constexpr" and hasattr(value, "value"):  # tl.constexpr(...), as jax-triton unwraps it
    value = value.value
  if isinstance(value, (bool, np.bool_)):
    return np.bool_(value)
  if isinstance(value, np.generic) and not isinstance(value, float) and np.dtype(value.dtype).kind in "iuf":
    return value
  if isinstance(value, int):
    for dtype in (np.int32, np.uint32, np.int64, np.uint64):
      info = np.iinfo(dtype)
      if info.min <= value <= info.max:
        return dtype(value)
    raise ValueError(f"{where}: integer overflow representing {value} (parameter {param!r})")
  if isinstance(value, float):
    fi = np.finfo(np.float32)
    magnitude = abs(value)
    if math.isinf(value) or math.isnan(value) or magnitude == 0.0 or fi.tiny <= magnitude <= fi.max:
      return np.float32(value)
    return np.float64(value)
  raise TypeError(f"{where}: parameter {param!r} got {type(value).__name__} {value!r}; triton_call takes arrays, "
                  "Refs, TensorDescriptors, ints, floats and bools, or tuples of them")


@dataclasses.dataclass
class Operands:
  """The kernel's operands as one mosaic_kernel call takes them."""

  inputs: list = dataclasses.field(default_factory=list)
  scalars: list = dataclasses.field(default_factory=list)
  refs: list = dataclasses.field(default_factory=list)            # (input index, the Ref)
  slots: list = dataclasses.field(default_factory=list)           # per operand leaf: ("in"|"scalar"|"ref"|"desc", k)

  def add(self, value, param: str, where: str):
    """The param_order entry of one operand (a tuple for a tuple); its leaves recorded in order."""
    if isinstance(value, (tuple, list)):
      return tuple(self.add(v, f"{param}[{i}]", where) for i, v in enumerate(value))
    if isinstance(value, TensorDescriptor):
      return self._descriptor(value, param, where)
    if is_ref(value):
      self.inputs.append(value[...])
      self.refs.append((len(self.inputs) - 1, value))
      self.slots.append(("ref", len(self.inputs) - 1))
      return operand_refs.input_(len(self.inputs) - 1)
    if is_array(value):
      self.inputs.append(value)
      self.slots.append(("in", len(self.inputs) - 1))
      return operand_refs.input_(len(self.inputs) - 1)
    if value is None or isinstance(value, (dict, str, bytes)):
      raise TypeError(f"{where}: parameter {param!r} got {value!r}; triton_call takes arrays, Refs, "
                      "TensorDescriptors, ints, floats and bools, or tuples of them (Triton's tuple parameters)")
    self.scalars.append(_scalar(value, param, where))
    self.slots.append(("scalar", len(self.scalars) - 1))
    return operand_refs.scalar(len(self.scalars) - 1)

  def _descriptor(self, desc: TensorDescriptor, param: str, where: str):
    if is_ref(desc.base):  # a descriptor of a Ref: the kernel writes it through TMA, and the Ref gets the result
      self.inputs.append(desc.base[...])
      self.refs.append((len(self.inputs) - 1, desc.base))
      self.slots.append(("ref", len(self.inputs) - 1))
    elif is_array(desc.base):
      self.inputs.append(desc.base)
      self.slots.append(("desc", len(self.inputs) - 1))
    else:
      raise TypeError(f"{where}: parameter {param!r} is a TensorDescriptor of {type(desc.base).__name__}, not of "
                      "an array or a Ref")
    operand = operand_refs.input_(len(self.inputs) - 1)
    # Its layout (a Gluon kernel's descriptors carry one) is checked by the kernel's language when the call is traced.
    if tuple(desc.shape) == tuple(desc.base.shape) and tuple(desc.strides) == strides_from_shape(desc.base.shape):
      return tensor_descriptor.TensorDescriptor.from_tensor(operand, tuple(desc.block_shape), desc.padding,
                                                            bool(desc.round_f32_to_tf32), layout=desc.layout)
    return tensor_descriptor.TensorDescriptor(operand, tuple(desc.shape), tuple(desc.strides),
                                              tuple(desc.block_shape), desc.padding, bool(desc.round_f32_to_tf32),
                                              desc.layout)
