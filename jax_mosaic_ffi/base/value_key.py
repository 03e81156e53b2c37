"""The one key of what a compile reads from Python: values by their content, code by what it is.

A compile cache is only as right as its key. Two ways to get one wrong served stale kernels here: text (numpy
prints an array of more than 1000 elements with ``...``), then partial readings (an instance keyed by its fields
while the methods the kernel calls through it were left out). So `value_key` keys a value by what it is, and only
where it can read all of it:

* plain data, exactly: numbers by their bytes, strings, bytes, tuples, lists, dicts, sets, numpy and jax arrays
  of plain dtypes (dtype, shape and bytes; a structured array field by field, never its padding), dtypes;
* code, whole: a function by its bytecode, constants, names, line table, defaults, closure cells and every global
  it names (a module's attributes it names too), a class by its bases and every attribute it holds (methods,
  properties, nested classes, values), an enum member with its class, an instance by its class and every
  attribute it has (``__dict__`` and slots), following each to the end.

A library's classes and functions (the standard library, numpy, jax, a toolchain's own packages: ``libraries``)
are named, not walked: their release is in every key that reaches them. A library is decided by where its code
lives (`code_origin`: an installed distribution's folder or the standard library's), never by ``__module__`` or
a name. What the reader cannot read completely raises `ValueKeyError` naming where it stopped (and so does any
exception while reading: a refusal, never a crash): a subclass of a container or an array (a masked array's
mask, a matrix), an instance whose class computes its attributes or equality, a C extension's object, code that
reads by a computed name or from the process (`dynamic_reads`), a value nested deeper than `MAX_DEPTH` or larger
than `MAX_NODES`. A front end then keys that value by the IR it produces, never by a partial reading or by text.
A key is the same in every process: no address, no order from hashing (a set by its members' sorted keys). A
dict keeps its order, which code iterating it sees; one whose order may come from hashing (keys of strings or
objects, not sorted: a dict built from a set has the set's order, which differs between processes) is refused, and
its kernel keyed by its IR, which is the same in every process unless the code depends on that order.

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
import types
from typing import Any, Callable

import jax
import numpy as np

from jax_mosaic_ffi.base import code_key
from jax_mosaic_ffi.base import code_origin
from jax_mosaic_ffi.base import dynamic_reads
from jax_mosaic_ffi.base.errors import ValueKeyError

MAX_DEPTH = 64
MAX_NODES = 100_000
_NO_REFERENCE = 1 << 62
_jax_scalar_type = type(jax.numpy.float32)  # jnp.float32 and friends: a dtype, as a callable
# Named, not walked, whatever the front end: their releases are in every key (base/versions.py).
LIBRARIES = frozenset({"numpy", "jax", "jaxlib", "ml_dtypes", "scipy", "opt_einsum"})

# A front end's reader of its own values: (value, keyer) -> True when it wrote the value's key (keyer.tag,
# keyer.put), False for a value it does not know.
Extra = Callable[[Any, "Keyer"], bool]


@dataclasses.dataclass(frozen=True)
class Toolchain:
  """What a front end's compiler reads beyond plain Python: its packages (named, not walked, where their code
  lives in their installed folders: `code_origin`), a reader of its own values (`Extra`), where its functions
  keep their user's code (the CuTe DSL's preprocessor replaces a function's ``__code__`` with its rewrite), and
  which attributes it sets on a user's function as its own bookkeeping (``bookkeeping(name)``: the DSL's compiler
  object, set at its first compile; every other attribute of a function is read)."""

  libraries: frozenset[str] = frozenset()
  extra: Extra | None = None
  user_code: Callable[[types.FunctionType], types.CodeType] | None = None
  bookkeeping: Callable[[str], bool] | None = None
  origins: code_origin.Libraries = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    object.__setattr__(self, "origins", code_origin.Libraries(LIBRARIES | self.libraries))


PLAIN = Toolchain()


def value_key(value, *, toolchain: Toolchain = PLAIN, name: str = "the value", ir: bool = False) -> bytes:
  """The 32-byte sha256 of ``value``'s key: equal keys only for values of the same types and content, and for
  code of the same behaviour. Raises `ValueKeyError` naming (from ``name``, what the value is to the caller) what
  it cannot read completely; with ``ir`` (the caller keys what is refused by the IR it makes), also a dict whose
  order may come from hashing (data with no IR, an option or an autotuning space, is keyed in its order)."""
  keyer = Keyer(hashlib.sha256(), toolchain, ir)
  try:
    keyer.put(value, 0, name)
  except ValueKeyError:
    raise
  except Exception as e:  # whatever reading raised (a property, a repr, recursion): not read whole, so refused
    raise ValueKeyError(f"{name} could not be read whole: reading it raised {type(e).__name__}") from None
  return keyer.h.digest()


def _dtype_key(dtype: np.dtype) -> bytes:
  """A dtype whole: its kind, byte order, size and alignment, and a structured one's every field (its dtype,
  offset and title) and a subarray's base and shape."""
  if dtype.hasobject:
    raise ValueKeyError(f"an array of dtype {dtype} holds Python objects (pointers), whose bytes are no key")
  if dtype.metadata:
    raise ValueKeyError(f"the dtype {dtype} carries metadata, which the key does not read")
  # name tells ml_dtypes' types apart (bfloat16 and float16 are both 2 bytes); str has byte order and unit.
  parts = [dtype.name.encode(), dtype.str.encode(), struct.pack("<QQ?", dtype.itemsize, dtype.alignment,
                                                                 dtype.isalignedstruct)]
  if dtype.subdtype is not None:
    base, shape = dtype.subdtype
    parts += [b"sub", _dtype_key(base), struct.pack(f"<{len(shape)}Q", *shape)]
  for name in dtype.names or ():
    field = dtype.fields[name]
    title = field[2] if len(field) > 2 else None
    if title is not None and type(title) is not str:
      raise ValueKeyError(f"the field {name!r} of the dtype {dtype} has a title that is not a string")
    parts += [b"field", name.encode(), _dtype_key(field[0]), struct.pack("<Q", field[1]), (title or "").encode()]
  return b"".join(struct.pack("<Q", len(p)) + p for p in parts)


def _scalar_type(t: type) -> bool:
  """Whether ``t`` is numpy's (or ml_dtypes') own scalar type of a dtype, not a subclass of one."""
  try:
    return np.dtype(t).type is t
  except TypeError:
    return False


def _array_bytes(array: np.ndarray) -> list[bytes]:
  """The array's content: a structured dtype field by field, so that its padding bytes (which differ from process
  to process) are never read."""
  if array.dtype.names is None:  # (numpy expands a subarray dtype into the array's shape)
    return [np.ascontiguousarray(array).tobytes()]
  out = []
  for name in array.dtype.names:
    field = np.ascontiguousarray(array[name])
    out += [name.encode(), _dtype_key(field.dtype), *_array_bytes(field)]
  return out


# Keys whose hashes are the same in every process (str, bytes and objects hash otherwise from one to the next).
_STABLE_HASH = (int, bool, float, complex, type(None))


def _stable(key) -> bool:
  return type(key) in _STABLE_HASH or (type(key) is tuple and all(_stable(x) for x in key))


def _hash_ordered(d: dict) -> bool:
  """Whether ``d``'s order may come from hashing: two or more keys, not all of a type that hashes alike in every
  process, not in sorted order (a dict built from a set of strings: a literal one is in its text's order, which is
  the same in every process, and keyed by its IR all the same where that is not sorted)."""
  if len(d) < 2 or all(_stable(k) for k in d):
    return False
  keys = list(d)
  try:
    return keys != sorted(keys)
  except TypeError:  # keys that do not compare: no order to tell the set's from
    return True


class Keyer:
  """One key in the making: ``put`` a value, ``tag`` raw bytes. Each composite (a container, a function, a class,
  an instance) is hashed on its own and written as its digest, so that a value shared by two places and two equal
  values key alike; one met again inside itself (a class its methods name, a list that holds itself) is written as
  how many levels up it is. So a key is finite, the same in every process, and never depends on which objects
  happen to be shared or on a set's order."""

  def __init__(self, h, toolchain: Toolchain, ir: bool = False):
    self.h = h
    self.toolchain = toolchain
    self.ir = ir  # refuse what only an IR keys the same in every process (a dict in a hash's order)
    self.stack: dict[int, int] = {}   # id -> level, of the composites being keyed
    self.low = _NO_REFERENCE          # the highest level (lowest number) referred to by the composite in the making
    self.done: dict[int, bytes] = {}  # id -> digest, of composites keyed whole (no reference above themselves)
    self.keep: list[Any] = []         # what done's ids name, alive until the key is made
    self.nodes = 0
    self.library_modules: set = set()  # (library module, what the code reads of it) written whole already

  def tag(self, tag: bytes, *fields: bytes) -> None:
    self.h.update(tag)
    for f in fields:
      self.h.update(struct.pack("<Q", len(f)))
      self.h.update(f)

  def text(self, tag: bytes, *fields: str) -> None:
    self.tag(tag, *(f.encode("utf-8", "surrogatepass") for f in fields))

  def digest_of(self, fill: Callable[[], None]) -> tuple[bytes, int]:
    """(the digest of what ``fill`` writes, the highest level it referred to)."""
    outer_h, outer_low = self.h, self.low
    self.h, self.low = hashlib.sha256(), _NO_REFERENCE
    try:
      fill()
      return self.h.digest(), self.low
    finally:
      self.h, self.low = outer_h, outer_low

  def composite(self, v, fill: Callable[[], None]) -> None:
    """Writes ``v``'s key as ``fill`` writes it (once per object: its digest after that), or a reference."""
    level = self.stack.get(id(v))
    if level is not None:  # inside itself
      self.tag(b"@", struct.pack("<Q", len(self.stack) - level))
      self.low = min(self.low, level)
      return
    found = self.done.get(id(v))
    if found is None:
      level = len(self.stack)
      self.stack[id(v)] = level
      try:
        found, low = self.digest_of(fill)
      finally:
        del self.stack[id(v)]
      if low >= level:  # no reference to what encloses it: its digest is its own, wherever it is met
        self.done[id(v)] = found
        self.keep.append(v)
      else:
        self.low = min(self.low, low)
    self.tag(b"#", found)

  def put(self, v, depth: int, where: str, names: code_key.Reads | None = None) -> None:
    """Writes ``v``'s key; ``where`` says how it was reached, for the error; ``names``: what the code that reached
    a module reads of it (`code_key.Reads`; None: any attribute, so a user's module is read whole)."""
    self.nodes += 1
    if depth > MAX_DEPTH:
      raise ValueKeyError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if self.nodes > MAX_NODES:
      raise ValueKeyError(f"{where}: the values and code reached are more than {MAX_NODES}")
    t = type(v)
    if v is None or v is Ellipsis or v is NotImplemented:
      self.tag({None: b"N", Ellipsis: b"E"}.get(v, b"n"))
    elif t is bool:
      self.tag(b"B", b"\1" if v else b"\0")
    elif t is int:
      self.tag(b"I", v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True))
    elif t is float:
      self.tag(b"F", struct.pack("<d", v))
    elif t is complex:
      self.tag(b"C", struct.pack("<dd", v.real, v.imag))
    elif t is str:
      self.text(b"S", v)
    elif t is bytes or t is bytearray:
      self.tag(b"Y" if t is bytes else b"y", bytes(v))
    elif t is range:
      self.tag(b"R")
      self.items((v.start, v.stop, v.step), depth, where)
    elif t in (tuple, list, dict, set, frozenset):
      self.container(v, depth, where)
    elif isinstance(v, tuple) and isinstance(getattr(t, "_fields", None), tuple) and t.__bases__ == (tuple,):
      self.tag(b"namedtuple")  # a namedtuple: its class (walked) and its items, all its state
      self.put(t, depth + 1, f"{where}'s class")
      self.items(v, depth, where)
    elif isinstance(v, enum.Enum):
      self.tag(b"e")  # its class (every member, every method), then which member and all it holds
      self.put(t, depth + 1, f"{where}'s class")
      self.text(b"m", v.name)
      self.put(v.value, depth + 1, f"{where}.value")
      for attr, x in code_key.attributes(v, where, skip=("__objclass__",)):
        self.text(b"attr", attr)
        self.put(x, depth + 1, f"{where}.{attr}")
    elif t is np.ndarray:
      self.tag(b"A", _dtype_key(v.dtype), struct.pack(f"<{v.ndim}Q", *v.shape), *_array_bytes(v))
    elif isinstance(v, np.generic) and _scalar_type(t):
      self.tag(b"a", _dtype_key(v.dtype), *_array_bytes(np.asarray(v)))
    elif isinstance(v, np.dtype) and self.toolchain.origins.cls(t):
      self.tag(b"d", _dtype_key(v))
    elif isinstance(v, type) and issubclass(v, np.generic) and self.toolchain.origins.cls(v):
      try:
        dtype = np.dtype(v)
      except TypeError:  # an abstract one (np.floating): no dtype of its own
        raise ValueKeyError(f"{where}: numpy's {v.__name__} is an abstract scalar type, not a dtype") from None
      self.tag(b"t", _dtype_key(dtype))
    elif t is _jax_scalar_type:
      self.tag(b"j", _dtype_key(np.dtype(v.dtype)))
    elif isinstance(v, jax.core.Tracer):
      raise ValueKeyError(f"{where} is a traced value ({v.aval.str_short()}), which has no value until the program "
                          "runs; pass a concrete array or number")
    elif isinstance(v, jax.Array) and self.toolchain.origins.cls(t):
      try:
        data = np.asarray(v)
      except Exception as e:  # an array spread over processes, a deleted one: whatever numpy could not read
        raise ValueKeyError(f"{where}: the jax array {v.dtype}{list(v.shape)} could not be read "
                            f"({type(e).__name__})") from None
      self.tag(b"J", _dtype_key(data.dtype), struct.pack(f"<{data.ndim}Q", *data.shape), *_array_bytes(data))
    elif self.toolchain.extra is not None and self.toolchain.extra(v, self):
      pass
    else:
      code_key.put_object(self, v, depth, where, names)

  def items(self, values, depth: int, where: str) -> None:
    for i, x in enumerate(values):
      self.put(x, depth + 1, f"{where}[{i}]")

  def container(self, v, depth: int, where: str) -> None:
    dynamic_reads.check_value(v, where)  # sys.modules, sys.argv
    t = type(v)
    if t is tuple or t is list:
      def fill():
        self.tag(b"T" if t is tuple else b"L", struct.pack("<Q", len(v)))
        self.items(v, depth, where)
    elif t is dict:
      if self.ir and _hash_ordered(v):
        raise ValueKeyError(f"{where} is a dict whose keys are not in sorted order and hash differently in each "
                            "process (a dict built from a set has the set's order, which differs from process to "
                            "process): its kernel is keyed by its IR, the same in every process unless the code "
                            "depends on that order")

      def fill():
        self.tag(b"D", struct.pack("<Q", len(v)))
        for k, x in v.items():  # in its order, which code that iterates it sees
          self.put(k, depth + 1, f"a key of {where}")
          self.put(x, depth + 1, f"{where}[{k!r}]" if type(k) in (str, int) else f"a value of {where}")
    else:
      # No order: iteration follows string hashes, which differ from process to process. Each member is keyed on
      # its own, and the keys are sorted.
      def fill():
        keys = []
        for x in v:
          found, low = self.digest_of(lambda: self.put(x, depth + 1, f"a member of {where}"))
          self.low = min(self.low, low)
          keys.append(found)
        self.tag(b"s" if t is set else b"f", *sorted(keys))
    self.composite(v, fill)
