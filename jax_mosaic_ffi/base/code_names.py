"""What a function's code reads, from its bytecode: the names it holds, those it loads as globals or builtins, the
modules it imports, and the names whose values it uses whole.

The key reader (`code_key`) reads a module the code reaches for the names the code reads of it, and no more: a
kernel's file may hold code the kernel never runs. That is only right where the code reads nothing of the module
but those attributes: a module the code hands on as a value (to ``inspect.getmembers``, to
``operator.attrgetter(name)``, to any function, or stores, or returns) may have any of its attributes read. So the
scan also says which names the code uses as values: every load (a global, a local, a closure cell, an attribute)
followed by anything but an attribute read of it (``mod.x``) is a use of the value whole, and a module met under
such a name is read whole.

    >>> def launcher(helpers):
    ...   return helpers.SCALE + len(helpers.TABLES)
    >>> sorted(scan(launcher.__code__).values)
    ['SCALE', 'TABLES', 'len']
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import sys
import types

from jax_mosaic_ffi.base.errors import ValueKeyError

_OPS = dis.opmap
_EXTENDED_ARG, _CACHE, _LOAD_GLOBAL, _IMPORT_NAME, _LOAD_CONST, _LOAD_ATTR = (
    _OPS["EXTENDED_ARG"], _OPS["CACHE"], _OPS["LOAD_GLOBAL"], _OPS["IMPORT_NAME"], _OPS["LOAD_CONST"],
    _OPS["LOAD_ATTR"])
_IMPORT_FROM = _OPS["IMPORT_FROM"]
_LOAD_SMALL_INT = _OPS.get("LOAD_SMALL_INT", -1)
_LOADS_BY_NAME = frozenset(_OPS[n] for n in ("LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS") if n in _OPS)
# Loads of a local or a cell, by its index among the code's variables.
_LOADS_LOCAL = frozenset(op for name, op in _OPS.items()
                         if name.startswith(("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE")) and "LOAD_FAST_LOAD_FAST"
                         != name)
_LOAD_TWO_LOCALS = _OPS.get("LOAD_FAST_LOAD_FAST", -1)
_STORES = frozenset(_OPS[n] for n in ("STORE_FAST", "STORE_DEREF", "STORE_NAME", "STORE_GLOBAL") if n in _OPS)


@dataclasses.dataclass(frozen=True)
class Scan:
  """What one function's code (and the code inside it) reads.

  Attributes:
    names: every name it holds (globals, attributes: ``mod.helper``).
    loaded: the names it loads as globals or builtins.
    imports: the modules it imports, with their levels.
    values: the names whose values it uses whole (not only for an attribute read).
    imported_values: the modules it imports whose binding it uses whole.
  """

  names: frozenset[str]
  loaded: frozenset[str]
  imports: frozenset[tuple[str, int]]
  values: frozenset[str]
  imported_values: frozenset[str]


def _local_name(code: types.CodeType, index: int) -> str | None:
  find = getattr(code, "_varname_from_oparg", None)  # CPython's own (dis uses it): cells and locals alike
  try:
    return find(index) if find is not None else None
  except (IndexError, TypeError, ValueError):
    return None


@functools.lru_cache(maxsize=4096)
def scan(code: types.CodeType) -> Scan:
  """The scan of ``code`` (immutable, compared by content: the answer is kept). A load whose name cannot be told is
  taken as a value use of every name the code holds (the whole of every module it reaches)."""
  names, loaded, imports, values = set(code.co_names), set(), set(), set()
  importing: str | None = None  # the module the last IMPORT_NAME bound, until its stores are seen
  import_binds: dict[str, set[str]] = {}
  raw, extended, previous = code.co_code, 0, (None, None)
  pending: str | None = None  # the name of the last load, until the next instruction says how it is used
  for i in range(0, len(raw), 2):  # the raw bytecode (dis's objects cost a warm start 25 ms on a GEMM)
    op, arg = raw[i], raw[i + 1] | extended
    if op == _EXTENDED_ARG:
      extended = arg << 8
      continue
    extended = 0
    if op == _CACHE:
      continue
    if pending is not None and op != _LOAD_ATTR:
      values.add(pending)
    pending = None
    if importing is not None:
      if op in _STORES:
        import_binds.setdefault(importing, set()).add(_stored_name(code, op, arg))
      elif op != _IMPORT_FROM:
        importing = None
    if op == _LOAD_GLOBAL:
      loaded.add(code.co_names[arg >> 1])
      pending = code.co_names[arg >> 1]
    elif op in _LOADS_BY_NAME:
      loaded.add(code.co_names[arg])
      pending = code.co_names[arg]
    elif op == _LOAD_ATTR:
      pending = code.co_names[arg >> 1]
    elif op in _LOADS_LOCAL:
      pending = _local_name(code, arg) or "*"
    elif op == _LOAD_TWO_LOCALS:
      values.add(_local_name(code, arg >> 4) or "*")
      pending = _local_name(code, arg & 15) or "*"
    elif op == _IMPORT_NAME:
      level = previous[0]
      imports.add((code.co_names[arg], level if type(level) is int else -1))
      importing = code.co_names[arg]
    if op == _LOAD_CONST:
      previous = (previous[1], code.co_consts[arg])
    elif op == _LOAD_SMALL_INT:
      previous = (previous[1], arg)
    else:
      previous = (previous[1], None)
  if pending is not None:
    values.add(pending)
  imported_values = {module for module, bound in import_binds.items() if bound & values}
  for const in code.co_consts:
    if type(const) is types.CodeType:
      inner = scan(const)
      names |= inner.names
      loaded |= inner.loaded
      imports |= inner.imports
      values |= inner.values
      imported_values |= inner.imported_values
  if "*" in values:  # a load of no name the scan could tell: any name may be a value
    values |= names | {n for n in (*code.co_varnames, *code.co_freevars, *code.co_cellvars)}
    imported_values |= {name for name, _ in imports}
  return Scan(frozenset(names), frozenset(loaded), frozenset(imports), frozenset(values), frozenset(imported_values))


def _stored_name(code: types.CodeType, op: int, arg: int) -> str:
  if dis.opname[op] in ("STORE_NAME", "STORE_GLOBAL"):
    return code.co_names[arg]
  return _local_name(code, arg) or "*"


def imported(name: str, level: int, globals_: dict, where: str) -> list[types.ModuleType]:
  """The modules an ``import`` in the code binds, as it will find them (sys.modules): the module and its top
  package. One not imported yet, or a relative import the reader cannot place, is refused."""
  if level < 0:
    raise ValueKeyError(f"{where} imports {name!r} in a way the key cannot follow")
  if level > 0:
    package = globals_.get("__package__")
    parts = package.split(".") if isinstance(package, str) and package else []
    if len(parts) < level:
      raise ValueKeyError(f"{where} imports {name!r} relative to a package the key cannot place")
    name = ".".join([*parts[:len(parts) - level + 1], *([name] if name else [])])
  found = [sys.modules.get(n) for n in dict.fromkeys((name, name.split(".")[0]))]
  if any(type(m) is not types.ModuleType for m in found):
    raise ValueKeyError(f"{where} imports {name!r}, which is not imported yet: what it will find is unknown")
  return found
