"""The code a Gluon kernel reaches through its constexprs, keyed: what Triton's own cache key misses.

Triton keys a kernel by its source and what that source names (a ``@gluon.jit`` helper it calls, a global
``constexpr_function``, an ``@aggregate`` class it names), and each constexpr by its ``cache_key`` (a JIT function's)
or its ``str``. Gluon kernels also take classes as constexprs (Triton's 07-persistence tutorial passes
``MMAImpl=WGMMA``, an ``@aggregate`` whose ``@gluon.jit`` methods issue the MMAs): the kernel runs those methods,
but ``str(WGMMA)`` is only the class's name, so after an edit of ``WGMMA.issue_async_mma`` Triton's cache key is
the same and a warm cache (Triton's, or ours, which holds Triton's key) would return the old kernel. This keys that
code: a class by its fields and the code of its methods, as Triton keys an ``@aggregate`` its kernel names (its
``hash_attrs``: each JIT method by Triton's own key of it, with what it calls), an object of a class of the user's
by its class, and tuples, lists and dicts of them item by item.

`constexprs_key` is the one place Gluon's compile key is made: `language.py`'s source adds it to Triton's key.
"""

from __future__ import annotations

import hashlib
import types
from typing import Any, Mapping

# Modules whose code is not walked: their release is in every key (Triton's version is in ours and in Triton's).
_LIBRARIES = ("triton", "builtins", "typing", "abc", "dataclasses", "enum", "functools", "collections")
_MAX_DEPTH = 16


def _library(module: str | None) -> bool:
  return (module or "").split(".")[0] in _LIBRARIES


def _jit_key(value) -> str | None:
  """Triton's own key of a JIT function's code (``@gluon.jit``, ``@triton.jit``, ``constexpr_function``): its
  source, its line and what it calls."""
  key = getattr(value, "cache_key", None)
  return key if isinstance(key, str) and hasattr(value, "fn") else None


class _Keyer:
  def __init__(self):
    self.h = hashlib.sha256()
    self.seen: set[int] = set()
    self.found = False  # whether anything reached code Triton's key of the constexprs misses

  def put(self, *parts) -> None:
    for part in parts:
      data = part if isinstance(part, bytes) else str(part).encode()
      self.h.update(len(data).to_bytes(8, "little"))
      self.h.update(data)

  def code(self, code: types.CodeType) -> None:
    """A Python function's own code (a plain method of a class a kernel takes)."""
    self.put("code", code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_argcount,
             code.co_kwonlyargcount)
    for const in code.co_consts:
      if isinstance(const, types.CodeType):
        self.code(const)
      else:
        self.put(type(const).__name__, repr(const))

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
    elif value is None or isinstance(value, (bool, int, float, str, bytes, tuple)):
      self.put("value", type(value).__name__, repr(value))
    else:
      text = repr(value)
      self.put("object", type(value).__module__, type(value).__qualname__, "" if " at 0x" in text else text)

  def cls(self, cls: type, depth: int) -> None:
    self.put("class", cls.__module__, cls.__qualname__)
    if _library(cls.__module__) or id(cls) in self.seen:
      return
    if depth > _MAX_DEPTH:
      raise RecursionError(f"classes nested more than {_MAX_DEPTH} deep")
    self.seen.add(id(cls))
    self.found = True
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
        if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__"):
          continue
        self.put(name)
        self.member(value, depth)

  def value(self, value, depth: int) -> None:
    if depth > _MAX_DEPTH:
      raise RecursionError(f"constexprs nested more than {_MAX_DEPTH} deep")
    if isinstance(value, type):
      self.cls(value, depth)
    elif isinstance(value, (tuple, list)):
      self.put(type(value).__name__, len(value))
      for item in value:
        self.value(item, depth + 1)
    elif isinstance(value, dict):
      self.put("dict", len(value))
      for k, v in value.items():
        self.put(repr(k))
        self.value(v, depth + 1)
    elif _jit_key(value) is None and not _library(type(value).__module__) and hasattr(value, "__dict__"):
      self.cls(type(value), depth + 1)  # an object of the user's class: the code its methods hold
    else:
      self.put("plain")  # Triton's own key holds it (its str, or a JIT function's key)


def constexprs_key(constexprs: Mapping[Any, Any]) -> str:
  """A hex key of the code the constexpr values reach beyond what Triton's key of them holds (module doc); ""
  where they reach none (numbers, layouts, dtypes, JIT functions), so such a kernel keeps Triton's own key."""
  keyer = _Keyer()
  for path, value in sorted(constexprs.items(), key=lambda item: repr(item[0])):
    keyer.put(repr(path))
    keyer.value(value, 0)
  return keyer.h.hexdigest() if keyer.found else ""
