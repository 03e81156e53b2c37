"""The half of `value_key` that reads code and objects: functions, classes, modules, instances, whole.

A kernel reaches code through its values: a method it calls on an instance passed as a constexpr, a JIT function
that instance holds, a global its launcher names, a closure cell, a default. Each is read to the end here, with
the line table (a kernel's IR carries its source locations), or the value is refused by name (`ValueKeyError`) so
that its front end keys it by the IR it produces.

What is read is an allow-list, by exact type (a subclass of a type below is an instance of a user's class, read
as one, or refused): functions, code, bound methods, ``staticmethod``, ``classmethod``, ``property``,
``functools.cached_property`` and ``partial``, modules, classes, dataclass fields, C descriptors and builtins of a
library, ``types.SimpleNamespace`` (every attribute), typing's aliases by their parts (``list[int]``,
``Optional[X]``, ``Annotated[X, ...]`` with its metadata read whole), and instances of classes (every attribute).
Refused: an instance whose class computes its attributes or equality (``__getattr__``, ``__getattribute__``, an
``__eq__`` or ``__hash__`` other than a dataclass's generated ones) or its ``__dict__``, a subclass of a C type
(a container's, an array's: part of its state is out of Python's sight), a C object of no library, attributes
named by anything but a string, and code that reads by a name it computes or from outside its values
(`dynamic_reads`): ``globals()``, ``vars()``, ``eval``, ``exec``, ``__import__``, ``importlib``, ``sys.modules``,
frames, ``open``, the environment (``os.environ``, ``os.getenv``), a module's ``__getattr__``. A user's module
reached by code that reads attributes by computed name (``getattr``, ``hasattr``, ``__dict__``), or reached as a
value, is read whole.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import sys
import types
import typing

from jax_mosaic_ffi.base import code_names
from jax_mosaic_ffi.base import dynamic_reads
from jax_mosaic_ffi.base import library_modules
from jax_mosaic_ffi.base.errors import ValueKeyError

# Hooks that make an instance show another face than its state.
_COMPUTED = ("__getattr__", "__getattribute__", "__eq__", "__hash__")
# A class's own bookkeeping, which no code reads as behaviour (its name and module are keyed apart).
_CLASS_SKIPPED = frozenset({"__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "_abc_impl",
                            "__static_attributes__", "__firstlineno__"})
# A module's own bookkeeping: where it was loaded from (a kernel's file is no part of its key).
_MODULE_SKIPPED = frozenset({"__builtins__", "__loader__", "__spec__", "__file__", "__cached__", "__doc__",
                             "__name__", "__package__", "__path__"})
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class of a class statement, not of C
_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                types.GetSetDescriptorType, types.MemberDescriptorType)
_BUILTINS = (types.BuiltinFunctionType, types.MethodWrapperType)
_TYPE_DICT = vars(type)["__dict__"]  # a class's real namespace, whatever its metaclass says __dict__ is
# typing's aliases, read by their parts (origin, arguments, metadata): their types as typing makes them.
_ALIASES = frozenset(type(a) for a in (list[int], int | None, typing.List[int], typing.Optional[int],
                                       typing.Callable[[int], int], typing.Literal[1], typing.Annotated[int, 0],
                                       typing.List, typing.Tuple, typing.Callable))
_SPECIAL_FORM = type(typing.Optional)


@dataclasses.dataclass(frozen=True)
class Reads:
  """What the code that reached a module reads of it: ``names``, every name it holds; ``computed``, whether it also
  reads attributes by a name it computes (``__dict__``); ``values``, the names whose values it uses whole
  (`code_names`: a module handed to ``getattr``, ``operator.attrgetter(name)`` or any function)."""

  names: frozenset[str]
  computed: bool = False
  values: frozenset[str] = frozenset()

  def of(self, name: str) -> Reads | None:
    """What the code reads of the value under ``name``: whole (None) where it uses that value whole."""
    return None if self.computed or name in self.values else self


def put_object(k, v, depth: int, where: str, reads: Reads | None) -> None:
  """Writes the key of a value that is not plain data (`Keyer.put` hands it here); ``reads``: what the code that
  reached ``v`` reads of it (None: it may read any attribute)."""
  t = type(v)
  dynamic_reads.check_value(v, where)
  if t is types.CodeType:
    _code(k, v, depth, where)
  elif t is types.FunctionType:
    _function(k, v, depth, where)
  elif t is types.MethodType:
    k.tag(b"method")
    k.put(v.__func__, depth + 1, where)
    k.put(v.__self__, depth + 1, f"the object {where} is bound to")
  elif t is staticmethod or t is classmethod:
    k.tag(b"static" if t is staticmethod else b"classmethod")
    k.put(v.__func__, depth + 1, where)
  elif t is property:
    k.tag(b"property")
    for part in (v.fget, v.fset, v.fdel):
      k.put(part, depth + 1, where)
  elif t is functools.cached_property:
    k.tag(b"cached_property")
    k.put(v.func, depth + 1, where)
  elif t is functools.partial:
    k.tag(b"partial")
    k.put(v.func, depth + 1, where)
    k.put(v.args, depth + 1, f"the arguments of {where}")
    k.put(v.keywords, depth + 1, f"the keywords of {where}")
    k.put(dict(attributes(v, where)), depth + 1, f"the attributes of {where}")  # p.block = 64 is state too
  elif t is types.ModuleType:
    _module(k, v, depth, where, reads)
  elif isinstance(v, type):
    _class(k, v, depth, where, reads)
  elif t is dataclasses.Field:
    _field(k, v, depth)
  elif t in _DESCRIPTORS:
    # A C type's method or a slot: its class names it (a slot's value is read with its instance).
    owner = v.__objclass__
    slot = t is types.MemberDescriptorType and owner.__flags__ & _HEAPTYPE  # a user's class's __slots__
    if not slot and not k.toolchain.origins.cls(owner):
      raise ValueKeyError(f"{where} is a descriptor of {owner.__qualname__}, a C type of no library")
    k.text(b"descriptor", owner.__module__, owner.__qualname__, v.__name__)
  elif t in _BUILTINS:
    _builtin(k, v, depth, where)
  elif t is types.SimpleNamespace:
    k.composite(v, lambda: _attributes_whole(k, b"namespace", v, depth, where))
  elif t in _ALIASES:
    _alias(k, v, depth, where)
  elif t is _SPECIAL_FORM:
    name = v.__reduce__()
    if not (isinstance(name, str) and vars(typing).get(name) is v):
      raise ValueKeyError(f"{where} is a typing form that is not typing's own")
    k.text(b"typing form", name)
  elif t is typing.TypeVar:
    k.text(b"typevar", v.__name__)
    k.put((v.__bound__, v.__constraints__, v.__covariant__, v.__contravariant__), depth + 1, where)
  elif t is typing.ForwardRef:
    k.text(b"forward", v.__forward_arg__)
    k.put(v.__forward_module__, depth + 1, where)
  else:
    _state(k, v, depth, where, library=k.toolchain.origins.cls(t))


def attributes(v, where: str, skip=()) -> list[tuple[str, object]]:
  """``v``'s own attributes (its ``__dict__``), sorted by name; refused where a name is not a string (no order
  the same in every process) or where its class makes ``__dict__`` something else."""
  for base in type(v).__mro__:
    found = _TYPE_DICT.__get__(base).get("__dict__")
    if found is not None and type(found) not in (types.GetSetDescriptorType, types.MemberDescriptorType):
      raise ValueKeyError(f"{where}: its class {base.__qualname__} defines __dict__, so what it holds is computed")
  state = vars(v) if hasattr(v, "__dict__") else {}
  odd = [type(name).__name__ for name in state if type(name) is not str]
  if odd:
    raise ValueKeyError(f"{where} has an attribute named by a {odd[0]}, not a string")
  return sorted(((name, x) for name, x in state.items() if name not in skip), key=lambda item: item[0])


def _attributes_whole(k, tag: bytes, v, depth: int, where: str) -> None:
  k.tag(tag)
  for attr, x in attributes(v, where):
    k.text(b"attr", attr)
    k.put(x, depth + 1, f"{where}.{attr}")


def _field(k, v: dataclasses.Field, depth: int) -> None:
  k.text(b"field", v.name)
  annotation = v.type
  if isinstance(annotation, str):
    k.text(b"S", annotation)
  else:
    k.put(annotation, depth + 1, f"the type of the field {v.name}")
  k.put((v.init, v.kw_only), depth + 1, f"the field {v.name}")
  for value in (v.default, v.default_factory):
    k.put(None if value is dataclasses.MISSING else value, depth + 1, f"the default of the field {v.name}")


def _alias(k, v, depth: int, where: str) -> None:
  k.text(b"alias", type(v).__qualname__)
  k.put(getattr(v, "__origin__", None), depth + 1, f"the origin of {where}")
  k.put(getattr(v, "__args__", None), depth + 1, f"the arguments of {where}")
  k.put(getattr(v, "__metadata__", None), depth + 1, f"the metadata of {where}")


def _code(k, code: types.CodeType, depth: int, where: str) -> None:
  # Everything but the file's name: a kernel compiled from the same code at another path is the same kernel (its
  # IR locations name the file, which the audit's comparison leaves out). The line table is in: the IR has lines.
  k.tag(b"code", code.co_code, code.co_linetable, str(code.co_firstlineno).encode(),
        str((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)).encode())
  k.text(b"names", *code.co_names)
  k.text(b"vars", *code.co_varnames, "|", *code.co_freevars, "|", *code.co_cellvars)
  k.text(b"name", code.co_qualname)
  for const in code.co_consts:
    k.put(const, depth + 1, f"a constant of {where}")


def _function(k, fn: types.FunctionType, depth: int, where: str) -> None:
  k.composite(fn, lambda: _function_whole(k, fn, depth, where))


def _function_whole(k, fn: types.FunctionType, depth: int, where: str) -> None:
  k.text(b"function", fn.__module__ if isinstance(fn.__module__, str) else "", fn.__qualname__)
  wrapped = vars(fn).get("__wrapped__")
  if k.toolchain.origins.function(fn):
    if wrapped is not None:  # a library decorator's wrapper (@cute.jit): the code is the wrapped one's
      k.put(wrapped, depth + 1, f"{where} (the function it wraps)")
    return
  user_code = k.toolchain.user_code
  code = user_code(fn) if user_code is not None else fn.__code__
  label = f"{where} ({fn.__qualname__})"
  if type(fn.__globals__) is not dict or fn.__builtins__ is not vars(builtins):
    raise ValueKeyError(f"{label} runs with globals or builtins of its own making, which the key cannot read")
  _code(k, code, depth, label)
  found = code_names.scan(code)
  dynamic_reads.check_code(found.loaded, fn.__globals__, label)
  # A module this code reaches is read for the names it reads of it, or whole where it reads by computed name or
  # uses it as a value (hands it to a function, stores it, returns it).
  globals_ = fn.__globals__
  reads = Reads(found.names, bool(found.names & dynamic_reads.COMPUTED_READER_NAMES), found.values)
  k.put(fn.__defaults__, depth + 1, f"the defaults of {label}")
  # By name: their order is the parameters' (in the code), and a name's value is all a call reads of them.
  k.put(_by_name(fn.__kwdefaults__), depth + 1, f"the defaults of {label}")
  k.put(_by_name(vars(fn).get("__annotations__") or getattr(fn, "__annotations__", None)), depth + 1,
        f"the annotations of {label}")
  for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
    k.text(b"cell", name)
    try:
      contents = cell.cell_contents
    except ValueError:  # an empty cell
      k.tag(b"empty")
      continue
    k.put(contents, depth + 1, f"the closure variable {name} of {label}", reads.of(name))
  for name in sorted(found.names):
    if name in globals_:
      k.text(b"global", name)
      k.put(globals_[name], depth + 1, f"the global {name} that {label} reads", reads.of(name))
  for name in sorted(found.loaded):  # a builtin it loads (one a program set on builtins is data like any global)
    if name not in globals_ and name in vars(builtins):
      k.text(b"builtin name", name)
      k.put(vars(builtins)[name], depth + 1, f"the builtin {name} that {label} reads", reads.of(name))
  for name, level in sorted(found.imports):  # a module it imports in its body, as the import will find it
    for module in code_names.imported(name, level, globals_, label):
      k.text(b"import", module.__name__)
      k.put(module, depth + 1, f"the module {module.__name__} that {label} imports",
            None if name in found.imported_values else reads)
  # Every attribute (a private one too: code may read it as data), but the toolchain's own bookkeeping.
  bookkeeping = k.toolchain.bookkeeping
  skip = {"__wrapped__", *(a for a in vars(fn) if isinstance(a, str) and bookkeeping and bookkeeping(a))}
  k.tag(b"attributes")
  for attr, x in attributes(fn, label, skip=skip):
    k.text(b"attr", attr)
    k.put(x, depth + 1, f"the attribute {attr} of {label}")
  if wrapped is not None:
    k.put(wrapped, depth + 1, f"the function {label} wraps")


def _by_name(d):
  """A dict of parameters' names, as (name, value) pairs sorted by name; anything else as it is."""
  if type(d) is dict and all(type(name) is str for name in d):
    return tuple(sorted(d.items(), key=lambda item: item[0]))
  return d


def _module(k, module: types.ModuleType, depth: int, where: str, reads: Reads | None) -> None:
  # Not recorded as visited: each code that reaches a module reads its own names of it.
  k.text(b"module", module.__name__)
  contents = vars(module)
  if k.toolchain.origins.module(module):
    library_modules.put(k, module, depth, where, reads)
    return
  if "__getattr__" in contents:
    raise ValueKeyError(f"{where}: the module {module.__name__} computes attributes (__getattr__)")
  if reads is None or reads.computed:  # reached as a value, or by code that reads attributes by computed name
    names = frozenset(n for n in contents if type(n) is str and n not in _MODULE_SKIPPED)
    k.tag(b"whole")
    inner = Reads(names if reads is None else reads.names | names)
  else:
    names = inner = reads.names
    inner = reads
  for name in sorted(names):
    if name in contents:
      k.text(b"attr", name)
      k.put(contents[name], depth + 1, f"{module.__name__}.{name}", inner.of(name))


def _class(k, cls: type, depth: int, where: str, reads: Reads | None = None) -> None:
  if k.toolchain.origins.cls(cls):
    # A library's class: named (its release is in the key), and refused where the code may call one of its
    # methods that reads the outside world (pathlib.Path(p).read_text()).
    dynamic_reads.check_class(cls, reads.names if reads else frozenset(), reads is None or reads.computed, where)
    k.text(b"class", cls.__module__, cls.__qualname__)
    return
  k.composite(cls, lambda: _class_whole(k, cls, depth))


def _class_whole(k, cls: type, depth: int) -> None:
  k.text(b"class", str(cls.__module__), cls.__qualname__)
  if type(cls) is not type:
    k.put(type(cls), depth + 1, f"the metaclass of {cls.__qualname__}")
  for base in cls.__bases__:
    k.put(base, depth + 1, f"a base of {cls.__qualname__}")
  namespace = _TYPE_DICT.__get__(cls)
  if any(type(name) is not str for name in namespace):
    raise ValueKeyError(f"the class {cls.__qualname__} holds an attribute named by something not a string")
  for name in sorted(namespace):
    if name in _CLASS_SKIPPED:
      continue
    k.text(b"attr", name)
    if name.startswith("_"):  # Python's own tables (__annotations__, __dataclass_fields__, an enum's maps): in
      ir, k.ir = k.ir, False  # the order of the class's text, the same in every process
      try:
        k.put(namespace[name], depth + 1, f"{cls.__qualname__}.{name}")
      finally:
        k.ir = ir
    else:
      k.put(namespace[name], depth + 1, f"{cls.__qualname__}.{name}")


def _builtin(k, fn, depth: int, where: str) -> None:
  """C code: a library module's function, or a method of a library's C type (bound to what it is bound to)."""
  owner = getattr(fn, "__self__", None)
  origins = k.toolchain.origins
  if type(owner) is types.ModuleType:
    ours = origins.module(owner) and vars(owner).get(fn.__name__) is fn
  elif owner is None:
    module = sys.modules.get(str(getattr(fn, "__module__", None)))
    ours = module is not None and origins.module(module) and vars(module).get(fn.__name__) is fn
  else:
    ours = origins.cls(owner if isinstance(owner, type) else type(owner))
  if not ours:
    raise ValueKeyError(f"{where} is {fn.__qualname__}, C code of no library the key can name")
  module = owner.__name__ if type(owner) is types.ModuleType else str(getattr(fn, "__module__", None) or "")
  k.text(b"builtin", module, fn.__qualname__)
  if owner is not None and not isinstance(owner, (types.ModuleType, type)):  # a bound one: what it is bound to
    k.put(owner, depth + 1, f"the object {where} is bound to")


def _generated(cls: type, hook: str) -> bool:
  """Whether ``cls.hook`` is one dataclasses wrote (their code is made from text, so has no file)."""
  fn = _TYPE_DICT.__get__(cls)[hook]
  if fn is None:  # __hash__ = None: unhashable, no face of its own
    return True
  code = getattr(fn, "__code__", None)
  return dataclasses.is_dataclass(cls) and code is not None and code.co_filename.startswith("<")


def _state(k, v, depth: int, where: str, library: bool) -> None:
  """An instance: its class (walked, or named if a library's) and every attribute it holds."""
  cls = type(v)
  name = f"{cls.__module__}.{cls.__qualname__}"
  for base in cls.__mro__[:-1]:  # object is every class's last
    if not base.__flags__ & _HEAPTYPE:
      what = "a C object" if base is cls else f"a subclass of {base.__module__}.{base.__qualname__}"
      raise ValueKeyError(f"{where} is a {name}, {what}, whose state is not all in Python's sight")
    if not library:
      for hook in _COMPUTED:
        if hook in _TYPE_DICT.__get__(base) and not _generated(base, hook):
          raise ValueKeyError(f"{where} is a {name}, whose class defines {hook}: what the compiler sees of it "
                              "need not be its attributes")
  slots = [(s, d) for base in cls.__mro__ for s in _slot_names(base)
           if type(d := _TYPE_DICT.__get__(base).get(s)) is types.MemberDescriptorType]
  if not hasattr(v, "__dict__") and not slots:
    raise ValueKeyError(f"{where} is a {name} without attributes to read")

  def fill():
    k.tag(b"object")
    k.put(cls, depth + 1, f"the class of {where}")
    state = dict(attributes(v, where))
    for s, descriptor in slots:  # read through the slot itself, not whatever a subclass put at its name
      try:
        state[s] = descriptor.__get__(v, cls)
      except AttributeError:  # an empty slot
        continue
    for attr in sorted(state):  # by name: the order attributes were set in is no part of the state
      k.text(b"attr", attr)
      k.put(state[attr], depth + 1, f"{where}.{attr}")

  k.composite(v, fill)


def _slot_names(cls: type) -> tuple[str, ...]:
  slots = _TYPE_DICT.__get__(cls).get("__slots__", ())
  names = (slots,) if isinstance(slots, str) else tuple(s for s in slots if isinstance(s, str))
  return tuple(s for s in names if s not in ("__dict__", "__weakref__"))
