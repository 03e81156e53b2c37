"""Triton's values in our cache keys, read whole: constexprs, backend options, autotuning spaces, JIT functions.

Our keys read every value through the one reader (`base.value_key`), with Triton's kinds of value added here: a
``@triton.jit`` or ``@gluon.jit`` function by its source, its flags and its Python function read to the end (its
code, the globals it names, its closure and defaults: what Triton's own ``cache_key`` reads and what it misses,
such as a default's value), a ``tl.constexpr`` by the value it wraps, a Triton type by every attribute. Triton's package
is named, not walked (its release is in every key). A class or an instance passed as a constexpr (Gluon's
``MMAImpl=WGMMA``, a config object) is read with every method and attribute, so an edit of the code a kernel runs
through it changes the key.

`constexpr_key` gives None for a value the reader cannot read whole (and so does the kernel's own function, where
its code cannot be: it reads the environment, a global by computed name): compile.py then keys that compile by
the TTIR Triton's frontend makes of it (`KeyedSource`), never by a partial reading. Only that kernel: every other
keeps its fast key. Triton's own cache
(``~/.triton/cache``, which ``triton.compile`` reads first) keys a constexpr by its ``str``; our sources give
Triton our key instead (`KeyedSource.hash`), so its cache is as exact as ours.
"""

from __future__ import annotations

import hashlib
import json
import types

from jax_mosaic_ffi.base import value_key as value_key_lib
from jax_mosaic_ffi.base.errors import LaunchError, ValueKeyError

_JIT_FLAGS = ("noinline", "debug", "do_not_specialize", "do_not_specialize_on_alignment", "version")


def _triton_value(value, keyer) -> bool:
  cls = type(value)
  # Triton's own classes, by where they live (a user's class that names Triton's module is read as the user's).
  if not (str(cls.__module__).startswith("triton.") and TOOLCHAIN.origins.cls(cls)):
    return False
  fn = getattr(value, "fn", None)
  if isinstance(fn, types.FunctionType):  # @triton.jit, @gluon.jit, constexpr_function: the code Triton compiles
    source = getattr(value, "_src", None) or getattr(value, "src", None)

    def fill():
      keyer.text(b"triton jit", cls.__qualname__, source if isinstance(source, str) else "")
      keyer.put(tuple((f, getattr(value, f, None)) for f in _JIT_FLAGS), 1, f"the flags of {fn.__qualname__}")
      keyer.put(fn, 1, f"the JIT function {fn.__qualname__}")

    keyer.composite(value, fill)
    return True
  if hasattr(value, "__func__") and hasattr(value, "__self__"):  # a JIT method bound to an instance
    keyer.tag(b"triton bound")
    keyer.put(value.__func__, 1, "a bound JIT method")
    keyer.put(value.__self__, 1, "the instance a JIT method is bound to")
    return True
  if cls.__qualname__ == "constexpr" and hasattr(value, "value"):
    keyer.tag(b"tl.constexpr")
    keyer.put(value.value, 1, "a tl.constexpr's value")
    return True
  # A Triton type (tl.float16, tl.pointer_type(...)) is read as any library instance, by every attribute: its text
  # left out a pointer's address space.
  return False


TOOLCHAIN = value_key_lib.Toolchain(libraries=frozenset({"triton"}), extra=_triton_value)


def exact(value) -> bytes:
  """`base.value_key` with Triton's values; raises ValueKeyError for what it cannot read whole."""
  return value_key_lib.value_key(value, toolchain=TOOLCHAIN)


def constexpr_key(value) -> str | None:
  """A constexpr's key as hex, or None where it cannot be read whole (the compile is then keyed by its IR)."""
  try:
    return exact(value).hex()
  except (ValueKeyError, RecursionError):
    return None


def key(value, what: str, where: str) -> str:
  """``value``'s exact key as hex, or LaunchError naming it (``what``, e.g. "the Triton option 'x'") at ``where``:
  for values that are data (options, autotuning spaces, scalars), which no IR could stand in for."""
  try:
    return exact(value).hex()
  except (ValueKeyError, RecursionError) as e:
    raise LaunchError(f"{where}: {what} = {value!r} cannot be keyed exactly for the compile cache ({e}); pass a "
                      "number, string, None, a Triton dtype, a @triton.jit function, or a tuple of them") from None


class KeyedSource:
  """A mixin for the source a Triton compile takes (``ASTSource``, Gluon's): ``hash()``, Triton's own identity of
  the source and so part of its cache key and ours, read whole. Triton's reads the function's ``cache_key`` (its
  source and what it calls, cached on the function object for the process) and each constexpr's ``str``; ours
  adds the function read to the end (its globals', closure's and defaults' values now) and each constexpr's
  exact key, or, for one that cannot be read whole, ``ir_key``: the digest of the TTIR Triton's frontend made
  of this source (compile.py sets it before anything asks)."""

  ir_key: str | None = None

  def unkeyed(self) -> list:
    """What cannot be read whole: the constexprs (by path), and ``"the function"`` where the kernel's own code
    cannot be (it reads the environment, a global by computed name, ...)."""
    paths = sorted(str(path) for path, v in self.constants.items() if constexpr_key(v) is None)
    return paths + ["the function"] * (self.function_key() is None)

  def function_key(self) -> str | None:
    """The kernel's function read whole (`exact`), or None where it cannot be; once per source object."""
    if "_jmf_function" not in self.__dict__:
      self.__dict__["_jmf_function"] = constexpr_key(self.fn)
    return self.__dict__["_jmf_function"]

  def hash(self) -> str:
    found = self.__dict__.get("_jmf_hash")
    if found is not None:
      return found
    constants = []
    for path, v in sorted(self.constants.items()):
      k = constexpr_key(v)
      if k is None:
        if self.ir_key is None:
          raise RuntimeError(f"the constexpr at {path} cannot be keyed without the IR, which was not made")
        k = "ir:" + self.ir_key
      constants.append([list(path), k])
    # Not Triton's own hash(): it holds each constexpr's str, which for an object names its address.
    function = self.function_key()
    if function is None:
      if self.ir_key is None:
        raise RuntimeError("the kernel's function cannot be keyed without the IR, which was not made")
      function = "ir:" + self.ir_key
    parts = [type(self).__name__, self.fn.cache_key, function, str(self.attrs),
             [v for _, v in sorted(self.signature.items())], constants]
    found = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()
    self.__dict__["_jmf_hash"] = found
    return found
