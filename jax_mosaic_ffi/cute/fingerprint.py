"""A launcher's identity for the disk cache, without tracing it: its code and everything its code reaches.

The DSL keys its own cache on the IR a trace produces, which costs a trace per lookup (0.1-0.2 s for a Hopper
GEMM, as much as a quarter of its compile). This hashes instead what the trace would read: the bytecode of
the launcher and of every function, method and class it reaches through its closure, defaults and globals
(attribute chains on modules included), and the values of the data it reaches (numbers, strings, tuples,
dicts, arrays, instances' attributes), each by its exact content (`base.value_key`: an array by its bytes, never
by its printed text, which numpy shortens). The DSL itself, jax, numpy and the CUDA bindings are named, not walked:
their releases are in the key. Anything else it cannot read exactly (an object without attributes, a C
extension's value) makes the fingerprint None, and the caller keys on a trace instead.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import sys
import types

from jax_mosaic_ffi.base import value_key as value_key_lib
from jax_mosaic_ffi.base.errors import ValueKeyError

# Named, not walked: their release is part of every key (cute/compile.py).
_LIBRARIES = frozenset({"cutlass", "cuda", "jax", "jaxlib", "numpy", "ml_dtypes", "builtins", "typing", "math",
                        "functools", "operator", "dataclasses", "enum", "abc", "collections", "itertools", "inspect"})
_MAX_DEPTH = 24
_MAX_NODES = 20000


class _Opaque(Exception):
  pass


def _user_code(fn: types.FunctionType) -> types.CodeType:
  """The function's own code. The DSL's preprocessor replaces the ``__code__`` of each function it compiles with
  its rewrite, keeping the user's in ``_original_code`` (which it restores from): hashing that keeps a launcher's
  fingerprint the same before and after its first compile, so a process does not key, and compile, the same
  specialization twice (tests/test_cute_compile.py fails if a DSL release moves it)."""
  original = getattr(fn, "_original_code", None)
  return original if isinstance(original, types.CodeType) else fn.__code__


def _library(module_name: str | None) -> bool:
  return (module_name or "").split(".")[0] in _LIBRARIES or (module_name or "") in sys.stdlib_module_names


def dsl_value(value) -> bytes | None:
  """The exact key of a library value `base.value_key` does not know (its ``extra``), or None: a class of a library
  (``cutlass.Float32`` as a constexpr) by its name, which its release pins; a DSL number (``cutlass.Float32(0.5)``)
  by its class and its Python value."""
  if isinstance(value, type) and _library(value.__module__):
    return f"class {value.__module__}.{value.__qualname__}".encode()
  cls = type(value)
  if cls.__module__.split(".")[0] == "cutlass" and isinstance(getattr(value, "value", None), (bool, int, float)):
    return f"{cls.__module__}.{cls.__qualname__}".encode() + b"\0" + value_key_lib.value_key(value.value)
  return None


def exact_key(value) -> bytes:
  """`base.value_key` with the DSL's values (`dsl_value`): raises ValueKeyError for what neither keys exactly."""
  return value_key_lib.value_key(value, extra=dsl_value)


class _Hasher:
  def __init__(self):
    self.h = hashlib.sha256()
    self.seen: dict[int, int] = {}
    self.nodes = 0

  def put(self, *parts) -> None:
    value_key_lib.update(self.h, parts, extra=dsl_value)

  def code_names(self, code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
      if isinstance(const, types.CodeType):
        names |= self.code_names(const)
    return names

  def code(self, code: types.CodeType) -> None:
    self.put("code", code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_argcount,
             code.co_kwonlyargcount, code.co_flags)
    for const in code.co_consts:
      if isinstance(const, types.CodeType):
        self.code(const)
      else:
        self.put(type(const).__name__, const)

  def visit(self, obj, depth: int = 0, names: frozenset[str] = frozenset()) -> None:
    self.nodes += 1
    if depth > _MAX_DEPTH or self.nodes > _MAX_NODES:
      raise _Opaque("too deep")
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
      self.put(type(obj).__name__, obj)
      return
    if isinstance(obj, enum.Enum):
      self.put("enum", type(obj).__module__, type(obj).__qualname__, obj.name)
      return
    if id(obj) in self.seen:
      self.put("seen", self.seen[id(obj)])
      return
    self.seen[id(obj)] = len(self.seen)
    if isinstance(obj, (tuple, list)):
      self.put(type(obj).__name__, len(obj))
      for item in obj:
        self.visit(item, depth + 1)
      return
    if isinstance(obj, (set, frozenset)):
      self.put("set", obj)  # by content, in no order: a set's order differs from process to process
      return
    if isinstance(obj, dict):
      self.put("dict", len(obj))
      for k, v in obj.items():  # in its order, which code that iterates it sees
        self.put(k)
        self.visit(v, depth + 1)
      return
    if isinstance(obj, types.ModuleType):
      self.put("module", obj.__name__)
      if _library(obj.__name__):
        return
      for name in sorted(names):  # mod.helper: the attributes the code names
        if name in vars(obj):
          self.put(name)
          self.visit(vars(obj)[name], depth + 1, names)
      return
    if isinstance(obj, types.BuiltinFunctionType):  # C code: named by where it lives, if that is a library
      owner = getattr(obj, "__self__", None)
      where = obj.__module__ or getattr(owner if isinstance(owner, type) else type(owner), "__module__", None)
      if not _library(where):
        raise _Opaque(f"{where}.{obj.__qualname__}")
      self.put("builtin", where, obj.__qualname__)
      return
    if isinstance(obj, dataclasses.Field):  # a dataclass's field: what its generated code takes from it
      self.put("field", obj.name, _annotation(obj.type), obj.init, obj.kw_only)
      for value in (obj.default, obj.default_factory):
        self.visit(None if value is dataclasses.MISSING else value, depth + 1)
      return
    if isinstance(obj, functools.partial):
      self.put("partial")
      self.visit(obj.func, depth + 1)
      self.visit(obj.args, depth + 1)
      self.visit(obj.keywords, depth + 1)
      return
    if isinstance(obj, types.MethodType):
      self.put("method")
      self.visit(obj.__func__, depth + 1)
      self.visit(obj.__self__, depth + 1)
      return
    module = getattr(obj, "__module__", None) if isinstance(obj, (type, types.FunctionType)) else None
    if isinstance(obj, type):
      self.put("class", obj.__module__, obj.__qualname__)
      if _library(obj.__module__):
        return
      for base in obj.__bases__:
        self.visit(base, depth + 1)
      for k, v in sorted(vars(obj).items()):
        if k in ("__dict__", "__weakref__", "__doc__", "_abc_impl"):  # _abc_impl: ABCMeta's registry and caches
          continue
        self.put(k)
        self.visit(v.__func__ if isinstance(v, (staticmethod, classmethod)) else v, depth + 1)
      return
    if isinstance(obj, property):
      self.visit(obj.fget, depth + 1)
      return
    if isinstance(obj, types.FunctionType):
      self.put("function", module, obj.__qualname__)
      wrapped = getattr(obj, "__wrapped__", None)
      if _library(module) and wrapped is None:
        return
      if wrapped is not None:  # @cute.jit / @cute.kernel keep the user's function here
        self.visit(wrapped, depth + 1)
        if _library(module):
          return
      code = _user_code(obj)
      self.code(code)
      self.visit(obj.__defaults__, depth + 1)
      self.visit(obj.__kwdefaults__, depth + 1)
      for cell in obj.__closure__ or ():
        try:
          self.visit(cell.cell_contents, depth + 1)
        except ValueError:  # an empty cell
          self.put("empty cell")
      referenced = self.code_names(code)
      for name in sorted(referenced):
        if name in obj.__globals__:
          self.put("global", name)
          self.visit(obj.__globals__[name], depth + 1, frozenset(referenced))
      return
    cls = type(obj)
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None and _library(cls.__module__):
      # functools.cache / lru_cache around a function (libraries of kernels cache their compiles so): its code
      # is the wrapped function's, and what the cache holds says nothing about it.
      self.put("wrapper", cls.__module__, cls.__qualname__)
      self.visit(wrapped, depth + 1)
      return
    if _library(cls.__module__):
      self.library_value(obj, cls, depth)
      return
    if hasattr(obj, "__dict__"):
      self.put("instance")
      self.visit(cls, depth + 1)
      self.visit(dict(vars(obj)), depth + 1)
      return
    if wrapped is not None:
      self.visit(wrapped, depth + 1)
      return
    raise _Opaque(f"{cls.__module__}.{cls.__qualname__}")

  def library_value(self, obj, cls: type, depth: int) -> None:
    """A library's object, never by its printed text (numpy shortens an array's): a method of a library's type by
    its name, as its functions are; a value `exact_key` reads (an array, a dtype, a DSL number) by its content;
    anything else by its class's name and its attributes. One with none of these (a C object) is opaque."""
    if isinstance(obj, _DESCRIPTORS):
      self.put("descriptor", obj.__objclass__.__module__, obj.__objclass__.__qualname__, obj.__name__)
      return
    if isinstance(obj, types.MethodWrapperType):  # (5).__add__: the method, and what it is bound to
      self.put("bound", type(obj.__self__).__module__, type(obj.__self__).__qualname__, obj.__name__)
      self.visit(obj.__self__, depth + 1)
      return
    try:
      self.put("value", exact_key(obj))
      return
    except ValueKeyError:
      pass
    slots = [name for c in cls.__mro__ for name in _slot_names(c)]
    if not hasattr(obj, "__dict__") and not slots:
      raise _Opaque(f"{cls.__module__}.{cls.__qualname__}")
    state = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    state.update((name, getattr(obj, name)) for name in slots if hasattr(obj, name))
    self.put("library object", cls.__module__, cls.__qualname__)
    self.visit(state, depth + 1)


_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                types.GetSetDescriptorType, types.MemberDescriptorType)


def _slot_names(cls: type) -> tuple[str, ...]:
  slots = vars(cls).get("__slots__", ())
  return (slots,) if isinstance(slots, str) else tuple(s for s in slots if isinstance(s, str))


def _annotation(annotation) -> str:
  """A dataclass field's type as its generated code sees it: its name (only ClassVar / InitVar change the code)."""
  if isinstance(annotation, str):
    return annotation
  if isinstance(annotation, type):
    return f"{annotation.__module__}.{annotation.__qualname__}"
  if type(annotation).__module__ in ("typing", "types"):  # list[int], Optional[X]: typing spells them whole
    return repr(annotation)
  raise _Opaque(f"annotation {type(annotation).__qualname__}")


def fingerprint(*objects) -> str | None:
  """A hex digest of the objects and all they reach, or None where something cannot be read exactly."""
  hasher = _Hasher()
  try:
    for obj in objects:
      hasher.visit(obj)
  except (_Opaque, ValueKeyError, RecursionError, TypeError):
    return None
  return hasher.h.hexdigest()
