"""Which jax / jaxlib releases this package supports, checked at import.

The C++ core is built against the XLA FFI headers of the oldest supported
jaxlib (pyproject.toml's build requirements). XLA accepts a handler built
against older headers, not newer ones, and the command-buffer record
extension may change without a version bump (jaxlib 0.12.1 did), so every
release in the range has its headers compared with a checked manifest
(scripts/ffi_headers.py, in CI; docs/compatibility.md).
The same bounds are in pyproject.toml's dependencies; tests/test_install.py
checks that they agree.
"""

from __future__ import annotations

import os
import re
import warnings

import jax
import jaxlib

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base.paths import PACKAGE_DIR

OLDEST = (0, 11, 2)  # the jaxlib whose FFI headers the extension is built against
BEFORE = (0, 13)  # first release not checked yet
# What CI runs the CPU suite against: the oldest release in range (a venv of its own) and the newest, which pip
# picks (the GPU suite's releases: docs/compatibility.md). 0.12.0.1, the newest before 0.12.1, is no longer run.
TESTED = ("0.11.2", "0.12.1")
SUPPORTED = f">={'.'.join(map(str, OLDEST))},<{'.'.join(map(str, BEFORE))}"

# Lets one try an unverified jax anyway (record handlers stay off then).
SKIP_CHECK_ENV = flags.SKIP_VERSION_CHECK


def parse(version: str) -> tuple[int, ...]:
  """The leading numeric components: "0.12.0.1" -> (0, 12, 0, 1), "0.13.0.dev1" -> (0, 13, 0)."""
  parts = []
  for piece in version.split("."):
    match = re.match(r"\d+", piece)
    if match is None:
      break
    parts.append(int(match.group()))
    if match.end() != len(piece):
      break
  return tuple(parts)


def in_range(version: str) -> bool:
  v = parse(version)
  return OLDEST <= v and v[:len(BEFORE)] < BEFORE


def problem(jax_version: str, jaxlib_version: str, built_jaxlib: str) -> str | None:
  """Why this jax / jaxlib cannot be used with this build, or None when it can."""
  bad = [f"{name} {v}" for name, v in (("jax", jax_version), ("jaxlib", jaxlib_version)) if not in_range(v)]
  if bad:
    return (f"jax_mosaic_ffi supports jax and jaxlib {SUPPORTED} (tested with {', '.join(TESTED)}), "
            f"but this environment has {' and '.join(bad)}. Install a supported one: "
            f"pip install 'jax{SUPPORTED}' 'jaxlib{SUPPORTED}'")
  if parse(jaxlib_version) < parse(built_jaxlib):
    # XLA refuses handlers built against newer FFI headers than its own.
    return (f"this jax_mosaic_ffi was built against the FFI headers of jaxlib {built_jaxlib}, newer than the "
            f"installed jaxlib {jaxlib_version}, which would refuse its handlers. Rebuild it with the "
            f"default build requirements (pip install --force-reinstall --no-cache-dir jax_mosaic_ffi) "
            f"or upgrade jaxlib")
  return None


def check(built_jaxlib: str) -> bool:
  """Raises ImportError for an unsupported jax / jaxlib; True when in range.

  With JAX_MOSAIC_FFI_SKIP_VERSION_CHECK=1 an out-of-range jax only warns,
  and False comes back (the caller then registers no record handlers).
  """
  reason = problem(jax.__version__, jaxlib.__version__, built_jaxlib)
  if reason is None:
    return True
  if os.environ.get(SKIP_CHECK_ENV, "") in ("", "0"):
    raise ImportError(f"{reason}. (Set {SKIP_CHECK_ENV}=1 to try it anyway.)")
  warnings.warn(f"{reason}; continuing because {SKIP_CHECK_ENV} is set, without CUDA-graph record handlers",
                RuntimeWarning, skip_file_prefixes=(PACKAGE_DIR,))
  return False
