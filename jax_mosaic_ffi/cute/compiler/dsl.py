"""The CuTe DSL (``nvidia-cutlass-dsl``'s ``cutlass`` package), imported on first use, and its supported releases.

Importing the DSL loads MLIR and takes about a second, so nothing imports it until a CuTe DSL kernel is
compiled: a process that runs only exported programs, or whose compiles are all cache hits, never does.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re

from jax_mosaic_ffi.cute.compiler import package
from jax_mosaic_ffi.cute.compiler.package import CuteUnavailable

# The releases this wing is written and tested against: [min, max). The host function's calling convention
# (an 8-byte slot per Pointer or Int64 argument, after the stream, then an int32 result), dump_to_object's
# object and the runtime library's C API are what we rely on; a new minor release may change any of them.
SUPPORTED = ((4, 8), (4, 9))
SUPPORTED_TEXT = "nvidia-cutlass-dsl >= 4.8, < 4.9 (tested: 4.8.1 compiling on CPU)"


def is_jit(fn) -> bool:
  """Whether ``fn`` is a ``@cute.jit`` function (the DSL marks each with its DSL class), bound or partially
  applied."""
  while isinstance(fn, functools.partial) or inspect.ismethod(fn):
    fn = fn.func if isinstance(fn, functools.partial) else fn.__func__
  return callable(fn) and "_dsl_cls" in getattr(fn, "__dict__", {})


def release_tuple(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def check_release(version: str | None) -> None:
  if version is None:
    raise CuteUnavailable(f"CuTe DSL kernels need CuTe DSL ({SUPPORTED_TEXT}): {package.INSTALL_HINT}")
  low, high = SUPPORTED
  if not low <= release_tuple(version)[:2] < high:
    raise CuteUnavailable(
        f"jax_mosaic_ffi supports {SUPPORTED_TEXT}; nvidia-cutlass-dsl {version} is installed. Its objects' "
        f"calling convention and runtime API change between releases: {package.INSTALL_HINT}")


@contextlib.contextmanager
def importing(what: str):
  """CuteUnavailable for whatever importing ``what`` raises: a damaged install fails in many ways (a module
  missing, an attribute a file lacks, a binary that does not load), each a bare Python error otherwise."""
  try:
    yield
  except Exception as e:
    raise CuteUnavailable(f"CuTe DSL could not be imported: {what} raised {type(e).__name__}: {e}. The "
                          f"nvidia-cutlass-dsl install looks damaged: {package.INSTALL_HINT}") from None


@functools.cache
def modules():
  """(cutlass, cutlass.cute, cuda.bindings.driver), or CuteUnavailable saying what to install."""
  check_release(package.compiler_release())
  with importing("import cutlass"):
    import cuda.bindings.driver as cuda  # noqa: PLC0415  (optional dependency: CuTe DSL)
    import cutlass  # noqa: PLC0415  (optional dependency: CuTe DSL)
    import cutlass.cute as cute  # noqa: PLC0415  (optional dependency: CuTe DSL)
  return cutlass, cute, cuda


def tensor_spec_class():
  """cutlass.jax.TensorSpec: what input_spec / output_spec hold, as for cutlass_call."""
  modules()
  with importing("from cutlass.jax import TensorSpec"):
    from cutlass.jax import TensorSpec  # noqa: PLC0415  (optional dependency: CuTe DSL)
  return TensorSpec


def cutlass_dtype(dtype):
  """The DSL's numeric type of a jax dtype (cutlass.jax's own table)."""
  modules()
  with importing("from cutlass.jax import jax_to_cutlass_dtype"):
    from cutlass.jax import jax_to_cutlass_dtype  # noqa: PLC0415  (optional dependency: CuTe DSL)
  return jax_to_cutlass_dtype(dtype)


@contextlib.contextmanager
def runtime_arch(arch: str):
  """The DSL's idea of the GPU it runs on, set to ``arch`` (``"sm_90a"``) while compiling for it.

  ``dump_to_object`` needs the JIT engine the DSL builds only for a binary it believes this machine can run: its
  runtime arch (``CUTE_DSL_ARCH``, else the visible GPU's, else sm_100a) must be the target. That environment
  variable is the public way to say it, but the DSL reads it once, when it is imported, and it holds one arch,
  while a call compiles for the targets it is given (on a machine without a GPU, or for another GPU than this
  one). Where the runtime arch already is the target (``CUTE_DSL_ARCH=sm_90a``, or this GPU's own), nothing
  changes. Elsewhere we set it for the compile through the DSL's environment object: its ``arch`` property has
  a public setter and deleter (the DSL's own tests patch it), but the DSL singleton that holds it has no
  public accessor, so this is the one place that reaches a private name of the DSL (``CuTeDSL._get_dsl()``,
  which the DSL's own modules call). tests/test_cute_compile.py fails if a release changes it.
  """
  try:
    from cutlass.cutlass_dsl.cutlass import CuTeDSL  # noqa: PLC0415  (optional dependency: CuTe DSL)
    state = CuTeDSL._get_dsl().envar  # noqa: SLF001  (see above: the one private name we use)
    saved = state.arch
  except (ImportError, AttributeError) as e:
    raise CuteUnavailable(
        f"nvidia-cutlass-dsl {package.compiler_release()} no longer keeps its runtime arch where "
        f"jax_mosaic_ffi sets it to compile for {arch} ({type(e).__name__}: {e}). Set CUTE_DSL_ARCH={arch} in "
        f"the environment before the DSL is imported, or install {SUPPORTED_TEXT}: "
        f"{package.INSTALL_HINT}") from None
  if saved == arch:
    yield
    return
  state.arch = arch
  try:
    yield
  finally:
    state.arch = saved
