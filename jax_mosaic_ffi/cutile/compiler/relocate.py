"""Cubins whose bytes do not depend on the folder the kernel's file is in.

tileiras writes line information (``--lineinfo``, as cuTile compiles) naming each function's file by its folder and
name, as cuTile reads them from the code (``co_filename``): the same kernel copied elsewhere compiles to other
bytes, so a pack recorded in one checkout and a cache filled in another would hold different modules for one key,
and XLA's own cache would miss. So each compile is made from a copy of the kernel's Python function, and of the
user's functions it calls, whose code names a fixed folder, `FOLDER`, and the module it is in (``FOLDER +
"/mypkg/kernels.py"`` for ``mypkg.kernels``, ``FOLDER + "/k.py"`` for a script ``k.py``); the source lines are
registered under that name in ``linecache`` (where cuTile reads the function's source), so what cuTile compiles is
the same source, line for line. Profilers show that path; point their source search at the module's folder.

What stays as it was (its line information names its real path): a function whose source ``linecache`` cannot
give (one made by ``exec``), and functions of installed libraries (their folder is the same install's on every
machine with the same release, which the key names).
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import types

from jax_mosaic_ffi.base import code_origin
from jax_mosaic_ffi.cutile.compiler import parameters as parameters_lib

FOLDER = "/jax_mosaic_ffi-cutile"
_LIBRARIES = code_origin.Libraries(frozenset({"cuda"}))


def _fixed_name(fn: types.FunctionType) -> str:
  module = getattr(fn, "__module__", None)
  base = os.path.basename(fn.__code__.co_filename)
  if not module or module == "__main__" or not isinstance(module, str):
    return f"{FOLDER}/{base}"
  return f"{FOLDER}/{module.replace('.', '/')}.py" if base.endswith(".py") else f"{FOLDER}/{module}/{base}"


def _user_function(value) -> bool:
  return isinstance(value, types.FunctionType) and not _LIBRARIES.function(value) and \
      not value.__code__.co_filename.startswith(FOLDER)


class _Relocation:
  def __init__(self):
    self.done: dict[int, object] = {}

  def function(self, fn: types.FunctionType):
    if id(fn) in self.done:
      return self.done[id(fn)]
    real = fn.__code__.co_filename
    lines = linecache.getlines(real, fn.__globals__)
    if not lines:  # no source to give cuTile under another name: compiled as it is
      self.done[id(fn)] = fn
      return fn
    name = _fixed_name(fn)
    linecache.cache[name] = (sum(len(line) for line in lines), None, list(lines), name)  # no mtime: never checked
    globals_ = dict(fn.__globals__)  # filled below: the user's functions it names relocated too, the rest as is
    clone = types.FunctionType(fn.__code__.replace(co_filename=name), globals_, fn.__name__, fn.__defaults__)
    self.done[id(fn)] = clone  # before its globals and cells: a function that reaches itself gets this copy
    for global_name in fn.__code__.co_names:
      if global_name in globals_:
        globals_[global_name] = self.value(globals_[global_name])
    if fn.__closure__:
      clone = types.FunctionType(clone.__code__, globals_, fn.__name__, fn.__defaults__, self.cells(fn.__closure__))
      self.done[id(fn)] = clone
    clone.__kwdefaults__ = fn.__kwdefaults__
    clone.__annotations__ = dict(fn.__annotations__)
    clone.__module__, clone.__qualname__, clone.__doc__ = fn.__module__, fn.__qualname__, fn.__doc__
    clone.__dict__.update(fn.__dict__)
    self.done[id(fn)] = clone
    return clone

  def cells(self, closure):
    if not closure:
      return closure
    out = []
    for cell in closure:
      try:
        out.append(types.CellType(self.value(cell.cell_contents)))
      except ValueError:  # an empty cell
        out.append(cell)
    return tuple(out)

  def value(self, value):
    """A value the kernel reaches: a user's function (or ``ct.function`` wrapper of one) relocated."""
    inner = getattr(value, "__wrapped__", None)
    if getattr(value, "_cutile_function_wrapper", False) and _user_function(inner):
      ct = parameters_lib.release_lib.require_cutile()
      return ct.function(self.function(inner), host=False, tile=getattr(value, "_cutile_tile_function", True))
    if _user_function(value):
      return self.function(value)
    return value


def relocated(kernel):
  """``kernel`` (a ``@ct.kernel``) re-made from code that names `FOLDER` (module doc), with the same options."""
  ct = parameters_lib.release_lib.require_cutile()
  fn = parameters_lib.python_function(kernel)
  if not _user_function(fn):
    return kernel
  clone = _Relocation().function(fn)
  if clone is fn:
    return kernel
  options = kernel._compiler_options  # noqa: SLF001  (the ct.kernel options it was made with)
  return ct.kernel(clone, **{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})
