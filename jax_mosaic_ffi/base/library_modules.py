"""A library's module in a key: named with its distribution's release, and checked for attributes that are not
the library's.

A library's code is named, not read (`code_origin` decides what is a library's): its release says what it does.
But a module is a namespace anyone can write to: ``np.MY_BIAS = 0.5`` or ``cute.my_helper = my_function`` puts
the user's values where the key would take them for the library's. So for each attribute the code reads of a
library module (every one, where it reads by a computed name or hands the module on), the key holds:

* code (a function, a class, C code, a module): read as any value is, so the library's own is named and the
  user's is read whole (a function of the user's set on numpy is the user's function);
* plain data (numbers, strings, bytes, tuples of them, arrays, dtypes): by its content, the library's constants
  (``np.pi``) and the user's values alike;
* an instance of a user's class: read whole;
* anything else (a library's own objects and containers: its state) by its type.

A module of the same top package the code reads through (``cute.arch``) is walked the same way, with the same
names; the modules of other libraries it holds are not (their reads are `dynamic_reads`' to refuse). Nor are those
of the modules that hold the process's state (``os``, ``sys``: their values are the process's, not code).
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
import types

import numpy as np

from jax_mosaic_ffi.base import dynamic_reads

# Plain data keyed by its content wherever a library module holds it.
_DATA = (type(None), bool, int, float, complex, str, bytes, range, np.ndarray, np.generic, np.dtype)
_CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, staticmethod, classmethod, property,
         types.ModuleType)
_SKIPPED = frozenset({"__builtins__", "__loader__", "__spec__", "__file__", "__cached__", "__doc__", "__name__",
                      "__package__", "__path__", "__all__", "__annotations__", "__dict__"})
# Import names whose distribution is named otherwise.
_DISTRIBUTIONS = {"cutlass": "nvidia-cutlass-dsl", "cuda": "cuda-bindings"}


def put(k, module: types.ModuleType, depth: int, where: str, reads) -> None:
  """Writes a library module's key (its name is written already): its release, and the attributes the code reads
  of it (``reads``: code_key.Reads, or None for every one)."""
  computed = reads is None or reads.computed
  names = reads.names if reads is not None else frozenset()
  dynamic_reads.check_module(module, names, computed, where)
  top = module.__name__.split(".")[0]
  k.text(b"release", release(top))
  if dynamic_reads.holds_state(module):
    return
  seen = k.library_modules
  mark = (id(module), reads)
  if mark in seen:
    return
  seen.add(mark)
  contents = vars(module)
  wanted = sorted(n for n in contents if type(n) is str) if computed else sorted(names & contents.keys())
  for name in wanted:
    if name in _SKIPPED:
      continue
    value = contents[name]
    t = type(value)
    if t is types.ModuleType:
      if value.__name__.split(".")[0] == top and k.toolchain.origins.module(value):
        k.text(b"module attr", name)
        k.put(value, depth + 1, f"{module.__name__}.{name}", reads)
    elif t is types.FunctionType and k.toolchain.origins.function(value) and "__wrapped__" not in vars(value):
      k.text(b"function", name, value.__qualname__)  # the library's own (as code_key names it, without a digest)
    elif isinstance(value, _CODE) or t in _DATA or (t in (tuple, frozenset) and _plain(value)):
      k.text(b"attr", name)
      k.put(value, depth + 1, f"{module.__name__}.{name}", reads)
    elif not k.toolchain.origins.cls(t):  # an instance of a user's class, set on the library's module
      k.text(b"attr", name)
      k.put(value, depth + 1, f"{module.__name__}.{name}")
    else:  # the library's own object or state: by its type
      k.text(b"object", name, t.__module__, t.__qualname__)


def _plain(value) -> bool:
  return all(type(x) in _DATA or (type(x) in (tuple, frozenset) and _plain(x)) for x in value)


@functools.lru_cache(maxsize=256)
def release(top: str) -> str:
  """The release of the distribution that installs the package ``top`` ("numpy 2.5.5"; the standard library's:
  Python's version)."""
  if top in sys.stdlib_module_names or top in sys.builtin_module_names:
    return f"python {sys.version.split()[0]}"
  version = getattr(sys.modules.get(top), "__version__", None)  # the distribution's, as it installed it (cheap)
  if isinstance(version, str):
    return f"{top} {version}"
  for name in (_DISTRIBUTIONS.get(top), top):
    if name:
      try:
        return f"{name} {importlib.metadata.version(name)}"
      except (importlib.metadata.PackageNotFoundError, ValueError):
        continue
  return f"{top} (no release found)"
