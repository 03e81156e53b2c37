"""A launcher's identity for the compile cache, without tracing it: its code and everything its code reaches.

The DSL keys its own cache on the IR a trace produces, which costs a trace per lookup (0.1-0.2 s for a Hopper
GEMM, as much as a quarter of its compile). Ours reads instead what the trace would read, through the one reader
of code and values (`base.value_key`): the launcher's bytecode and line table, and every function, method, class,
instance, global, closure cell and default it reaches, each whole. The DSL (``cutlass``) and the CUDA bindings
are named, not walked: their releases are in the key. What the reader cannot read whole makes the fingerprint
None, and the caller keys on a trace instead. So do the DSL's own settings that change what it compiles (its
``CUTE_*`` environment variables, `settings_key`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import types

from jax_mosaic_ffi.base import value_key as value_key_lib
from jax_mosaic_ffi.base.errors import ValueKeyError


def _user_code(fn: types.FunctionType) -> types.CodeType:
  """The function's own code. The DSL's preprocessor replaces the ``__code__`` of each function it compiles with
  its rewrite, keeping the user's in ``_original_code`` (which it restores from): reading that keeps a launcher's
  key the same before and after its first compile, so a process does not key, and compile, the same
  specialization twice (tests/test_cute_compile.py fails if a DSL release moves it)."""
  original = getattr(fn, "_original_code", None)
  return original if isinstance(original, types.CodeType) else fn.__code__


_CACHE_WRAPPER = type(functools.cache(lambda: None))  # functools.cache's and lru_cache's (a C type)


def _dsl_value(value, keyer) -> bool:
  """A DSL number (``cutlass.Float32(0.5)``: a C-backed object) by its class and its Python value."""
  cls = type(value)
  if not TOOLCHAIN.origins.cls(cls):  # the DSL's and the standard library's own, by where they live
    return False
  if cls.__module__.split(".")[0] == "cutlass" and type(getattr(value, "value", None)) in (bool, int, float):
    keyer.text(b"dsl number", cls.__module__, cls.__qualname__)
    keyer.put(value.value, 1, "a DSL number's value")
    return True
  wrapped = getattr(value, "__wrapped__", None)
  if cls is _CACHE_WRAPPER and wrapped is not None:
    # functools.cache / lru_cache around a function (libraries of kernels cache their compiles so): its code is
    # the wrapped function's, and what the cache holds says nothing about it.
    keyer.text(b"wrapper", cls.__module__, cls.__qualname__)
    keyer.put(wrapped, 1, "the function a cache wraps")
    return True
  return False


def _bookkeeping(name: str) -> bool:
  """The attributes the DSL sets on a function it compiles, its own state (the compiler object, the code it
  replaced, whether and for what it rewrote the function, where it was decorated): they change at its first
  compile, or name the file, and none is the kernel's. Every other attribute is read."""
  return name.startswith(_DSL_ATTRIBUTES) or name in ("_original_code", "_decorator_location")


_DSL_ATTRIBUTES = ("_dsl_", "_preprocessed", "_pyir_", "__pyir_")

TOOLCHAIN = value_key_lib.Toolchain(libraries=frozenset({"cutlass", "cuda"}), extra=_dsl_value,
                                    user_code=_user_code, bookkeeping=_bookkeeping)


def exact_key(value, name: str = "the value", ir: bool = False) -> bytes:
  """`base.value_key` with the DSL's values: raises ValueKeyError for what it cannot read whole (``name``: what
  the value is, as the error names it; ``ir``: the caller keys a refused value by a trace)."""
  return value_key_lib.value_key(value, toolchain=TOOLCHAIN, name=name, ir=ir)


def fingerprint(*objects) -> str | None:
  """A hex digest of the objects and all they reach, or None where something cannot be read whole (the caller
  keys them by a trace)."""
  try:
    return exact_key(objects, ir=True).hex()
  except (ValueKeyError, RecursionError):
    return None


def settings_key() -> str:
  """The DSL's settings in the environment: every ``CUTE_*`` variable but those the DSL itself declares do not
  change its compile (`not_compiling`: logging, dumps, its own cache's folder), so a debug variable set on one node
  does not lose it every packed kernel. A variable it does not declare (one it reads otherwise, or another tool's)
  is keyed: at worst a compile where one that changes nothing is set, never a stale kernel. Read without importing
  the DSL, so a warm process still imports none."""
  return "\0".join(settings_environment())


def settings_environment() -> list[str]:
  """The keyed ``CUTE_*`` variables that are set, as ``NAME=value`` (what a pack's manifest shows of them)."""
  skipped = not_compiling()
  return [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("CUTE_") and k not in skipped]


# The DSL's declarations of its settings (base_dsl/env_manager.py: ``env_var("LOG_LEVEL", affects_compile=False,
# ...)``) and of the prefixes they are read under (``CUTLASS_FAMILY_DSL_PREFIXES``).
_NOT_COMPILING = re.compile(rb'env_var\(\s*"([A-Z0-9_]+)"\s*,\s*affects_compile\s*=\s*False\b')
_PREFIXES = re.compile(rb"CUTLASS_FAMILY_DSL_PREFIXES\b[^=]*=\s*frozenset\(\s*\{([^}]*)\}")
_MAX_SOURCE_BYTES = 4 << 20


@functools.cache
def not_compiling() -> frozenset[str]:
  """The environment variables the installed DSL declares ``affects_compile=False``, read from its source where the
  import of ``cutlass`` would find it (none where it is not there or says otherwise: then every one is keyed)."""
  try:
    spec = importlib.util.find_spec("cutlass")
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    with open(os.path.join(folders[0], "base_dsl", "env_manager.py"), "rb") as f:
      source = f.read(_MAX_SOURCE_BYTES)
  except (ImportError, ValueError, IndexError, OSError):
    return frozenset()
  declared = _PREFIXES.search(source)
  prefixes = [p.decode() for p in re.findall(rb'"([A-Z_]+)"', declared.group(1))] if declared else ["CUTE_DSL"]
  return frozenset(f"{prefix}_{name.decode()}" for prefix in prefixes for name in _NOT_COMPILING.findall(source))
