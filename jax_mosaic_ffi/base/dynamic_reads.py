"""Reads a key cannot follow: code that reaches a value by a name it computes, or reads the process's state.

The key reader (`value_key`, `code_key`) follows what code names: its globals, the attributes it reads, its
closure and defaults. Some code reaches further than its names: ``globals()[name]``, ``vars(module)``, ``eval``,
``exec``, ``__import__`` and ``importlib`` (a module by computed name), ``sys.modules``, a caller's frame
(``sys._getframe``, ``inspect.currentframe``), a file (``open``) and the environment (``os.environ``,
``os.getenv``, ``sys.argv``). A launcher or a ``constexpr_function`` that reads one of these makes a kernel
that depends on something no key of its code holds. Such code is refused (`ValueKeyError`), and its front end
keys the kernel by the IR it makes (Triton's TTIR, the CuTe DSL's MLIR), which holds what the read gave.

These are checked by identity (the objects themselves, wherever the code finds them: a global, an attribute of
``os``, ``from os import getenv``, a default), never by a name alone.

    >>> import os
    >>> refused(os.getenv), refused(os.path.join)
    (True, False)
"""

from __future__ import annotations

import builtins
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import types

from jax_mosaic_ffi.base.errors import ValueKeyError

_BUILTINS = ("globals", "locals", "vars", "eval", "exec", "compile", "__import__", "open", "breakpoint", "input")
_OBJECTS = {
    **{f"{name}()": vars(builtins)[name] for name in _BUILTINS},
    "os.environ": os.environ, "os.environb": getattr(os, "environb", None),
    "posix.environ": getattr(sys.modules.get("posix"), "environ", None), "os.getenv": os.getenv,
    "os.getenvb": getattr(os, "getenvb", None), "os.putenv": os.putenv, "os.unsetenv": os.unsetenv,
    "sys.modules": sys.modules, "sys.argv": sys.argv, "sys.orig_argv": getattr(sys, "orig_argv", None),
    "sys._getframe": vars(sys).get("_getframe"), "sys._current_frames": vars(sys).get("_current_frames"),
    "importlib": importlib, "importlib.import_module": importlib.import_module, "importlib.reload": importlib.reload,
    "importlib.util": importlib.util, "inspect.currentframe": inspect.currentframe, "inspect.stack": inspect.stack,
    "inspect.getouterframes": inspect.getouterframes, "inspect.trace": inspect.trace,
}
_REFUSED = {id(v): (what, v) for what, v in _OBJECTS.items() if v is not None}
# Library modules whose attributes include the above: code that reads one of them by computed name is refused.
_HOLDERS = frozenset(id(m) for m in (os, sys, builtins, importlib, importlib.util, inspect, sys.modules.get("posix"))
                     if m is not None)


def refused(value) -> bool:
  """Whether ``value`` is a read no key can follow (the environment, ``eval``, ``sys.modules``, ...)."""
  found = _REFUSED.get(id(value))
  return found is not None and found[1] is value


def _refuse(what: str, where: str):
  raise ValueKeyError(f"{where} reads {what}, which no key of the code holds: the kernel is keyed by its IR")


def check_value(value, where: str) -> None:
  """Refuses ``value`` if it is one of the reads above (a global or default that holds ``os.environ``)."""
  found = _REFUSED.get(id(value))
  if found is not None and found[1] is value:
    _refuse(found[0], where)


def check_code(loaded: frozenset[str], globals_: dict, where: str) -> None:
  """Refuses code that loads one of the builtins above (``globals``, ``eval``, ...) not shadowed by a global."""
  for name in sorted(loaded):
    if name not in globals_ and name in _BUILTINS:
      _refuse(f"{name}()", where)


def check_module(module: types.ModuleType, names: frozenset[str] | None, where: str) -> None:
  """Refuses a library module that code reads a refused attribute of (``os.environ``, ``sys.modules``, and
  through another module that holds ``os``: ``subprocess.os.environ``), or any attribute by a computed name
  (``names`` None) of a module that holds one."""
  check_value(module, where)
  found = _module_refusal(module, names)
  if found is not None:
    _refuse(found, where)


@functools.lru_cache(maxsize=4096)
def _module_refusal(module: types.ModuleType, names: frozenset[str] | None) -> str | None:
  """What of the above the code reads through ``module`` (kept: a library module's attributes are its release's)."""
  if names is None:
    return f"an attribute of {module.__name__} by a computed name" if id(module) in _HOLDERS else None
  contents = vars(module)
  for name in sorted(names):
    value = contents.get(name)
    found = _REFUSED.get(id(value))
    if found is not None and found[1] is value:
      return f"{found[0]} ({module.__name__}.{name})"
    if id(value) in _HOLDERS and value is not module:
      inner = _module_refusal(value, names)
      if inner is not None:
        return inner
  return None
