"""The one lossless key of Python values: what every compile key that holds a user's value hashes.

A compile cache is only as right as its key, and text is a lossy key: numpy prints an array of more than 1000
elements with ``...`` and its floats to 8 digits, so two tables that differ in one entry, or in a float's ninth
digit, print alike and would share a kernel. `value_key` keys a value by what it is instead: a float by its 8 bytes,
an array by its dtype, shape and bytes, a container by its items, each under a tag of its type, so two values get
one key only when they are equal and of the same types. What it cannot key exactly (an arbitrary object, a traced
value) raises `ValueKeyError`; it never falls back to ``repr``. A front end that knows more kinds of value (a DSL's
numeric types, Triton's dtypes) passes ``extra``: its own exact bytes for them, or None.

    >>> value_key(1.0) == value_key(1.0), value_key(1.0) == value_key(1.0000000001)
    (True, False)
    >>> value_key(np.arange(2000.0)) == value_key(np.arange(2000.0) + (np.arange(2000) == 1000))
    False
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import struct
from typing import Any, Callable

import jax
import numpy as np

from jax_mosaic_ffi.base.errors import ValueKeyError

# Nesting deeper than this is refused: a key is made of values a user wrote, never of a deep graph.
MAX_DEPTH = 64
_jax_scalar_type = type(jax.numpy.float32)  # jnp.float32 and friends: a dtype, as a callable

Extra = Callable[[Any], "bytes | None"]


def value_key(value, *, extra: Extra | None = None) -> bytes:
  """The 32-byte sha256 of ``value``'s exact key; raises `ValueKeyError` for what it cannot key exactly.

  Keyed exactly: None, bools, ints, floats and complex numbers (their bytes: ``0.1`` and ``0.1000000001`` differ,
  so do ``0.0`` and ``-0.0``), str, bytes, ranges; tuples, lists and dicts (in their order) and sets (in no
  order) of keyable values; enum members (their class and name, and value), dataclass instances (their class
  and every field); numpy arrays and jax arrays (dtype, shape and bytes), numpy scalars, dtypes and scalar types
  (ml_dtypes' too), jax.numpy's scalar types. ``extra(v)`` is asked about any other value: the bytes that key it
  exactly (the caller's own tag included), or None to refuse it.
  """
  h = hashlib.sha256()
  update(h, value, extra=extra)
  return h.digest()


def update(h, value, *, extra: Extra | None = None) -> None:
  """Feeds ``value``'s exact key into ``h`` (a hashlib object), as `value_key` hashes it."""
  _Keyer(h, extra).put(value, 0)


def _dtype_key(dtype: np.dtype) -> bytes:
  if dtype.hasobject:
    raise ValueKeyError(f"an array of dtype {dtype} holds Python objects (pointers), whose bytes are no key")
  # name tells ml_dtypes' types apart (bfloat16 and float16 are both '<V2'/'<f2'-sized); str has byte order and
  # unit; descr spells a structured dtype's fields.
  parts = [dtype.name, dtype.str, str(dtype.descr) if dtype.fields else "", str(dtype.shape)]
  return "\0".join(parts).encode()


class _Keyer:
  def __init__(self, h, extra: Extra | None):
    self.h = h
    self.extra = extra
    self.path: set[int] = set()  # containers being keyed: one met again refers to itself

  def tag(self, tag: bytes, *fields: bytes) -> None:
    self.h.update(tag)
    for f in fields:
      self.h.update(struct.pack("<Q", len(f)))
      self.h.update(f)

  def put(self, v, depth: int) -> None:
    if depth > MAX_DEPTH:
      raise ValueKeyError(f"a value nested more than {MAX_DEPTH} levels deep")
    t = type(v)
    if v is None or v is Ellipsis:
      self.tag(b"N" if v is None else b"E")
    elif t is bool:
      self.tag(b"B", b"\1" if v else b"\0")
    elif t is int:
      self.tag(b"I", v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True))
    elif t is float:
      self.tag(b"F", struct.pack("<d", v))
    elif t is complex:
      self.tag(b"C", struct.pack("<dd", v.real, v.imag))
    elif t is str:
      self.tag(b"S", v.encode("utf-8", "surrogatepass"))
    elif t is bytes or t is bytearray:
      self.tag(b"Y" if t is bytes else b"y", bytes(v))
    elif t is range:
      self.tag(b"R")
      self.items((v.start, v.stop, v.step), depth)
    elif t is tuple or t is list:
      self.tag(b"T" if t is tuple else b"L", struct.pack("<Q", len(v)))
      self.nested(v, depth, lambda: self.items(v, depth))
    elif t is dict:
      self.tag(b"D", struct.pack("<Q", len(v)))
      self.nested(v, depth, lambda: self.items((x for kv in v.items() for x in kv), depth))
    elif t is set or t is frozenset:
      # No order: iteration follows string hashes, which differ from process to process.
      keys = sorted(value_key(x, extra=self.extra) for x in v)
      self.tag(b"s" if t is set else b"f", *keys)
    elif isinstance(v, enum.Enum):
      self.tag(b"e", t.__module__.encode(), t.__qualname__.encode(), v.name.encode())
      self.put(v.value, depth + 1)
    elif isinstance(v, np.ndarray):
      self.tag(b"A", _dtype_key(v.dtype), struct.pack(f"<{v.ndim}Q", *v.shape), np.ascontiguousarray(v).tobytes())
    elif isinstance(v, np.generic):
      self.tag(b"a", _dtype_key(v.dtype), np.asarray(v).tobytes())
    elif isinstance(v, np.dtype):
      self.tag(b"d", _dtype_key(v))
    elif isinstance(v, type) and issubclass(v, np.generic):
      try:
        dtype = np.dtype(v)
      except TypeError:  # an abstract one (np.floating): no dtype of its own
        raise ValueKeyError(f"numpy's {v.__name__} is an abstract scalar type, not a dtype") from None
      self.tag(b"t", _dtype_key(dtype))
    elif isinstance(v, _jax_scalar_type):
      self.tag(b"j", _dtype_key(np.dtype(v.dtype)))
    elif isinstance(v, jax.core.Tracer):
      raise ValueKeyError(f"a traced value ({v.aval.str_short()}) has no value until the program runs; pass a "
                          "concrete array or number")
    elif isinstance(v, jax.Array):
      try:
        data = np.asarray(v)
      except Exception as e:  # an array spread over processes, a deleted one: whatever numpy could not read
        raise ValueKeyError(f"the jax array {v.dtype}{list(v.shape)} could not be read ({type(e).__name__})") from None
      self.tag(b"J", _dtype_key(data.dtype), struct.pack(f"<{data.ndim}Q", *data.shape),
               np.ascontiguousarray(data).tobytes())
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
      fields = dataclasses.fields(v)
      self.tag(b"c", t.__module__.encode(), t.__qualname__.encode(), *(f.name.encode() for f in fields))
      self.nested(v, depth, lambda: self.items((getattr(v, f.name) for f in fields), depth))
    else:
      found = self.extra(v) if self.extra is not None else None
      if found is None:
        raise ValueKeyError(f"a {t.__module__}.{t.__qualname__} cannot be keyed exactly (only numbers, strings, "
                            "bytes, None, arrays, dtypes, enums, dataclasses and containers of them can)")
      self.tag(b"X", bytes(found))

  def items(self, values, depth: int) -> None:
    for x in values:
      self.put(x, depth + 1)

  def nested(self, container, depth: int, body) -> None:
    if id(container) in self.path:
      raise ValueKeyError(f"a {type(container).__name__} that contains itself")
    self.path.add(id(container))
    try:
      body()
    finally:
      self.path.discard(id(container))
