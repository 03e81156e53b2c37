"""Reads a key cannot follow: code that reaches a value by a name it computes, or reads the process's state.

The key reader (`value_key`, `code_key`) follows what code names: its globals, the attributes it reads, its
closure and defaults. Some code reaches further than its names: ``globals()[name]``, ``vars(module)``, ``eval``,
``exec``, ``__import__`` and ``importlib`` (a module by computed name), ``sys.modules``, a caller's frame
(``sys._getframe``, ``inspect.currentframe``), a file (``open``) and the environment (``os.environ``,
``os.getenv``, ``sys.argv``). A launcher or a ``constexpr_function`` that reads one of these makes a kernel
that depends on something no key of its code holds. Such code is refused (`ValueKeyError`), and its front end
keys the kernel by the IR it makes (Triton's TTIR, the CuTe DSL's MLIR), which holds what the read gave.

These are checked by identity (the objects themselves, wherever the code finds them: a global, an attribute of
``os``, ``from os import getenv``, a default, a method of a library's class such as ``pathlib.Path.read_text``),
never by a name alone. So are the library functions that read them for the code (`OUTSIDE`): what the
environment, a file, the folder or another program gives them is no more in a key than a read the code makes
itself: ``os.path.expandvars`` and ``expanduser``, ``os.path.abspath`` (the working folder), ``pathlib``'s reads,
``os.listdir`` and friends, ``glob``, ``linecache`` and ``inspect``'s source readers, ``numpy.load`` and its
kin, ``subprocess``, ``shutil.which``, ``tempfile.gettempdir``, ``getpass.getuser``. Functions that read an
object's attributes by a computed name (``operator.attrgetter``, ``inspect.getmembers``, ``getattr_static``)
are met as the values handed to them: a module given to any function is read whole (base/code_names.py).

    >>> import os
    >>> refused(os.getenv), refused(os.path.join)
    (True, False)
"""

from __future__ import annotations

import builtins
import functools
import getpass
import glob
import importlib
import importlib.util
import inspect
import io
import linecache
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import types

import numpy as np

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
# Library functions that read the outside world for the code (by identity, wherever the code finds them).
_OS_READS = ("getcwd", "getcwdb", "listdir", "scandir", "stat", "lstat", "access", "readlink", "open", "read",
             "pread", "readv", "walk", "fwalk", "getlogin", "get_terminal_size", "popen", "system", "uname")
_PATH_READS = ("expandvars", "expanduser", "abspath", "realpath", "relpath", "exists", "lexists", "isfile",
               "isdir", "islink", "ismount", "getsize", "getmtime", "getatime", "getctime", "samefile")
_PATHLIB_READS = ("read_text", "read_bytes", "open", "iterdir", "glob", "rglob", "exists", "is_file", "is_dir",
                  "is_symlink", "stat", "lstat", "readlink", "resolve", "absolute", "expanduser", "home", "cwd",
                  "samefile", "owner", "group", "walk")
OUTSIDE = {
    **{f"os.{n}": vars(os).get(n) for n in _OS_READS},
    **{f"os.path.{n}": vars(os.path).get(n) for n in _PATH_READS},
    **{f"pathlib.Path.{n}": inspect.getattr_static(pathlib.Path, n, None) for n in _PATHLIB_READS},
    **{f"io.{n}": vars(io).get(n) for n in ("FileIO", "open_code")},
    **{f"glob.{n}": vars(glob).get(n) for n in ("glob", "iglob")},
    **{f"linecache.{n}": vars(linecache).get(n) for n in ("getline", "getlines", "updatecache")},
    **{f"inspect.{n}": vars(inspect).get(n) for n in ("getsource", "getsourcelines", "getsourcefile", "findsource",
                                                       "getcomments")},
    **{f"numpy.{n}": getattr(np, n, None) for n in ("load", "loadtxt", "genfromtxt", "fromfile", "memmap",
                                                     "fromregex")},
    **{f"subprocess.{n}": vars(subprocess).get(n) for n in ("run", "Popen", "call", "check_call", "check_output",
                                                             "getoutput", "getstatusoutput")},
    "shutil.which": shutil.which, "tempfile.gettempdir": tempfile.gettempdir,
    "tempfile.gettempdirb": tempfile.gettempdirb, "getpass.getuser": getpass.getuser,
}
_OBJECTS.update(OUTSIDE)
_REFUSED = {id(v): (what, v) for what, v in _OBJECTS.items() if v is not None}
# Attribute names through which code reads an object's attributes by a name it computes (``mod.__dict__[name]``);
# an object the code hands to a function (``getattr``, ``operator.attrgetter(name)``, ``inspect.getmembers``) is
# a value the code uses whole (base/code_names.py), wherever the function comes from.
COMPUTED_READER_NAMES = frozenset({"__dict__", "__getattribute__"})


# Library modules whose attributes include the above: code that reads one of them by computed name is refused.
_HOLDERS = frozenset(id(m) for m in (os, sys, builtins, importlib, importlib.util, inspect, sys.modules.get("posix"))
                     if m is not None)


def holds_state(module: types.ModuleType) -> bool:
  """Whether ``module`` is one whose attributes are the process's state (``os``, ``sys``, ``builtins``, ...)."""
  return id(module) in _HOLDERS


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


def check_module(module: types.ModuleType, names: frozenset[str], computed: bool, where: str) -> None:
  """Refuses a library module that code reads a refused attribute of (``os.environ``, ``sys.modules``, and
  through another module that holds ``os``: ``subprocess.os.environ``), or, where it reads attributes by a
  computed name (``computed``: ``getattr``, the module handed to a library function), one that holds any of them or
  a module that does."""
  check_value(module, where)
  found = _module_refusal(module, names, computed)
  if found is not None:
    _refuse(found, where)


def check_class(cls: type, names: frozenset[str], computed: bool, where: str) -> None:
  """Refuses a library class whose refused method the code may call (``pathlib.Path(p).read_text()``): one under a
  name the code reads, or any where it reads by a computed name."""
  found = _class_refusal(cls, names, computed)
  if found is not None:
    _refuse(found, where)


@functools.lru_cache(maxsize=4096)
def _class_refusal(cls: type, names: frozenset[str], computed: bool) -> str | None:
  seen = {}
  for base in reversed(cls.__mro__):
    seen.update(vars(base))
  for name in sorted(seen) if computed else sorted(names & seen.keys()):
    value = seen[name]
    found = _REFUSED.get(id(value))
    if found is not None and found[1] is value:
      return f"{found[0]} ({cls.__qualname__}.{name})"
  return None


@functools.lru_cache(maxsize=4096)
def _module_refusal(module: types.ModuleType, names: frozenset[str], computed: bool) -> str | None:
  """What of the above the code reads through ``module`` and the modules it reaches from it by the names it reads
  (``os.path.expandvars``; kept: a library module's attributes are its release's)."""
  if computed and id(module) in _HOLDERS:
    return f"an attribute of {module.__name__} by a computed name"
  todo, seen = [module], {id(module)}
  while todo:
    current = todo.pop()
    contents = vars(current)
    everything = computed and current is module
    for name in sorted(n for n in contents if type(n) is str) if everything else sorted(names & contents.keys()):
      value = contents[name]
      found = _REFUSED.get(id(value))
      if found is not None and found[1] is value:
        return f"{found[0]} ({current.__name__}.{name})"
      if type(value) is types.ModuleType and id(value) not in seen:
        if everything and id(value) in _HOLDERS:  # the code may read it by computed name too
          return f"an attribute of {value.__name__} by a computed name ({module.__name__}.{name})"
        seen.add(id(value))
        todo.append(value)
  return None
