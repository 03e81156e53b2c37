"""Host-side tensor descriptors for Triton kernels: `jmf.TensorDescriptor`.

Triton's TMA kernels (the Hopper/Blackwell tutorials, the persistent matmul) take operands as
`triton.tools.tensor_descriptor.TensorDescriptor` parameters, made on the host with
``TensorDescriptor.from_tensor(a, block_shape=[BM, BK])``. Here the same is written in ``param_order``
with the operand's name in place of the tensor::

    param_order=(jmf.TensorDescriptor.from_tensor("in0", block_shape=lambda meta: [meta["BM"], meta["BK"]]),
                 jmf.TensorDescriptor.from_tensor("in1", block_shape=[64, 128]), ..., "scalar0")

The block shape (and a view's shape and strides) may be callables of the config, ``meta`` (or of
``(meta, *input avals)``), as Triton's tutorials set it in a ``pre_hook``. A Gluon kernel's descriptor also
names the block's shared layout (``layout=``, as Gluon's own host descriptor does); the kernel's language checks
it (`kernel.TritonFunction.check_descriptor`) and its repr joins the parameter's type.

The kernel then gets exactly what Triton's launcher passes (compiler/tensordesc_abi.py): where the
compile lowered the descriptors to TMA, a `TensorMap` the runtime encodes with Triton's fields, once per
buffer move and inside command buffers too, followed by the shape and strides as scalars; else the
decomposed form (pointer, shape, strides, flags, shape, strides).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call.operands import Kind, Operand
from jax_mosaic_ffi.call.tensor_map import TensorMap, data_type, row_major_strides
from jax_mosaic_ffi.triton.compiler import tensordesc_abi
from jax_mosaic_ffi.triton.compiler.compile import TritonInfo

_PADDINGS = ("zero", "nan")
_I32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
  """A Triton kernel parameter that is a host tensor descriptor of an input or output.

  As Triton's ``TensorDescriptor(base, shape, strides, block_shape, padding)``, with the operand's name
  (``"in0"``, ``"out1"``) for ``base``; ``from_tensor(operand, block_shape)`` describes the whole array.

  Args:
    operand: the input or output described.
    shape, strides: the view described, in elements, outermost first (the last stride 1); None: the
      array's own shape, row-major.
    block_shape: the block one descriptor load or store moves: powers of two, one per axis.
    padding: ``"zero"`` or ``"nan"`` (floats): what reads past the edge give.
    round_f32_to_tf32: a float32 operand is loaded rounded to TF32 (Triton >= 3.7's field of that name).
    layout: the block's layout in shared memory, which a Gluon kernel's descriptors carry
      (``gl.NVMMASharedLayout.get_default_for(block_shape, gl.float16)``); None for a ``@triton.jit`` kernel,
      whose compiler picks it.

  ``shape``, ``strides``, ``block_shape`` and ``layout`` may be callables of ``meta`` (the constexprs and launch options
  of the config being compiled) or of ``(meta, *input avals)``. In a Triton kernel's ``param_order``::

    TD = jmf.TensorDescriptor
    matmul_call = jmf.mosaic_kernel(
        jmf.triton_kernel(matmul), lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
        grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], meta["BM"]), jmf.cdiv(b.shape[1], meta["BN"])),
        scalars=lambda meta, a, b: (np.int32(a.shape[0]), np.int32(b.shape[1]), np.int32(a.shape[1])),
        param_order=(TD.from_tensor("in0", lambda meta: [meta["BM"], meta["BK"]]),
                     TD.from_tensor("in1", lambda meta: [meta["BK"], meta["BN"]]),
                     TD.from_tensor("out0", lambda meta: [meta["BM"], meta["BN"]]),
                     "scalar0", "scalar1", "scalar2"),
        configs=[dict(BM=128, BN=128, BK=64, num_warps=8), dict(BM=64, BN=64, BK=32, num_warps=4)])

  :doc:`Triton kernels </guides/triton_kernels>` has the kernel, and what it receives.
  """

  operand: str
  shape: Sequence[int] | Callable | None
  strides: Sequence[int] | Callable | None
  block_shape: Sequence[int] | Callable
  padding: str = "zero"
  round_f32_to_tf32: bool = False
  layout: Any = None
  # The operand, read once: the input or output the name refers to (an `Operand` given for the name is taken).
  ref: Operand = dataclasses.field(init=False, repr=False, compare=False)
  # Whose parameter it declares, for another front end's message ("jmf.TensorDescriptor is a Triton kernel's ...").
  front_end = "a Triton kernel"

  def __post_init__(self):
    ref = self.operand if isinstance(self.operand, Operand) else operands.parse(self.operand)
    if ref is None or ref.kind not in (Kind.IN, Kind.OUT):
      raise ValueError(f"TensorDescriptor: operand must name an input or output like 'in0' or 'out0', got "
                       f"{self.operand!r}")
    object.__setattr__(self, "operand", str(ref))
    object.__setattr__(self, "ref", ref)
    where = f"TensorDescriptor({self.operand!r})"
    if (self.shape is None) != (self.strides is None):
      raise ValueError(f"{where}: give shape and strides together (a view), or neither (from_tensor)")
    if self.padding not in _PADDINGS:
      raise ValueError(f"{where}: padding = {self.padding!r}; use 'zero' or 'nan'")
    for what in ("shape", "strides", "block_shape"):
      value = getattr(self, what)
      if value is None or callable(value):
        continue
      object.__setattr__(self, what, _ints(value, what, where))

  @staticmethod
  def from_tensor(operand: str, block_shape, padding: str = "zero", round_f32_to_tf32: bool = False, *,
                  layout=None) -> "TensorDescriptor":
    """A descriptor of the whole array ``operand``, as Triton's (and Gluon's) ``TensorDescriptor.from_tensor``."""
    return TensorDescriptor(operand, None, None, block_shape, padding, round_f32_to_tf32, layout)

  def __str__(self) -> str:
    return f"TensorDescriptor({self.operand!r})"


def _ints(value, what: str, where: str) -> tuple[int, ...]:
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value or not all(
      isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in value):
    raise LaunchError(f"{where}: {what} must be a non-empty sequence of ints, got {value!r}")
  return tuple(int(v) for v in value)


@dataclasses.dataclass(frozen=True)
class Bound:
  """A descriptor evaluated for one call: its operand's aval, the view and the block shape."""

  decl: TensorDescriptor
  aval: Any
  shape: tuple[int, ...]
  strides: tuple[int, ...]
  block_shape: tuple[int, ...]
  view: bool  # shape and strides were given (not the array's own)
  layout: Any = None  # the block's shared layout (a Gluon kernel's), evaluated

  @property
  def signature_type(self) -> str:
    """The parameter's Triton type, as Triton's specialization writes it (a layout's repr after a comma)."""
    ty = tensordesc_abi.type_string(self.aval.dtype, self.block_shape)
    return ty if self.layout is None else tensordesc_abi.with_layout(ty, self.layout)


def bind(decl: TensorDescriptor, evaluate: Callable[[Any, str], Any], in_avals, out_avals, where: str) -> Bound:
  """``decl`` for a call with these avals; ``evaluate(value, what)`` calls a callable option with the meta."""
  name = f"{where}: param_order entry {decl}"
  avals = in_avals if decl.ref.kind is Kind.IN else out_avals
  if decl.ref.index >= len(avals):
    raise LaunchError(f"{name} describes {decl.operand!r}, but the call has {len(in_avals)} input(s) and "
                      f"{len(out_avals)} output(s); name one of in0.., out0..")
  aval = avals[decl.ref.index]

  def value(what):
    return _ints(evaluate(getattr(decl, what), what), what, name)

  block = value("block_shape")
  view = decl.shape is not None
  if view:
    shape, strides = value("shape"), value("strides")
  else:
    shape = tuple(int(d) for d in aval.shape)
    strides = row_major_strides(shape)
  if not 1 <= len(shape) <= 5 or len(strides) != len(shape) or len(block) != len(shape):
    raise LaunchError(f"{name}: block_shape {list(block)} has rank {len(block)}, the "
                      f"{'view' if view else decl.operand} ({aval.dtype}{list(shape)}) rank {len(shape)}"
                      f"{f' with {len(strides)} strides' if len(strides) != len(shape) else ''}; give one size "
                      "per axis (rank 1 to 5)")
  try:
    tensordesc_abi.type_string(aval.dtype, block)
  except ValueError as e:
    raise LaunchError(f"{name}: {e}; describe an array of another dtype") from None
  from triton._utils import validate_block_shape  # noqa: PLC0415  (optional dependency: Triton)
  try:
    validate_block_shape(list(block))  # Triton's own rule: powers of two, at most its largest tensor
  except (TypeError, ValueError) as e:
    raise LaunchError(f"{name}: block_shape {list(block)}: {e}") from None
  if any(d < 1 for d in shape):
    raise LaunchError(f"{name}: {decl.operand} has shape {list(shape)}; a descriptor needs every axis at least 1")
  if view:  # Triton's TensorDescriptor checks these on the host; the pointer form has no TMA to check them
    itemsize = np.dtype(aval.dtype).itemsize
    if strides[-1] != 1 or any(s < 1 or s * itemsize % 16 for s in strides[:-1]):
      raise LaunchError(f"{name}: strides {list(strides)} must end in 1 (contiguous rows), the others at least 1 "
                        "and multiples of 16 bytes")
    reach, size = 1 + sum((d - 1) * s for d, s in zip(shape, strides)), math.prod(aval.shape)
    if reach > size:
      raise LaunchError(f"{name}: the view shape={list(shape)} strides={list(strides)} reaches {reach} elements, "
                        f"but {decl.operand} ({aval.dtype}{list(aval.shape)}) holds {size}")
  elif any(s * np.dtype(aval.dtype).itemsize % 16 for s in strides[:-1]):
    raise LaunchError(f"{name}: {decl.operand} ({aval.dtype}{list(shape)}) has strides {list(strides)} elements; "
                      "Triton's descriptors need every stride but the last to be a multiple of 16 bytes: pad the "
                      "trailing axes")
  if decl.padding == "nan" and not np.issubdtype(aval.dtype, np.floating):
    raise LaunchError(f"{name}: padding='nan' needs a floating-point array, not {aval.dtype}")
  if decl.round_f32_to_tf32 and np.dtype(aval.dtype) != np.float32:
    raise LaunchError(f"{name}: round_f32_to_tf32=True needs a float32 array, not {aval.dtype}")
  return Bound(decl, aval, shape, strides, block, view, evaluate(decl.layout, "layout"))


def expand(order: Sequence[Any], values: Sequence[Any], bound: Sequence[Bound], info: TritonInfo,
           where: str) -> tuple[list[Any], list[Any]]:
  """``param_order`` and scalars with each descriptor expanded as Triton's launcher passes it."""
  names, scalars = [], list(values)

  def scalar(value):
    scalars.append(value)
    names.append(operands.scalar(len(scalars) - 1))

  descriptors = iter(bound)
  metas = iter(info.tensordesc_meta)
  for entry in order:
    if not isinstance(entry, TensorDescriptor):
      names.append(entry)
      continue
    b = next(descriptors)
    name = f"{where}: param_order entry {b.decl}"
    if any(d > _I32_MAX for d in b.shape):
      raise LaunchError(f"{name}: shape {list(b.shape)} has a size over 2^31-1, which Triton passes as i32")
    if info.tensordesc_meta:
      meta = next(metas)
      itemsize = np.dtype(b.aval.dtype).itemsize
      if meta.elem_type != data_type(b.aval.dtype) or meta.elem_size != itemsize:
        raise LaunchError(f"{name}: Triton encodes it as TMA element type {meta.elem_type} of {meta.elem_size} "
                          f"bytes, but {b.decl.operand} is {b.aval.dtype} (type {data_type(b.aval.dtype)}, "
                          f"{itemsize} bytes)")
      if meta.block_size[-1] * meta.elem_size % 16:
        raise LaunchError(f"{name}: TMA moves rows of a multiple of 16 bytes, but a row of the block is "
                          f"{meta.block_size[-1]} x {b.aval.dtype} = {meta.block_size[-1] * meta.elem_size} bytes; "
                          f"make block_shape[-1] a multiple of {16 // math.gcd(16, meta.elem_size)}")
      names.append(TensorMap(b.decl.ref, box=meta.block_size,
                             swizzle=tensordesc_abi.SWIZZLE_BYTES[meta.swizzle], l2_promotion=128,
                             oob_fill="nan" if b.decl.padding == "nan" else "zero",
                             shape=b.shape if b.view else None, strides=b.strides if b.view else None,
                             round_f32_to_tf32=b.decl.round_f32_to_tf32))
    else:
      names.append(b.decl.ref)  # the base pointer; the view starts at the buffer
      for v in b.shape + b.strides:
        scalar(np.int64(v))
      scalar(np.bool_(b.decl.padding == "nan"))
      if tensordesc_abi.decomposed_flags() > 1:
        scalar(np.bool_(b.decl.round_f32_to_tf32))
      elif b.decl.round_f32_to_tf32:
        raise LaunchError(f"{name}: round_f32_to_tf32=True, but this Triton's descriptors have no such field "
                          "(Triton >= 3.7)")
    for v in b.shape:
      scalar(np.int32(v))
    for v in b.strides:
      scalar(np.int64(v))
  return names, scalars
