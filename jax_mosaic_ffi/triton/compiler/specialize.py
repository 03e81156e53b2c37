"""A Triton kernel's specialization for one call, decided by Triton's own launcher code.

Triton's launcher (``JITFunction.run``) compiles a kernel per *value class* of
its arguments: an integer equal to 1 becomes a constexpr (it leaves the
compiled kernel's parameters), an integer divisible by 16 gets a
``tt.divisibility`` hint, and so does a pointer aligned to 16 bytes;
``@triton.jit(do_not_specialize=..., do_not_specialize_on_alignment=...)``
turns either off per parameter. A strided kernel compiled without these facts
runs many times slower (its loads cannot be vectorized), so we decide them as
Triton's launcher does, by calling the same code: the binder Triton builds from
the function's signature (``create_function_from_signature``, which calls
``native_specialize_impl`` per argument) and ``JITFunction._pack_args``, which
turns its answer into the signature, constexprs and attributes the compiler
takes. New Triton releases bring their own rules with them.

What that code is given is what it would see at a launch: every scalar is
concrete when a call is traced, so it gets the value as a Python number; every
buffer XLA passes is 256-byte aligned (the runtime refuses one that is not),
so it gets an object whose ``data_ptr()`` has that alignment. The scalar
types stay the call's own (an ``np.int64`` stride stays i64, as its bytes
are passed): only the specialization comes from Triton.

`specialize_cached` keeps each answer in the compile cache (memory and disk),
keyed by everything it depends on (Triton's version and its key of the
function, the parameters' flags, the types, values and constexprs, the
target): Triton 3.6's binder imports torch where it is installed, seconds that
a process whose kernels are all cache hits should not pay.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.store import key_audit
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store.entries import Codec
from jax_mosaic_ffi.triton.compiler import options as triton_options
from jax_mosaic_ffi.triton.compiler import keys as triton_keys

# XLA aligns the buffers it allocates on the GPU to 256 bytes, and the
# runtime checks every buffer of every launch against this (contract.h).
XLA_BUFFER_ALIGN = 256


class _XlaBuffer:
  """A buffer as Triton's specialization code reads a tensor: its address (for
  the alignment) and its dtype (for the pointer type, a Triton type name)."""

  __slots__ = ("dtype",)

  def __init__(self, dtype: str):
    self.dtype = dtype

  def data_ptr(self) -> int:
    return XLA_BUFFER_ALIGN


@dataclasses.dataclass(frozen=True)
class Specialization:
  """What Triton's launcher would compile for one call's arguments."""

  signature: dict[str, Any]           # every parameter's Triton type (a tuple's: a tuple), "constexpr" if compiled in
  constexprs: dict[tuple, Any]        # by path, as triton.compiler.ASTSource takes them
  attrs: dict[tuple, list]            # by path: [["tt.divisibility", 16]] and the like
  dropped: tuple[int, ...]            # non-constexpr leaves (their index among those, tuples flattened) now constexprs
  aligned: tuple[int, ...] = ()       # the same of the pointers the compiled code takes as 16-byte aligned

  @property
  def description(self) -> str:
    """The value classes, for our cache key (Triton's own key covers them too)."""
    return json.dumps([sorted(self.signature.items()), sorted((list(k), v) for k, v in self.attrs.items())])


_binders: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_binders_lock = threading.Lock()


def _binder(fn, backend):
  """Triton's argument binder for ``fn``, built once per function (it is generated code)."""
  from triton.runtime.jit import create_function_from_signature  # noqa: PLC0415  (optional dependency: Triton)
  with _binders_lock:
    binder = _binders.get(fn)
    if binder is None:
      binder = _binders[fn] = create_function_from_signature(fn.signature, fn.params, backend)
    return binder


def _python_number(value):
  """A numpy scalar as the Python number a Triton user would have passed."""
  array = np.asarray(value)
  if array.dtype == np.bool_:
    return bool(array)
  if array.dtype.kind in "iu":
    return int(array)
  return float(array)


def flat_types(types) -> list:
  """The leaves of a signature whose tuple parameters (Triton's tuple arguments) are nested tuples (or lists) of
  types, in order; the same for a ``param_order`` with such parameters."""
  leaves = []
  for ty in types:
    leaves.extend(flat_types(ty) if isinstance(ty, (tuple, list)) else [ty])
  return leaves


def specialize(fn, types: Sequence[Any], values: Mapping[int, Any], constexprs: Mapping[str, Any],
               backend) -> Specialization:
  """``fn``'s specialization for a call passing parameters of Triton ``types``
  (its non-constexpr parameters, in order; pointers start with ``*``; a tuple
  parameter's type is a tuple of its elements' types) with the scalar
  ``values`` known at trace time, by index among the leaves of ``types``
  (`flat_types`: the parameters with tuples flattened, in order).
  A scalar with no value (a kernel compiled ahead from ``signature=``) is left
  unspecialized, as ``do_not_specialize`` leaves it, since any value may come.
  ``dropped`` and ``aligned`` count leaves too."""
  names = list(fn.arg_names)
  runtime = [p for p in fn.params if not p.is_constexpr]
  leaf = itertools.count()

  def argument(ty):
    if isinstance(ty, tuple):
      return tuple(argument(t) for t in ty)
    k = next(leaf)
    if ty.startswith("*"):
      return _XlaBuffer(ty[1:])  # Triton reads its own type names as dtypes
    if ty.startswith("tensordesc"):
      return 3  # a host descriptor: its type is ours (below); Triton gives it no attribute
    # 3 is of the class no rule specializes (not 1, not a multiple of 16); overwritten below.
    return _python_number(values[k]) if k in values else 3

  arguments: dict[str, Any] = {param.name: argument(ty) for param, ty in zip(runtime, types)}
  arguments.update({name: value for name, value in constexprs.items() if name in names})
  bound, specialization, _ = _binder(fn, backend)(**arguments)
  specialization = list(specialization)
  dropped, pointers = [], []
  leaf = itertools.count()

  def ours(ty, got, path):
    """Triton's (type, attribute) of one argument, with our types; tuples element by element."""
    got_type, got_attr = got
    if isinstance(ty, tuple):
      entries = [ours(t, (gt, ga), path + (i,)) for i, (t, gt, ga) in enumerate(zip(ty, got_type, got_attr))]
      return tuple(e[0] for e in entries), tuple(e[1] for e in entries)
    k = next(leaf)
    if ty.startswith("tensordesc"):
      return ty, None
    if got_type == "constexpr":  # an integer equal to 1: compiled in, not passed
      dropped.append(k)
      return got_type, got_attr
    if ty.startswith("*"):
      pointers.append((k, path))
      # Our type from the call's dtype; a `tl.const` parameter keeps Triton's "*k" marking.
      return ("*k" + ty[1:] if got_type.startswith("*k") else ty), got_attr
    return ty, (got_attr if k in values else None)

  for param, ty in zip(runtime, types):
    index = names.index(param.name)
    specialization[index] = ours(ty, specialization[index], (index,))
  # How Triton's launcher turns the specialization into the compiler's signature, constexprs and attributes. It
  # parses compile options it does not use here: fp fusion given, as at every compile, so Triton 3.9 does not warn.
  fp_fusion = {"enable_fp_fusion": triton_options.FP_FUSION}
  _, signature, packed_constexprs, attrs = fn._pack_args(backend, fp_fusion, bound,  # noqa: SLF001  (Triton's own packing)
                                                         specialization, None)
  aligned = tuple(k for k, path in pointers if attrs.get(path))
  return Specialization(dict(signature), dict(packed_constexprs), dict(attrs), tuple(dropped), aligned)


_FORMAT = "triton-specialization-3"  # 2: values keyed exactly; 3: the function read whole


def specialize_cached(fn, types: Sequence[Any], values: Mapping[int, Any], constexprs: Mapping[str, Any],
                      target: str, make_backend) -> Specialization:
  """`specialize`, from the compile cache (memory, then disk) when the same question was answered before;
  ``make_backend()`` gives Triton's backend for ``target`` (only when Triton is asked). Keyed by the function
  read whole (its parameters' defaults, which Triton's binder puts among the constexprs, included); a call with a
  value that cannot be read whole is answered again, not cached."""
  import triton  # noqa: PLC0415  (optional dependency: Triton)
  flags = [(p.name, bool(p.is_constexpr), bool(p.do_not_specialize), bool(p.do_not_specialize_on_alignment))
           for p in fn.params]
  named = [*((f"scalar {k}", v) for k, v in sorted(values.items())), *sorted(constexprs.items()), ("fn", fn)]
  keys = [triton_keys.constexpr_key(v) for _, v in named]
  if None in keys:
    return specialize(fn, types, values, constexprs, make_backend())
  entry_key = disk_cache.key(_FORMAT, f"triton {triton.__version__}", target, str(XLA_BUFFER_ALIGN), fn.cache_key,
                             repr(flags), repr(list(types)), *(f"{n}:{k}" for (n, _), k in zip(named, keys)))
  # An entry read back from disk is checked against this call before use; one that does not fit is deleted and
  # rebuilt.
  # The audit proves a hit against the answer Triton gives now: a specialization holds the constexprs' values.
  witness = key_audit.Witness("Triton specialization (parameters compiled in, hints, constexpr values)",
                              lambda: _text(specialize(fn, types, values, constexprs, make_backend())), of=_text,
                              what=f"triton_kernel '{fn.__name__}' for {target}",
                              read="the function, the types and values of its arguments")
  codec = CODEC.bound(decode=lambda payload: _fitting(_decode(payload), fn, types, values, constexprs))
  found = stack.get_or_make(
      entry_key, codec, lambda: specialize(fn, types, values, constexprs, make_backend()),
      lambda: {"front_end": "Triton specialization", "kernel": fn.__name__, "targets": [target],
               "specialization": f"types {list(types)}", "toolchain": f"triton {triton.__version__}"},
      witness=witness)
  return found.value


def _text(s: Specialization) -> str:
  """A specialization as the audit compares it: each constexpr by its exact key (an array's repr is shortened)."""
  constexprs = sorted((list(k), triton_keys.exact(v).hex()) for k, v in s.constexprs.items())
  return json.dumps([s.description, constexprs, s.dropped, s.aligned], default=str)


def _stored(s: Specialization) -> bytes | None:
  """The entry on disk, or None (kept in memory only) for what does not read back the same."""
  try:
    payload = _encode(s)
  except TypeError:  # a constexpr that is not a plain value (a dtype, a function): answered again next process
    return None
  return payload if _decode(payload) == s else None


class _Misfit(ValueError):
  """A specialization read from the disk cache that cannot be this call's."""


def _fitting(found: Specialization | None, fn, types, values, constexprs) -> Specialization | None:
  """``found`` if it can be what Triton answered for this call, else raises _Misfit. A parameter compiled in
  as a constant must be an integer of value 1 here, a divisibility hint must hold for the value passed, and
  every name, index and kind must be the call's: a wrong entry would compile a kernel without a parameter, or
  with a fact that is false. A tuple parameter is checked leaf by leaf, at its elements' paths."""
  if found is None:
    return None
  names = list(fn.arg_names)
  runtime = [(names.index(p.name), p) for p in fn.params if not p.is_constexpr]
  if list(found.signature) != names or len(runtime) != len(types):
    raise _Misfit("not this function's parameters")
  for key in (*found.constexprs, *found.attrs):
    if not key or not all(type(i) is int for i in key) or not 0 <= key[0] < len(names):
      raise _Misfit(f"path {key!r} is out of range")
  # Each leaf (a parameter, or an element of a tuple parameter) as (parameter, path, type), in order: `dropped`,
  # `aligned` and `values` count them.
  leaves = [(param, path, leaf) for (index, param), ty in zip(runtime, types) for path, leaf in _leaves(ty, (index,))]
  dropped, aligned = set(found.dropped), set(found.aligned)
  if sorted(dropped) != list(found.dropped) or sorted(aligned) != list(found.aligned) or dropped & aligned or \
      not all(0 <= k < len(leaves) for k in dropped | aligned):
    raise _Misfit("dropped or aligned parameters out of range")
  for k, (param, path, ty) in enumerate(leaves):
    kind, hints = _kind_at(found.signature[param.name], path[1:]), found.attrs.get(path)
    if k in dropped:
      value = _python_number(values[k]) if k in values else None
      if (ty.startswith(("*", "tensordesc")) or param.do_not_specialize or type(value) is not int or value != 1
          or kind != "constexpr" or found.constexprs.get(path) != 1):
        raise _Misfit(f"parameter {param.name} is compiled in as 1")
    elif ty.startswith("*"):
      if kind not in (ty, "*k" + ty[1:]) or bool(hints) != (k in aligned) or (hints and (
          param.do_not_specialize_on_alignment or not _divisible_by_16(hints))):
        raise _Misfit(f"pointer {param.name} does not fit")
    elif kind != ty or k in aligned or (hints and (
        param.do_not_specialize or k not in values or not _divisible_by_16(hints)
        or type(_python_number(values[k])) is not int or _python_number(values[k]) % 16 != 0)):
      raise _Misfit(f"scalar {param.name} does not fit")
  passed = {index for index, _ in runtime}
  for index, param in enumerate(fn.params):
    if index in passed:
      continue
    value = found.constexprs.get((index,), _Misfit)
    if found.signature[param.name] != "constexpr" or (
        value is _Misfit and not any(key[0] == index for key in found.constexprs)) or (
        value is not _Misfit and param.name in constexprs and value != constexprs[param.name]):
      raise _Misfit(f"constexpr {param.name} does not fit")
  dropped_paths = {leaves[k][1] for k in dropped}
  if any(key[0] in passed and key not in dropped_paths for key in found.constexprs):
    raise _Misfit("a passed parameter among the constexprs")
  return found


def _leaves(ty, path: tuple):
  """(path, type) of each leaf of one parameter's type, depth first: a tuple parameter's elements."""
  if isinstance(ty, tuple):
    for i, element in enumerate(ty):
      yield from _leaves(element, path + (i,))
  else:
    yield path, ty


def _kind_at(kind, path: tuple):
  """The type an entry's signature gives the element at ``path`` of a parameter (None where it has none)."""
  for i in path:
    if not isinstance(kind, tuple) or not 0 <= i < len(kind):
      return None
    kind = kind[i]
  return kind


def _divisible_by_16(hints) -> bool:
  """Whether a parameter's hints are the one Triton gives (backend.parse_attr): divisible by 16, no other."""
  return isinstance(hints, (list, tuple)) and [list(h) if isinstance(h, (list, tuple)) else h for h in hints] == [
      ["tt.divisibility", 16]]


def _plain(value):
  """A JSON form that keeps tuples apart from lists; TypeError for anything but plain values."""
  if value is None or type(value) in (bool, int, float, str):
    return value
  if type(value) is list:
    return [_plain(v) for v in value]
  if type(value) is tuple:
    return {"tuple": [_plain(v) for v in value]}
  raise TypeError(f"not a plain value: {type(value).__name__}")


def _unplain(value):
  if isinstance(value, list):
    return [_unplain(v) for v in value]
  if isinstance(value, dict):
    if set(value) != {"tuple"} or not isinstance(value["tuple"], list):
      raise ValueError("malformed entry")
    return tuple(_unplain(v) for v in value["tuple"])
  return value


def _encode(s: Specialization) -> bytes:
  return json.dumps({"signature": _plain(list(s.signature.items())),
                     "constexprs": _plain(list(s.constexprs.items())), "attrs": _plain(list(s.attrs.items())),
                     "dropped": _plain(s.dropped), "aligned": _plain(s.aligned)}).encode()


def _is_type(value) -> bool:
  """A Triton type as a signature holds it: a string, or a tuple parameter's (nested) tuple of them."""
  return isinstance(value, str) or (isinstance(value, tuple) and all(_is_type(v) for v in value))


def _decode(payload: bytes) -> Specialization | None:
  """The entry, or None for anything that is not one (it is then answered again)."""
  try:
    doc = json.loads(payload)
    pairs = {name: _unplain(doc[name]) for name in ("signature", "constexprs", "attrs")}
    if not all(isinstance(p, tuple) and len(p) == 2 for v in pairs.values() for p in v):
      return None
    signature = dict(pairs["signature"])
    if not all(isinstance(k, str) and _is_type(v) for k, v in signature.items()):
      return None
    if not all(isinstance(k, tuple) for name in ("constexprs", "attrs") for k, _ in pairs[name]):
      return None
    dropped, aligned = _unplain(doc["dropped"]), _unplain(doc["aligned"])
    if not all(isinstance(t, tuple) and all(type(i) is int and 0 <= i < 1 << 16 for i in t)
               for t in (dropped, aligned)):
      return None
    return Specialization(signature, dict(pairs["constexprs"]), dict(pairs["attrs"]), dropped, aligned)
  except (ValueError, KeyError, TypeError, RecursionError):
    return None


# A specialization's entries: kept on disk and in packs beside Triton's compiles; the strict pack mode answers one
# a pack lacks (it compiles nothing), and a job does not share them (each process answers its own in milliseconds).
CODEC = Codec("specialization", encode=_stored, decode=_decode, required=False, shared=False)
