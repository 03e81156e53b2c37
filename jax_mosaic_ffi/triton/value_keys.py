"""Triton's values in our cache keys: constexprs, backend options and autotuning spaces, keyed by their content.

Triton keys a constexpr by its ``str`` (a 2000-entry array prints with ``...``); our keys use `base.value_key`,
which keys each value exactly, with Triton's own kinds of value added here: a ``tl.constexpr`` by the value it
wraps, a Triton type (``tl.float16``, a pointer type) by its name, a ``@triton.jit`` function by Triton's own key of
its code (``cache_key``: its source and what it calls), a function of ``triton.language`` by its name (Triton's
release is in every key). Anything else is refused by name: a key that is not exact could hand one kernel's
binary to another.

Triton's own cache (``~/.triton/cache``, which ``triton.compile`` reads first) keys a constexpr by its ``str``
too: where that is not exact (`triton_keys_exactly`), compile.py has Triton compile without it, or a kernel
compiled for another table would come back from there.
"""

from __future__ import annotations

import types
from typing import Any, Callable

from jax_mosaic_ffi.base import value_key as value_key_lib
from jax_mosaic_ffi.base.errors import LaunchError, ValueKeyError


def _triton_value(value) -> bytes | None:
  cls = type(value)
  if not cls.__module__.startswith("triton."):
    return None
  if cls.__qualname__ == "constexpr" and hasattr(value, "value"):
    return b"tl.constexpr\0" + exact(value.value)
  if isinstance(getattr(value, "cache_key", None), str):  # a @triton.jit function: Triton's key of its code
    return b"triton.jit\0" + value.cache_key.encode()
  if any(base.__qualname__ == "base_type" for base in cls.__mro__):  # tl.float16, tl.pointer_type(...)
    return b"tl.type\0" + str(value).encode()
  return None


def _triton_function(value) -> bytes | None:
  found = _triton_value(value)
  if found is None and isinstance(value, types.FunctionType) and (value.__module__ or "").startswith("triton."):
    return f"triton function {value.__module__}.{value.__qualname__}".encode()
  return found


def exact(value, values: Callable[[Any], bytes | None] | None = None) -> bytes:
  """`base.value_key` with Triton's values, and a language's (``values``: a `languages.Language`'s, for what it
  takes beyond Triton's); raises ValueKeyError for what it cannot key exactly."""
  if values is None:
    return value_key_lib.value_key(value, extra=_triton_function)
  return value_key_lib.value_key(value, extra=lambda v: _triton_function(v) or values(v))


def key(value, what: str, where: str, values: Callable[[Any], bytes | None] | None = None) -> str:
  """``value``'s exact key as hex, or LaunchError naming it (``what``, e.g. "the constexpr BLOCK") at ``where``;
  ``values``: as `exact`'s."""
  try:
    return exact(value, values).hex()
  except ValueKeyError as e:
    raise LaunchError(f"{where}: {what} = {value!r} cannot be keyed exactly for the compile cache ({e}); pass a "
                      "number, string, None, a Triton dtype, a @triton.jit function, or a tuple of them (a Gluon "
                      "kernel's: also layouts and classes)") from None


def triton_keys_exactly(value) -> bool:
  """Whether Triton's own cache key holds this constexpr exactly: Triton keys one by its ``cache_key`` (a
  @triton.jit function's), else by ``str``, joined with "-": exact for Python ints, bools, floats and None, strings
  without "-", and Triton's types (their names); not for an array (printed shortened) or a numpy scalar (printed
  as the Python number of another type)."""
  if value is None or type(value) in (int, bool, float) or isinstance(getattr(value, "cache_key", None), str):
    return True
  if type(value) is str:
    return "-" not in value
  return type(value).__module__.startswith("triton.language") and not hasattr(value, "value")
