"""TMA descriptors as kernel parameters: `jmf.TensorMap`, and the scratch buffer.

Hopper kernels read and write tiles with the tensor memory accelerator
(``cp.async.bulk.tensor``), which takes a 128-byte descriptor, a
``CUtensorMap``, as a ``const __grid_constant__`` kernel parameter. The
descriptor holds the buffer's address, so it must be built on the host for
every buffer the kernel is given. Declared here, in ``param_order``::

    jmf.TensorMap("in0", box=(128, 64), swizzle=128)

the runtime builds it (``cuTensorMapEncodeTiled``) when the call first runs on
a device and again only when that buffer's address changed, command buffers
included (csrc/runtime/call_site.cc, EncodeTensorMaps). The dtype, rank, global shape and strides come
from the operand's aval; everything else from the declaration.

Shapes here are in the array's own axis order (outermost first, as
``x.shape``): ``box=(128, 64)`` on a (M, K) array is 128 rows of 64 elements.
The driver takes them innermost first, so in the kernel the TMA coordinates
of that box are ``{k, m}``. ``shape=``/``strides=`` (in elements) describe a
view of the buffer instead of the whole array, as a Triton
``TensorDescriptor(base, shape, strides, block_shape)`` does.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call.operands import Kind, Operand

# CUtensorMapDataType for each element kind and width: (kind, itemsize) -> value.
_DATA_TYPES = {
    ("u", 1): 0, ("i", 1): 0, ("b", 1): 0, ("f", 1): 0,  # 8-bit ints, bool, fp8: bytes
    ("u", 2): 1, ("i", 2): 1, ("u", 4): 2, ("i", 4): 3, ("u", 8): 4, ("i", 8): 5,
    ("f", 4): 7, ("f", 8): 8,
}
_FLOAT16, _BFLOAT16, _TFLOAT32 = 6, 9, 11
_SWIZZLES = {None: 0, 0: 0, 32: 1, 64: 2, 128: 3}
_INTERLEAVES = {None: 0, 0: 0, 16: 1, 32: 2}
_L2 = {None: 0, 0: 0, 64: 1, 128: 2, 256: 3}
_OOB = {"zero": 0, "nan": 1}
MAX_RANK = 5


def data_type(dtype) -> int | None:
  """The CUtensorMapDataType of a JAX dtype, or None."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float16:
    return _FLOAT16
  if dtype == jnp.bfloat16:
    return _BFLOAT16
  kind = "f" if jnp.issubdtype(dtype, jnp.floating) else dtype.kind
  return _DATA_TYPES.get((kind, dtype.itemsize))


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
  """The strides, in elements and outermost first, of a row-major (C-order) array of this shape: each the
  product of the sizes after it (the last 1)."""
  return tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))


def _driver_strides(strides: Sequence[int], itemsize: int) -> list[int]:
  """Element strides (outermost first) as the driver takes them: in bytes, innermost first, the innermost
  axis's left out (always one element)."""
  return [s * itemsize for s in reversed(strides[:-1])]


def _ints(value, what: str, where: str) -> tuple[int, ...]:
  if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool):
    value = (value,)
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
      isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, bool) for v in value):
    raise TypeError(f"{where}: {what} must be a tuple of ints, got {value!r}")
  return tuple(int(v) for v in value)


def _choice(value, table: dict, what: str, where: str) -> int:
  if value not in table:
    names = ", ".join(repr(k) for k in table if k is not None)
    raise ValueError(f"{where}: {what} = {value!r}; use one of {names} (or None)")
  return table[value]


@dataclasses.dataclass(frozen=True)
class TensorMap:
  """A kernel parameter that is a TMA descriptor of an input or output.

  Args:
    operand: ``"in0"``, ``"out1"``: the array it describes.
    box: the tile one TMA copy moves, one size per axis (1..256 each), in the
      array's axis order.
    swizzle: shared-memory swizzle in bytes: None, 32, 64 or 128. The box's
      innermost row must fit in it (128: 64 bf16 elements).
    element_strides: per axis, 1..8 (default all 1); the innermost (last) one
      must be 1 unless interleaved.
    interleave: None, 16 or 32 (bytes; rank 3 or more).
    l2_promotion: None, 64, 128 or 256 (bytes).
    oob_fill: ``"zero"`` or ``"nan"`` (floats only): what reads past the
      array's edge give.
    shape, strides: a view of the operand's buffer to describe instead of
      the array itself, in elements, outermost first (the innermost stride
      must be 1); both or neither. The view must lie inside the buffer.
    round_f32_to_tf32: a float32 operand is read as TF32 (the copy rounds
      each element), for TF32 tensor-core math.

  Declared in ``param_order``, where the kernel takes a ``const __grid_constant__ CUtensorMap``
  (``jmf::TensorMap`` of ``<jax_mosaic_ffi/tma.cuh>``) by value; the runtime encodes it when the call
  first runs on a device, and again only when the buffer moved::

    scale_tiles = jmf.mosaic_kernel(
        kernel, lambda x: x, grid=lambda x: (jmf.cdiv(x.shape[1], 32), jmf.cdiv(x.shape[0], 32)), block=128,
        param_order=(jmf.TensorMap("in0", box=(32, 32), swizzle=128),   # 32 floats: the swizzle span
                     jmf.TensorMap("out0", box=(32, 32), swizzle=128), "scalar0"),
        scalars=(np.float32(3.0),))

  :doc:`TMA descriptors </guides/cuda_kernels>` has the whole kernel.
  """

  operand: str
  box: tuple[int, ...]
  swizzle: int | None = None
  element_strides: tuple[int, ...] | None = None
  interleave: int | None = None
  l2_promotion: int | None = None
  oob_fill: str = "zero"
  shape: tuple[int, ...] | None = None
  strides: tuple[int, ...] | None = None
  round_f32_to_tf32: bool = False
  # The operand, read once: the input or output the name refers to (an `Operand` given for the name is taken).
  ref: Operand = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    ref = self.operand if isinstance(self.operand, Operand) else operands.parse(self.operand)
    if ref is None or ref.kind not in (Kind.IN, Kind.OUT):
      raise ValueError(f"TensorMap: operand must name an input or output like 'in0' or 'out0', got {self.operand!r}")
    object.__setattr__(self, "operand", str(ref))
    object.__setattr__(self, "ref", ref)
    where = f"TensorMap({self.operand!r})"
    object.__setattr__(self, "box", _ints(self.box, "box", where))
    if self.element_strides is not None:
      object.__setattr__(self, "element_strides", _ints(self.element_strides, "element_strides", where))
    if (self.shape is None) != (self.strides is None):
      raise ValueError(f"{where}: give shape and strides together (a view of the buffer), or neither")
    if self.shape is not None:
      object.__setattr__(self, "shape", _ints(self.shape, "shape", where))
      object.__setattr__(self, "strides", _ints(self.strides, "strides", where))
    _choice(self.swizzle, _SWIZZLES, "swizzle", where)
    _choice(self.interleave, _INTERLEAVES, "interleave", where)
    _choice(self.l2_promotion, _L2, "l2_promotion", where)
    _choice(self.oob_fill, _OOB, "oob_fill", where)
    if not isinstance(self.round_f32_to_tf32, (bool, np.bool_)):  # "no" would be truthy: TF32 by accident
      raise ValueError(f"{where}: round_f32_to_tf32 must be True or False, got {self.round_f32_to_tf32!r}")
    object.__setattr__(self, "round_f32_to_tf32", bool(self.round_f32_to_tf32))
    if self.element_strides and self.interleave in (None, 0) and self.element_strides[-1] != 1:
      # The driver ignores it without interleave: the kernel would get every element, not every n-th.
      raise ValueError(f"{where}: element_strides ends in {self.element_strides[-1]}, but without interleave "
                       "TMA has no stride along the innermost axis (the driver ignores it); make it 1")

  def __str__(self) -> str:
    return f"TensorMap({self.operand!r}, box={self.box})"

  def record(self, buffer: int, aval, where: str) -> list[int]:
    """The ``tensor_maps`` attribute's fields for this map over ``aval`` (:doc:`the contract </contract>`)."""
    name = f"{where}: param_order entry {self}"
    shape, rank = tuple(aval.shape), len(aval.shape)
    if self.shape is not None:
      return self._view_record(buffer, aval, name)
    if not 1 <= rank <= MAX_RANK:
      raise ValueError(f"{name}: {self.operand} has rank {rank}; TMA describes arrays of rank 1 to {MAX_RANK}")
    if len(self.box) != rank:
      raise ValueError(f"{name}: box has {len(self.box)} sizes for {self.operand} of shape {list(shape)}; "
                       "give one per axis, in the array's axis order")
    if 0 in shape:
      raise ValueError(f"{name}: {self.operand} is empty (shape {list(shape)}); TMA needs every axis at least 1")
    code = data_type(aval.dtype)
    if code is None:
      raise ValueError(f"{name}: TMA has no data type for {aval.dtype}")
    itemsize = jnp.dtype(aval.dtype).itemsize
    elements = self.element_strides or (1,) * rank
    if len(elements) != rank:
      raise ValueError(f"{name}: element_strides has {len(elements)} entries; give one per axis ({rank})")
    strides = _driver_strides(row_major_strides(shape), itemsize)
    for d, stride in enumerate(strides, start=1):
      if stride % 16:
        axis = rank - d
        raise ValueError(
            f"{name}: {self.operand} ({aval.dtype}{list(shape)}) has a stride of {stride} bytes along axis "
            f"{axis - 1}; TMA needs every stride to be a multiple of 16 bytes: pad the trailing "
            f"axes so that {math.prod(shape[axis:])} elements fill a multiple of 16 bytes")
    return self._fields(buffer, self._code(code, aval, name), shape, strides)

  def _code(self, code: int, aval, name: str) -> int:
    if not self.round_f32_to_tf32:
      return code
    if jnp.dtype(aval.dtype) != jnp.float32:
      raise ValueError(f"{name}: round_f32_to_tf32=True reads float32 as TF32, but {self.operand} is {aval.dtype}")
    return _TFLOAT32

  def _fields(self, buffer: int, code: int, shape, byte_strides) -> list[int]:
    """The record: ``byte_strides`` are those of dims 1.., innermost first."""
    rank = len(shape)
    dims, strides, elements = list(reversed(shape)), list(byte_strides), self.element_strides or (1,) * rank
    pad = MAX_RANK - rank
    return ([buffer, code, rank, _INTERLEAVES[self.interleave], _SWIZZLES[self.swizzle], _L2[self.l2_promotion],
             _OOB[self.oob_fill]] + dims + [1] * pad + strides + [0] * pad + list(reversed(self.box)) + [1] * pad +
            list(reversed(elements)) + [1] * pad)

  def _view_record(self, buffer: int, aval, name: str) -> list[int]:
    """The record of a view (``shape``, ``strides`` in elements) of the operand's buffer."""
    shape, strides, rank = self.shape, self.strides, len(self.shape)
    view = f"the view shape={list(shape)} strides={list(strides)}"
    if not 1 <= rank <= MAX_RANK or len(strides) != rank:
      raise ValueError(f"{name}: {view} must give 1 to {MAX_RANK} sizes and as many strides")
    if len(self.box) != rank:
      raise ValueError(f"{name}: box has {len(self.box)} sizes for {view}; give one per axis")
    if self.element_strides is not None and len(self.element_strides) != rank:
      raise ValueError(f"{name}: element_strides has {len(self.element_strides)} entries; give one per axis ({rank})")
    if any(d < 1 for d in shape) or any(s < 1 for s in strides):
      raise ValueError(f"{name}: {view} needs every size and stride at least 1")
    if strides[-1] != 1:
      raise ValueError(f"{name}: {view} has an innermost stride of {strides[-1]}; TMA reads contiguous rows: make it 1")
    code = data_type(aval.dtype)
    if code is None:
      raise ValueError(f"{name}: TMA has no data type for {aval.dtype}")
    itemsize = jnp.dtype(aval.dtype).itemsize
    for axis, stride in enumerate(strides[:-1]):
      if stride * itemsize % 16:
        raise ValueError(f"{name}: {view} has a stride of {stride * itemsize} bytes along axis {axis}; TMA needs "
                         "every stride to be a multiple of 16 bytes")
    reach = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
    size = math.prod(aval.shape)
    if reach > size:
      raise ValueError(f"{name}: {view} reaches {reach} elements, but {self.operand} ({aval.dtype}"
                       f"{list(aval.shape)}) holds {size}")
    return self._fields(buffer, self._code(code, aval, name), shape, _driver_strides(strides, itemsize))


def scratch_aval(nbytes: int):
  """The extra output that holds a call's scratch: bytes, at least one."""
  return jax.core.ShapedArray((max(int(nbytes), 1),), jnp.uint8)
