"""Itanium C++ names (``_Z3addIfEvPKT_S2_PS0_i``) back to C++ text, by the C++ runtime's own demangler.

libstdc++'s ``__cxa_demangle`` is maintained with the compilers that mangle, loaded by every process that
has jaxlib, and takes microseconds; writing our own would mean re-implementing substitutions and
template-parameter references. Where the library cannot be loaded, nothing is demangled (None) and the
kernel's parameter types are simply unknown: the size check still runs.
"""

from __future__ import annotations

import ctypes
import functools

# The longest name we hand to the demangler: a kernel symbol is at most the contract's max_symbol_length.
_MAX_NAME = 1 << 16


@functools.cache
def _demangler():
  try:
    library = ctypes.CDLL("libstdc++.so.6")
    # A C symbol's name, not a private member.
    demangle, free = getattr(library, "__cxa_demangle"), ctypes.CDLL(None).free  # noqa: B009
  except (OSError, AttributeError):
    return None
  demangle.restype = ctypes.c_void_p
  demangle.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                       ctypes.POINTER(ctypes.c_int)]
  free.argtypes = [ctypes.c_void_p]
  free.restype = None
  return demangle, free


def demangle(symbol: str) -> str | None:
  """``"_Z3addIfEvPKT_S2_PS0_i"`` -> ``"void add<float>(float const*, float const*, float*, int)"``;
  None for a name that is not mangled, or that the demangler refuses."""
  functions = _demangler()
  if functions is None or not symbol.startswith("_Z") or len(symbol) > _MAX_NAME:
    return None
  demangle_fn, free = functions
  status = ctypes.c_int()
  text = demangle_fn(symbol.encode(), None, None, ctypes.byref(status))
  if not text:
    return None
  try:
    return ctypes.string_at(text).decode(errors="replace")
  finally:
    free(text)


def split_top_level(text: str, separator: str = ",") -> list[str]:
  """``"a<b, c>, d (*)(e, f)"`` -> ``["a<b, c>", "d (*)(e, f)"]``: split outside brackets."""
  parts, depth, start = [], 0, 0
  for index, char in enumerate(text):
    depth += {"<": 1, "(": 1, "[": 1, ">": -1, ")": -1, "]": -1}.get(char, 0)
    if char == separator and depth == 0:
      parts.append(text[start:index].strip())
      start = index + 1
  parts.append(text[start:].strip())
  return [p for p in parts if p]


def last_group(text: str, open_: str = "(", close: str = ")") -> tuple[int, int] | None:
  """The [start, end) of the inside of the last top-level ``open_ ... close`` group of ``text``."""
  end = text.rfind(close)
  if end < 0:
    return None
  depth = 0
  for index in range(end, -1, -1):
    depth += {close: 1, open_: -1}.get(text[index], 0)
    if depth == 0:
      return index + 1, end
  return None
