"""Where code lives: in a library (named in a key, never walked: its release is in every key) or in the user's
files (read whole).

A name proves nothing: ``functools.wraps`` copies a library function's ``__module__`` and ``__qualname__`` onto a
user's wrapper, and a user's ``profile.py`` or ``queue.py`` has a standard library module's name. So a library is
decided by the file the code is in, as the interpreter found it:

* the standard library: a file under the interpreter's ``stdlib`` / ``platstdlib`` folders (``sysconfig``), not
  in a ``site-packages`` below them, or a module compiled into the interpreter;
* a named library (numpy, jax, Triton, the CuTe DSL, ...): a file under the folder the imported package lives
  in, when that folder is in an installed distribution's place (a ``site-packages`` folder of this interpreter).

A function is a library's when its code's file is; a module when its ``__file__`` is (every ``__path__`` folder
of a namespace package); a class when its module is and the module holds it under its ``__qualname__``, or, for
a class made inside a library function, when every function it defines is a library's. A C type, which no Python
code can make, is a library's when its module is. A user's editable checkout of a library is no installed
distribution: its code is read as the user's.

    >>> import json
    >>> libraries = Libraries(frozenset())
    >>> libraries.function(json.dumps), libraries.module(json), libraries.cls(json.JSONEncoder)
    (True, True, True)
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import types

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class of a class statement, not of C
_SITE_NAMES = ("site-packages", "dist-packages")


def _real(path: str) -> str:
  return os.path.realpath(path)


@functools.lru_cache(maxsize=1)
def _site_folders() -> tuple[str, ...]:
  """Where installed distributions live for this interpreter."""
  paths = sysconfig.get_paths()
  found = [paths.get("purelib"), paths.get("platlib"), *site.getsitepackages()]
  if site.ENABLE_USER_SITE:
    found.append(site.getusersitepackages())
  found += [p for p in sys.path if os.path.basename(p) in _SITE_NAMES]
  return tuple(sorted({_real(p) for p in found if p}))


@functools.lru_cache(maxsize=1)
def _stdlib_folders() -> tuple[str, ...]:
  paths = sysconfig.get_paths()
  return tuple(sorted({_real(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}))


def _under(path: str, folders) -> bool:
  return any(path == f or path.startswith(f + os.sep) for f in folders)


@functools.lru_cache(maxsize=4096)
def _in_stdlib(real: str) -> bool:
  if _under(real, _site_folders()):
    return False
  for folder in _stdlib_folders():
    if _under(real, (folder,)):
      return os.path.relpath(real, folder).split(os.sep)[0] not in _SITE_NAMES
  return False


@functools.lru_cache(maxsize=8192)
def _real_file(filename: str) -> str | None:
  if not filename or filename.startswith("<") or not os.path.isabs(filename):
    return None  # code made from text (exec, dataclasses) or of no file: the user's
  folder, name = os.path.split(filename)
  found = os.path.join(_real_folder(folder), name)  # a folder's symlinks resolved once for all its files
  return _real(found) if os.path.islink(found) else found


@functools.lru_cache(maxsize=4096)
def _real_folder(folder: str) -> str:
  return _real(folder)


def _holds(module: types.ModuleType, qualname: str, obj) -> bool:
  """Whether ``module`` holds ``obj`` at ``qualname`` (a method through its class; no attribute is computed)."""
  found = module
  for part in str(qualname).split("."):
    found = vars(found).get(part) if isinstance(found, (types.ModuleType, type)) else None
  return found is obj or (found is not None and getattr(found, "__func__", None) is obj)


class Libraries:
  """The libraries of a toolchain (``names``: its packages, beside the standard library), decided by where their
  code lives."""

  def __init__(self, names: frozenset[str]):
    self.names = tuple(sorted(names))
    self._folders: dict[str, tuple[object, tuple[str, ...]]] = {}  # name -> (the module seen, its folders)
    self._seen: tuple = ()  # the packages imported when `_files` was filled (in-process only: no key holds it)
    self._files: dict[str, bool] = {}  # a code file -> whether it is a library's, for those packages

  def folders(self) -> tuple[str, ...]:
    """The folders of the named packages imported now that are installed distributions'."""
    out = []
    for name in self.names:
      module = sys.modules.get(name)
      if module is None:
        continue
      seen = self._folders.get(name)
      if seen is None or seen[0] is not module:
        places = list(getattr(module, "__path__", None) or ())
        if not places and isinstance(getattr(module, "__file__", None), str):
          places = [os.path.dirname(module.__file__)]
        installed = tuple(_real(p) for p in places if isinstance(p, str) and _under(_real(p), _site_folders()))
        seen = (module, installed)
        self._folders[name] = seen
      out += seen[1]
    return tuple(out)

  def file(self, filename) -> bool:
    """Whether code in ``filename`` is a library's."""
    if not isinstance(filename, str):
      return False
    seen = tuple(id(sys.modules.get(name)) for name in self.names)
    if seen != self._seen:  # a package imported (or replaced) since: decide again
      self._seen, self._files = seen, {}
    found = self._files.get(filename)
    if found is None:
      real = _real_file(filename)
      found = real is not None and (_in_stdlib(real) or _under(real, self.folders()))
      self._files[filename] = found
    return found

  def function(self, fn: types.FunctionType) -> bool:
    filename = fn.__code__.co_filename
    if isinstance(filename, str) and filename.startswith("<frozen "):
      # A frozen standard module's code (os, posixpath, ...) names no file: by the module that holds it.
      module = sys.modules.get(str(fn.__module__))
      spec = getattr(module, "__spec__", None)
      return (getattr(spec, "origin", None) == "frozen" and self.module(module)
              and _holds(module, fn.__qualname__, fn))
    return self.file(filename)

  def module(self, module: types.ModuleType) -> bool:
    name = getattr(module, "__name__", None)
    if name in sys.builtin_module_names and sys.modules.get(name) is module:
      return True
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
      return self.file(file)
    places = getattr(module, "__path__", None)  # a namespace package: every folder of it
    return bool(places) and all(isinstance(p, str) and self.file(os.path.join(p, "__init__.py"))
                                for p in list(places))

  def cls(self, cls: type) -> bool:
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    if module is None or not self.module(module):
      return False
    if not cls.__flags__ & _HEAPTYPE:
      return True
    if _holds(module, cls.__qualname__, cls):
      return True
    # Made inside a library function (a class in <locals>): by its functions' files.
    functions = [f for f in vars(cls).values() if isinstance(f, types.FunctionType)]
    return bool(functions) and all(self.function(f) for f in functions)
