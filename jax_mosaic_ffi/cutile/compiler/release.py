"""cuTile Python (``cuda-tile``'s ``cuda.tile``), imported on first use, its supported releases, and the tileiras it
runs.

A process that only runs exported programs, or whose compiles are all cache hits, needs cuTile only to read the
kernel's annotations (which the user's ``@ct.kernel`` already imported): nothing here imports it until a key or a
compile asks. The key names the exact tileiras cuTile runs by its ``--version`` text, as cuTile's own cache does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import re

INSTALL_HINT = "pip install 'jax_mosaic_ffi[cutile]' (cuda-tile with the tileiras of CUDA 13.4)"
# The releases this wing is written and tested against: [min, max). What we rely on: export_kernel's cubin and its
# calling convention (cutile_python_v1: per array a pointer, its shape, its strides; scalars; constants dropped),
# KernelSignature / ArrayConstraint, and the kernel's annotations (``kernel._annotated_function``, read as
# cuda.tile.jax reads them). A new minor release may change any of them.
SUPPORTED = ((1, 7), (1, 8))
SUPPORTED_TEXT = "cuda-tile >= 1.7, < 1.8 (tested: 1.7.0 with nvidia-cuda-tileiras 13.4.92, compiling on CPU)"
DISTRIBUTION = "cuda-tile"


class CutileUnavailable(ImportError):
  """cuTile Python (cuda-tile) or its compiler, tileiras, is missing, of an unsupported release or damaged.

  Raised by `cutile_kernel` and `cutile_call`. ``pip install 'jax_mosaic_ffi[cutile]'`` installs a supported
  release beside the package's CUDA 13.0 libraries.
  """


def release_tuple(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


@functools.cache
def release() -> str | None:
  """The installed cuda-tile release, or None without it (read once, from its metadata: no import)."""
  try:
    return importlib.metadata.version(DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    return None


def check_release(version: str | None) -> None:
  if version is None:
    raise CutileUnavailable(f"cuTile kernels need cuTile Python ({SUPPORTED_TEXT}): {INSTALL_HINT}")
  low, high = SUPPORTED
  if not low <= release_tuple(version)[:2] < high:
    raise CutileUnavailable(
        f"jax_mosaic_ffi supports {SUPPORTED_TEXT}; cuda-tile {version} is installed. Its exported cubins' calling "
        f"convention and its kernels' annotations change between releases: {INSTALL_HINT}")


@contextlib.contextmanager
def importing(what: str):
  """CutileUnavailable for whatever importing ``what`` raises: a damaged install fails in many ways."""
  try:
    yield
  except CutileUnavailable:
    raise
  except Exception as e:
    raise CutileUnavailable(f"cuTile could not be imported: {what} raised {type(e).__name__}: {e}. The cuda-tile "
                            f"install looks damaged: {INSTALL_HINT}") from None


@functools.cache
def require_cutile():
  """The ``cuda.tile`` module, or CutileUnavailable saying what to install."""
  check_release(release())
  with importing("import cuda.tile"):
    import cuda.tile as ct  # noqa: PLC0415  (optional dependency: cuTile)
  return ct


def is_kernel(value) -> bool:
  """Whether ``value`` is a ``@ct.kernel`` (without importing cuTile where it is not installed: nothing is one)."""
  if release() is None:
    return False
  try:
    ct = require_cutile()
  except CutileUnavailable:
    return False
  return isinstance(value, ct.kernel)


@functools.cache
def tileiras_identity() -> str:
  """The ``--version`` text of the tileiras cuTile runs (pip's nvidia-cuda-tileiras where its CUDA packages share a
  release, else the CUDA toolkit's on PATH or CUDA_HOME): what the key names the compiler by, as cuTile's own cache
  keys it. CutileUnavailable where there is none."""
  require_cutile()
  with importing("cuTile's tileiras lookup"):
    from cuda.tile import _compile as ct_compile  # noqa: PLC0415  (optional dependency: cuTile; its own lookup)
  try:
    text = ct_compile._get_compiler_version_string()  # noqa: SLF001  (the binary cuTile will run, as it keys it)
  except FileNotFoundError as e:
    raise CutileUnavailable(f"cuTile's compiler, tileiras, was not found ({e}): {INSTALL_HINT}") from None
  if not text:
    raise CutileUnavailable(f"cuTile's tileiras did not say its version (tileiras --version failed): {INSTALL_HINT}")
  return " ".join(text.split())


@functools.cache
def bytecode_version() -> str:
  """The newest TileIR bytecode version the tileiras cuTile runs takes ("13.4"), found as cuTile finds it (a
  tileiras run on an empty module, some 50-80 ms): asked once per process, here, before a compile forks, and handed
  to every ``export_kernel``, so that no forked compile's child runs that probe again (what a child caches dies with
  it). The cuda-tile release and the tileiras decide it, and the key names both."""
  require_cutile()
  with importing("cuTile's bytecode version lookup"):
    from cuda.tile import _cext  # noqa: PLC0415  (optional dependency: cuTile; its context's configuration)
    from cuda.tile import _compile as ct_compile  # noqa: PLC0415  (optional dependency: cuTile; its own probe)
  try:
    found = ct_compile._get_max_supported_bytecode_version(  # noqa: SLF001  (as export_kernel asks it)
        _cext.default_tile_context.config.temp_dir, allow_dev=_cext.dev_features_enabled())
  except FileNotFoundError as e:
    raise CutileUnavailable(f"cuTile's compiler, tileiras, was not found ({e}): {INSTALL_HINT}") from None
  return found.as_string()


@functools.cache
def disassembler() -> str | None:
  """tileirdisasm beside the tileiras cuTile runs (TileIR bytecode to MLIR text, the key audit's witness), or None."""
  require_cutile()
  with contextlib.suppress(Exception):
    from cuda.tile import _compile as ct_compile  # noqa: PLC0415  (optional dependency: cuTile)
    return ct_compile._find_tileirdisasm_bin()  # noqa: SLF001  (its own lookup, beside its tileiras)
  return None
