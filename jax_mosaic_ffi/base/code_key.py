"""The half of `value_key` that reads code and objects: functions, classes, modules, instances, whole.

A kernel reaches code through its values: a method it calls on an instance passed as a constexpr, a JIT function
that instance holds, a global its launcher names, a closure cell, a default. Each is read to the end here, with
the line table (a kernel's IR carries its source locations), or the value is refused by name (`ValueKeyError`) so
that its front end keys it by the IR it produces. What is refused: an instance whose class computes its attributes
or equality (``__getattr__``, ``__getattribute__``, an ``__eq__`` or ``__hash__`` other than a dataclass's
generated ones), a subclass of a C type (a container's, an array's: part of its state is out of Python's sight),
and a C object of no library.
"""

from __future__ import annotations

import dataclasses
import functools
import types

from jax_mosaic_ffi.base.errors import ValueKeyError

# Hooks that make an instance show another face than its state.
_COMPUTED = ("__getattr__", "__getattribute__", "__eq__", "__hash__")
# A class's own bookkeeping, which no code reads as behaviour (its name and module are keyed apart).
_CLASS_SKIPPED = frozenset({"__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "_abc_impl",
                            "__static_attributes__", "__firstlineno__"})
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class of a class statement, not of C
_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                types.GetSetDescriptorType, types.MemberDescriptorType)
_BUILTINS = (types.BuiltinFunctionType, types.MethodWrapperType)


def put_object(k, v, depth: int, where: str, names: frozenset[str]) -> None:
  """Writes the key of a value that is not plain data (`Keyer.put` hands it here)."""
  if isinstance(v, types.CodeType):
    _code(k, v, depth, where)
  elif isinstance(v, types.FunctionType):
    _function(k, v, depth, where)
  elif isinstance(v, types.MethodType):
    k.tag(b"method")
    k.put(v.__func__, depth + 1, where)
    k.put(v.__self__, depth + 1, f"the object {where} is bound to")
  elif isinstance(v, (staticmethod, classmethod)):
    k.tag(b"static" if isinstance(v, staticmethod) else b"classmethod")
    k.put(v.__func__, depth + 1, where)
  elif isinstance(v, property):
    k.tag(b"property")
    for part in (v.fget, v.fset, v.fdel):
      k.put(part, depth + 1, where)
  elif isinstance(v, functools.cached_property):
    k.tag(b"cached_property")
    k.put(v.func, depth + 1, where)
  elif isinstance(v, functools.partial):
    k.tag(b"partial")
    k.put(v.func, depth + 1, where)
    k.put(v.args, depth + 1, f"the arguments of {where}")
    k.put(v.keywords, depth + 1, f"the keywords of {where}")
  elif isinstance(v, types.ModuleType):
    _module(k, v, depth, where, names)
  elif isinstance(v, type):
    _class(k, v, depth, where)
  elif isinstance(v, dataclasses.Field):
    k.text(b"field", v.name)
    annotation = v.type
    if isinstance(annotation, str):
      k.text(b"S", annotation)
    else:
      k.put(annotation, depth + 1, f"the type of the field {v.name}")
    k.put((v.init, v.kw_only), depth + 1, where)
    for value in (v.default, v.default_factory):
      k.put(None if value is dataclasses.MISSING else value, depth + 1, f"the default of the field {v.name}")
  elif isinstance(v, _DESCRIPTORS):
    # A C type's method or a slot: its class names it (a slot's value is read with its instance).
    owner = v.__objclass__
    k.text(b"descriptor", owner.__module__, owner.__qualname__, v.__name__)
  elif isinstance(v, _BUILTINS):
    _builtin(k, v, depth, where)
  elif type(v).__module__ in ("typing", "types"):
    k.text(b"typing", repr(v))  # list[int], Optional[X]: typing spells them whole
  elif k.toolchain.library(type(v).__module__):
    _state(k, v, depth, where, library=True)
  else:
    _state(k, v, depth, where, library=False)


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


def _names(code: types.CodeType) -> set[str]:
  """Every name the code and the code inside it read: globals, and attributes (mod.helper)."""
  names = set(code.co_names)
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      names |= _names(const)
  return names


def _function(k, fn: types.FunctionType, depth: int, where: str) -> None:
  k.composite(fn, lambda: _function_whole(k, fn, depth, where))


def _function_whole(k, fn: types.FunctionType, depth: int, where: str) -> None:
  module = fn.__module__
  k.text(b"function", module or "", fn.__qualname__)
  wrapped = getattr(fn, "__wrapped__", None)
  if k.toolchain.library(module):
    if wrapped is not None:  # a decorator's wrapper (@cute.jit, functools.wraps): the code is the wrapped one's
      k.put(wrapped, depth + 1, f"{where} (the function it wraps)")
    return
  user_code = k.toolchain.user_code
  code = user_code(fn) if user_code is not None else fn.__code__
  label = f"{where} ({fn.__qualname__})"
  _code(k, code, depth, label)
  k.put(fn.__defaults__, depth + 1, f"the defaults of {label}")
  k.put(fn.__kwdefaults__, depth + 1, f"the defaults of {label}")
  k.put(getattr(fn, "__annotations__", None), depth + 1, f"the annotations of {label}")
  for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
    k.text(b"cell", name)
    try:
      contents = cell.cell_contents
    except ValueError:  # an empty cell
      k.tag(b"empty")
      continue
    k.put(contents, depth + 1, f"the closure variable {name} of {label}")
  names = _names(code)
  for name in sorted(names):
    if name in fn.__globals__:
      k.text(b"global", name)
      k.put(fn.__globals__[name], depth + 1, f"the global {name} that {label} reads", frozenset(names))
  # Its attributes, less the private ones decorators keep their bookkeeping in (the CuTe DSL's compiler object,
  # set at its first compile): no compiler reads a function's own attributes as code.
  attributes = {a: x for a, x in vars(fn).items() if not a.startswith("_")}
  k.put(attributes, depth + 1, f"the attributes of {label}")
  if wrapped is not None:
    k.put(wrapped, depth + 1, f"the function {label} wraps")


def _module(k, module: types.ModuleType, depth: int, where: str, names: frozenset[str]) -> None:
  # Not recorded as visited: each code that reaches a module reads its own names of it.
  k.text(b"module", module.__name__)
  if k.toolchain.library(module.__name__):
    return
  contents = vars(module)
  for name in sorted(names):
    if name in contents:
      k.text(b"attr", name)
      k.put(contents[name], depth + 1, f"{module.__name__}.{name}", names)


def _class(k, cls: type, depth: int, where: str) -> None:
  if k.toolchain.library(cls.__module__):
    k.text(b"class", cls.__module__, cls.__qualname__)
    return
  k.composite(cls, lambda: _class_whole(k, cls, depth))


def _class_whole(k, cls: type, depth: int) -> None:
  k.text(b"class", cls.__module__, cls.__qualname__)
  if type(cls) is not type:
    k.put(type(cls), depth + 1, f"the metaclass of {cls.__qualname__}")
  for base in cls.__bases__:
    k.put(base, depth + 1, f"a base of {cls.__qualname__}")
  for name, value in sorted(vars(cls).items()):
    if name in _CLASS_SKIPPED:
      continue
    k.text(b"attr", name)
    k.put(value, depth + 1, f"{cls.__qualname__}.{name}")


def _builtin(k, fn, depth: int, where: str) -> None:
  owner = getattr(fn, "__self__", None)
  module = getattr(fn, "__module__", None) or getattr(owner if isinstance(owner, type) else type(owner),
                                                      "__module__", None)
  if not k.toolchain.library(module):
    raise ValueKeyError(f"{where} is {module}.{fn.__qualname__}, C code of no library the key can name")
  k.text(b"builtin", module or "", fn.__qualname__)
  if owner is not None and not isinstance(owner, (types.ModuleType, type)):  # a bound one: what it is bound to
    k.put(owner, depth + 1, f"the object {where} is bound to")


def _generated(cls: type, hook: str) -> bool:
  """Whether ``cls.hook`` is one dataclasses wrote (their code is made from text, so has no file)."""
  fn = vars(cls)[hook]
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
        if hook in vars(base) and not _generated(base, hook):
          raise ValueKeyError(f"{where} is a {name}, whose class defines {hook}: what the compiler sees of it "
                              "need not be its attributes")
  slots = [s for base in cls.__mro__ for s in _slot_names(base)]
  if not hasattr(v, "__dict__") and not slots:
    raise ValueKeyError(f"{where} is a {name} without attributes to read")

  def fill():
    k.tag(b"object")
    k.put(cls, depth + 1, f"the class of {where}")
    state = dict(vars(v)) if hasattr(v, "__dict__") else {}
    state.update((s, getattr(v, s)) for s in slots if s not in ("__dict__", "__weakref__") and hasattr(v, s))
    for attr in sorted(state):  # by name: the order attributes were set in is no part of the state
      k.text(b"attr", attr)
      k.put(state[attr], depth + 1, f"{where}.{attr}")

  k.composite(v, fill)


def _slot_names(cls: type) -> tuple[str, ...]:
  slots = vars(cls).get("__slots__", ())
  return (slots,) if isinstance(slots, str) else tuple(s for s in slots if isinstance(s, str))
