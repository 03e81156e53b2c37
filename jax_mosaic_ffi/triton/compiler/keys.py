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

Triton's settings (its knobs) that reach a compile are the key's other extra: `settings_key`, and
`settings_environment` for a pack's manifest (below).
"""

from __future__ import annotations

import hashlib
import json
import os
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


def exact(value, ir: bool = False) -> bytes:
  """`base.value_key` with Triton's values; raises ValueKeyError for what it cannot read whole (``ir``: the caller
  keys a refused value by its TTIR)."""
  return value_key_lib.value_key(value, toolchain=TOOLCHAIN, ir=ir)


def constexpr_key(value) -> str | None:
  """A constexpr's key as hex, or None where it cannot be read whole (the compile is then keyed by its IR)."""
  try:
    return exact(value, ir=True).hex()
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


# Triton's own settings that change what it compiles, for our key: read from Triton's list of them, its knobs.
#
# Triton's cache key holds its options (FP fusion, the PTX options, libdevice's path...) and the variables its C++
# marks as invalidating (line info, ASan, ptxas optimisation), and we hold that key. Its knobs also hold settings
# that reach the compile otherwise (an IR override folder, a mocked PTX version, the arch it overrides, non-constexpr
# globals allowed), set from the environment or by code. Our key holds every knob of the groups that reach a compile
# (compilation, language, nvidia, runtime) with its current value, but the tools' (ptxas: Triton's key holds its
# version, and its path is no code) and those that change only what Triton prints or dumps, or whether it
# reuses its own cache (`_NOT_THE_KERNEL`): a debug variable set on one node must not lose it every packed kernel. A
# knob a new release adds is keyed until it is known: at worst a needless compile, never a kernel compiled under
# other settings.
# `settings_environment` names the keyed knobs the environment sets, for a pack's manifest.

_GROUPS = ("compilation", "language", "nvidia", "runtime")
# Knobs that change what Triton prints or dumps, whether it reuses its own cache, or where it finds the driver:
# never the code it compiles (TRITON_KERNEL_DUMP, TRITON_ALWAYS_COMPILE, TRITON_FRONT_END_DEBUGGING,
# NVPTX_ENABLE_DUMP, TRITON_DUMP_PTXAS_LOG, TRITON_LIBCUDA_PATH). TRITON_STORE_BINARY_ONLY stays keyed: it changes
# which stages a compile returns.
_NOT_THE_KERNEL = frozenset({"compilation.dump_ir", "compilation.always_compile", "compilation.front_end_debugging",
                             "nvidia.dump_nvptx", "nvidia.dump_ptxas_log", "nvidia.libcuda_path"})


def _keyed():
  """(group.name, owner, name, descriptor) of each knob that changes the compiled kernel."""
  from triton import knobs  # noqa: PLC0415  (optional dependency: Triton)
  for group in _GROUPS:
    owner = getattr(knobs, group, None)
    for name, descriptor in sorted(getattr(owner, "knob_descriptors", {}).items()):
      # ptxas and friends: their versions are in Triton's own key
      if "tool" not in type(descriptor).__name__ and f"{group}.{name}" not in _NOT_THE_KERNEL:
        yield f"{group}.{name}", owner, name, descriptor


def settings_environment() -> list[str]:
  """The keyed knobs' environment variables that are set, as ``NAME=value``: what a pack's manifest shows of the
  settings its Triton kernels were compiled under (``pack check`` compares a node's with them)."""
  variables = (getattr(descriptor, "key", None) for _, _, _, descriptor in _keyed())
  return sorted(f"{v}={os.environ[v]}" for v in variables if isinstance(v, str) and v in os.environ)


def settings_key() -> str:
  """The keyed knobs' current values, as text."""
  values = {}
  for keyed, owner, name, _ in _keyed():
    try:
      value = getattr(owner, name)
    except Exception as e:  # a knob whose value cannot be read now (a tool not found): its failure is its value
      value = f"unreadable: {type(e).__name__}"
    values[keyed] = str(value)
  return json.dumps(values, sort_keys=True)
