"""The code a Gluon kernel reaches through a class passed as a constexpr, keyed: what Triton's own cache key misses.

Triton keys a kernel by its source and what that source names (a ``@gluon.jit`` helper it calls, a global
``constexpr_function``, an ``@aggregate`` class it names), and each constexpr by its ``cache_key`` (a JIT function's)
or its ``str``. Gluon kernels also take classes as constexprs (Triton's 07-persistence tutorial passes
``MMAImpl=WGMMA``, an ``@aggregate`` whose ``@gluon.jit`` methods issue the MMAs): the kernel runs those methods,
but ``str(WGMMA)`` is only the class's name, so after an edit of ``WGMMA.issue_async_mma`` Triton's cache key is
the same and a warm cache (Triton's, or ours, which holds Triton's key) would return the old kernel.

`class_key` keys such a class by what it holds, as Triton keys an ``@aggregate`` its kernel names: its fields, and
each of its methods (its ``hash_attrs``; a plain class's attributes) by Triton's own key of a JIT function (its
source, its line, what it calls), a Python function by its code, a nested class the same way, a value exactly
(`base.value_key`). It is Gluon's `Language.values`, with which the Triton wing keys every constexpr (our compile
key), and `constexprs_key` adds it to Triton's own key of the source (language.py), so that Triton's cache is exact
too. Classes of Triton and of Python itself are named, not walked: Triton's release is in every key.
"""

from __future__ import annotations

import hashlib
import types
from typing import Any, Mapping

from jax_mosaic_ffi.base.errors import ValueKeyError
from jax_mosaic_ffi.triton import value_keys

# Modules whose classes and functions are named, not walked: their release is in every key.
_LIBRARIES = ("triton", "builtins", "typing", "abc", "dataclasses", "enum", "functools", "collections")
_MAX_DEPTH = 16


def _library(module: str | None) -> bool:
  return (module or "").split(".")[0] in _LIBRARIES


def _jit_key(value) -> str | None:
  """Triton's own key of a JIT function's code (``@gluon.jit``, ``@triton.jit``, ``constexpr_function``)."""
  key = getattr(value, "cache_key", None)
  return key if isinstance(key, str) and hasattr(value, "fn") else None


class _Keyer:
  def __init__(self):
    self.h = hashlib.sha256()
    self.seen: set[int] = set()

  def put(self, *parts) -> None:
    for part in parts:
      data = part if isinstance(part, bytes) else str(part).encode()
      self.h.update(len(data).to_bytes(8, "little"))
      self.h.update(data)

  def code(self, code: types.CodeType) -> None:
    self.put("code", code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_argcount,
             code.co_kwonlyargcount)
    for const in code.co_consts:
      if isinstance(const, types.CodeType):
        self.code(const)
      else:
        self.put(value_keys.exact(const))

  def member(self, value, depth: int) -> None:
    """A class's attribute: its code, or its value."""
    if isinstance(value, (staticmethod, classmethod)):
      value = value.__func__
    if isinstance(value, property):
      value = value.fget
    key = _jit_key(value)
    if key is not None:
      self.put("jit", key)
    elif isinstance(value, types.FunctionType):
      self.put("function", value.__module__, value.__qualname__)
      if not _library(value.__module__):
        self.code(value.__code__)
    elif isinstance(value, type):
      self.cls(value, depth + 1)
    else:
      self.put("value", value_keys.exact(value, class_key))

  def cls(self, cls: type, depth: int) -> None:
    self.put("class", cls.__module__, cls.__qualname__)
    if _library(cls.__module__) or id(cls) in self.seen:
      return
    if depth > _MAX_DEPTH:
      raise ValueKeyError(f"classes nested more than {_MAX_DEPTH} deep")
    self.seen.add(id(cls))
    self.put("fields", str(getattr(cls, "__annotations__", {})))
    attrs = getattr(cls, "hash_attrs", None)
    if isinstance(attrs, list):  # an @aggregate: what Triton keys of one its kernel names (its __init__, methods)
      for value in attrs:
        self.member(value, depth)
      return
    for base in reversed(cls.__mro__):
      if _library(base.__module__):
        continue
      self.put("base", base.__module__, base.__qualname__)
      for name, value in sorted(vars(base).items()):
        if name.startswith("__") and name.endswith("__") and not callable(value):
          continue  # Python's own bookkeeping (__dict__, __doc__, __module__, dataclass fields...)
        self.put(name)
        self.member(value, depth)


def class_key(value) -> bytes | None:
  """The exact key of a class (a constexpr Gluon kernels take: module doc), or None for any other value
  (`base.value_key`'s ``extra``)."""
  if not isinstance(value, type):
    return None
  keyer = _Keyer()
  keyer.cls(value, 0)
  return b"gluon class\0" + keyer.h.digest()


def _holds_class(value, depth: int = 0) -> bool:
  if isinstance(value, type):
    return True
  if depth < _MAX_DEPTH and isinstance(value, (tuple, list)):
    return any(_holds_class(v, depth + 1) for v in value)
  if depth < _MAX_DEPTH and isinstance(value, dict):
    return any(_holds_class(v, depth + 1) for v in value.values())
  return False


def constexprs_key(constexprs: Mapping[Any, Any]) -> str:
  """A hex key of the constexprs that hold classes, by their content (`class_key` for each class), for Triton's own
  key of the source; "" where none does (numbers, layouts, dtypes, JIT functions: Triton's key holds them)."""
  held = sorted((repr(path), value_keys.exact(value, class_key).hex()) for path, value in constexprs.items()
                if _holds_class(value))
  return hashlib.sha256(repr(held).encode()).hexdigest() if held else ""
