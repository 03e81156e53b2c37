"""Host-side Triton tensor descriptors: what Triton's launcher makes of a ``tensordesc`` parameter.

A ``@triton.jit`` kernel may take a `triton.tools.tensor_descriptor.TensorDescriptor` parameter; its
signature type is ``tensordesc<fp16[64, 64]>`` (element type, block shape), exactly as Triton's own
specialization writes it. Triton's launcher (``triton/backends/nvidia/driver.py``: ``make_launcher``
expands the signature, ``make_tensordesc_arg`` the values) passes each one to the compiled kernel as
several parameters:

* when the compile lowered the descriptors to TMA, its metadata's ``tensordesc_meta`` holds one entry per
  descriptor, and the kernel takes a ``CUtensorMap`` (128 bytes by value, encoded with that entry's swizzle,
  element type and box = its ``block_size``, which Triton may have cut smaller than the block shape; no
  interleave, unit element strides, L2 promotion 128 B, NaN out-of-bounds fill for ``padding="nan"``), then
  the shape (i32 each) and strides (i64 each, in elements);
* otherwise (``tensordesc_meta`` empty: targets before sm_90) the descriptor was decomposed: the base
  pointer, the shape and strides (i64 each), the flags (``padding == "nan"``, and in Triton releases whose
  `TensorDescriptor` has ``round_f32_to_tf32``, that one too; i1 each), then the shape (i32) and strides
  (i64) again.

This module holds that knowledge (types, metadata, the expanded parameter list); binding a call's operands
to it is `tensor_descriptor.py`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np

# A host descriptor's type as Triton's specialization writes it: tensordesc<fp16[64, 64]>, and a Gluon kernel's with
# the block's shared layout after a comma (tensordesc<fp16[64, 64],NVMMASharedLayout(swizzle_byte_width=128, ...)>).
# Triton evaluates that layout text with its layout classes in scope, so it is taken only as a call of one name with
# literal ints, bools and lists: no quotes, dots or nested calls.
_TYPE = re.compile(r"tensordesc<([A-Za-z0-9]+)\[\s*(\d+(?:\s*,\s*\d+)*)\s*\](?:,([A-Za-z][A-Za-z0-9_]*"
                   r"\([A-Za-z0-9_=,\[\] ]*\)))?>")
# CUtensorMapSwizzle values our tensor maps encode (none, 32, 64, 128 bytes); the bytes `TensorMap` takes.
SWIZZLE_BYTES = {0: None, 1: 32, 2: 64, 3: 128}


def is_descriptor(ty) -> bool:
  return isinstance(ty, str) and ty.startswith("tensordesc")


def parse_type(ty: str) -> tuple[str, tuple[int, ...]] | None:
  """(element type, block shape) of a host descriptor type as Triton writes it, a shared layout after them
  or not; None if it is not one (im2col descriptors included, which we do not launch)."""
  match = _TYPE.fullmatch(ty)
  if match is None:
    return None
  return match.group(1), tuple(int(d) for d in match.group(2).split(","))


def with_layout(ty: str, layout) -> str:
  """The type ``ty`` (``tensordesc<fp16[64, 64]>``) of a descriptor whose block has this shared layout (a Gluon
  kernel's), as Triton's specialization writes it: the layout's repr after a comma."""
  return f"{ty[:-1]},{layout!r}>"


def type_string(dtype, block_shape: Sequence[int]) -> str:
  """The signature type Triton's specialization gives a `TensorDescriptor` of this dtype and block shape.

  Raises ValueError for a dtype Triton has no descriptor of (bool: Triton's compiler aborts the process on
  an i1 descriptor, so it never reaches it).
  """
  from triton._utils import canonicalize_dtype  # noqa: PLC0415  (optional dependency: Triton)
  name = np.dtype(dtype).name
  try:
    element = canonicalize_dtype(name)
  except KeyError:
    element = None
  if element is None or element in ("u1", "void"):
    raise ValueError(f"Triton has no tensor descriptor of {name}")
  return f"tensordesc<{element}{list(int(d) for d in block_shape)}>"


@dataclasses.dataclass(frozen=True)
class DescriptorMeta:
  """One entry of a compile's ``tensordesc_meta``, as the launcher encodes it (host enums)."""

  swizzle: int                 # CUtensorMapSwizzle
  elem_size: int               # bytes
  elem_type: int               # CUtensorMapDataType (the host's, after Triton's device-to-host mapping)
  block_size: tuple[int, ...]  # the box, outermost first

  @classmethod
  def from_triton(cls, entry: Any, index: int) -> "DescriptorMeta":
    """Decodes and bounds one entry; ValueError says what we cannot encode."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST  # noqa: PLC0415  (optional: Triton)
    if not isinstance(entry, dict):
      raise ValueError(f"descriptor {index}: Triton's tensordesc_meta entry is {entry!r}, not a dict")
    if entry.get("fp4_padded"):
      raise ValueError(f"descriptor {index}: Triton lowered it as padded fp4, which jax_mosaic_ffi does not encode")
    if entry.get("is_im2col"):
      raise ValueError(f"descriptor {index}: Triton lowered it as an im2col descriptor, which jax_mosaic_ffi "
                       "does not encode")
    try:
      swizzle, size, device_type = int(entry["swizzle"]), int(entry["elem_size"]), int(entry["elem_type"])
      block = tuple(int(b) for b in entry["block_size"])
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"descriptor {index}: Triton's tensordesc_meta entry {entry!r} lacks a field we read "
                       f"({type(e).__name__}: {e})") from None
    if swizzle not in SWIZZLE_BYTES:
      raise ValueError(f"descriptor {index}: Triton asks for swizzle mode {swizzle}; jax_mosaic_ffi encodes "
                       f"modes {sorted(SWIZZLE_BYTES)} (none, 32, 64, 128 bytes)")
    if device_type not in TMA_DTYPE_DEVICE_TO_HOST:
      raise ValueError(f"descriptor {index}: Triton's element type {device_type} has no host TMA type")
    return cls(swizzle, size, int(TMA_DTYPE_DEVICE_TO_HOST[device_type]), block)


def metas(raw, signature: Sequence[str], name: str) -> tuple[DescriptorMeta, ...]:
  """The decoded ``tensordesc_meta`` of a compile: one per descriptor of the signature, or none (the
  decomposed form). ValueError when it is neither, or names what we cannot encode."""
  count = sum(1 for ty in signature if is_descriptor(ty))
  raw = list(raw or ())
  if raw and len(raw) != count:
    raise ValueError(f"'{name}': Triton's metadata describes {len(raw)} tensor descriptors, the signature has "
                     f"{count}")
  return tuple(DescriptorMeta.from_triton(entry, k) for k, entry in enumerate(raw))


def decomposed_flags() -> int:
  """How many i1 flags a decomposed descriptor carries in the installed Triton: ``padding == "nan"``, and
  ``round_f32_to_tf32`` where its `TensorDescriptor` has that field (Triton >= 3.7)."""
  from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: PLC0415  (optional dependency: Triton)
  return 1 + int("round_f32_to_tf32" in {f.name for f in dataclasses.fields(TensorDescriptor)})


def expanded_param_count(signature: Sequence[str], tma: bool) -> int:
  """How many kernel parameters the signature's parameters become (Triton's scratch pointers excluded)."""
  count = 0
  for ty in signature:
    if not is_descriptor(ty):
      count += 1
      continue
    rank = len(parse_type(ty)[1])
    count += 1 + 2 * rank if tma else 1 + 2 * rank + decomposed_flags() + 2 * rank
  return count
