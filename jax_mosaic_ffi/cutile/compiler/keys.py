"""A cuTile kernel's identity for the compile cache without compiling it: its Python function and everything it
reaches, read whole by the one reader of code and values (`base.value_key`); its ``ct.kernel`` options; cuTile's
settings that change what it compiles (`settings_key`).

cuTile (``cuda``: cuda.tile and its siblings) is named, not walked: its release is in the key, with the tileiras
that compiles. Line numbers and the file's folder are not keyed (the reader leaves paths out; compiles make bytes
that name no folder: relocate.py). What the reader cannot read whole makes the fingerprint None, and the caller
keys that kernel by the TileIR bytecode cuTile makes of it instead.
"""

from __future__ import annotations

import os

from jax_mosaic_ffi.base import value_key as value_key_lib
from jax_mosaic_ffi.base.errors import ValueKeyError

TOOLCHAIN = value_key_lib.Toolchain(libraries=frozenset({"cuda"}))

# cuTile's settings that change nothing it compiles (its cache, logs, dumps, temporary files, its own timeout,
# crash dumps): every other CUDA_TILE_* variable set is keyed (at worst a compile too many, never a stale kernel).
NOT_COMPILING = frozenset({"CUDA_TILE_CACHE_DIR", "CUDA_TILE_CACHE_SIZE", "CUDA_TILE_LOGS", "CUDA_TILE_TEMP_DIR",
                           "CUDA_TILE_DUMP_BYTECODE", "CUDA_TILE_DUMP_TILEIR", "CUDA_TILE_COMPILER_TIMEOUT_SEC",
                           "CUDA_TILE_ENABLE_CRASH_DUMP"})


def exact_key(value, name: str = "the value") -> bytes:
  """`base.value_key` with cuTile named: raises ValueKeyError for what it cannot read whole."""
  return value_key_lib.value_key(value, toolchain=TOOLCHAIN, name=name)


def fingerprint(*objects) -> str | None:
  """A hex digest of the objects and all they reach, or None where something cannot be read whole."""
  try:
    return exact_key(objects).hex()
  except (ValueKeyError, RecursionError):
    return None


def settings_environment() -> list[str]:
  """The keyed ``CUDA_TILE_*`` variables that are set, as ``NAME=value`` (and ``EXPERIMENTAL_CUDA_TILE_*``)."""
  return [f"{k}={v}" for k, v in sorted(os.environ.items())
          if (k.startswith("CUDA_TILE_") or k.startswith("EXPERIMENTAL_CUDA_TILE_")) and k not in NOT_COMPILING]


def settings_key() -> str:
  return "\0".join(settings_environment())
