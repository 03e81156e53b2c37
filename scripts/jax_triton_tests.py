"""Runs jax-triton's own test files (tests/gluon_test.py, triton_call_test.py, cluster_test.py of the jax-ml/jax-triton
repository) against jax_mosaic_ffi, with `jax_triton` aliased to `jax_mosaic_ffi.jax_triton`. Their code is
jax-triton's, not ours to commit: pass their paths.

  python scripts/jax_triton_tests.py PATH/gluon_test.py [more test files] [-- pytest arguments]

The alias is a package `jax_triton` made in a temporary folder and put first on sys.path, ahead of a real jax-triton
(the carried `triton39` bundle holds jax-triton 0.4.1). With a GPU the tests run their kernels; without one (or with
JMF_LOWER_ONLY=1) each `triton_call` is traced and lowered for CUDA and the test then skipped as "lowered", so API
and compile mismatches still fail before the launch. JMF_PRETEND_SM90=1 makes the tests' own compute-capability
guards (jax's test_util) answer as on an H200, so their TMA tests lower on a machine without a GPU too.

On the H200 (scripts/jax_triton_tests.sh builds the extension and puts carried bundles on the path):

  JMF_CARRIED=triton39 bash scripts/jax_triton_tests.sh .carry/jax-triton-tests/gluon_test.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap

SHIM = '''
"""jax_triton, aliased to jax_mosaic_ffi.jax_triton by scripts/jax_triton_tests.py."""
import os
import unittest

import jax

import jax_mosaic_ffi.jax_triton as _ours
from jax_mosaic_ffi.jax_triton import *  # noqa: F401,F403
from jax_mosaic_ffi.jax_triton import __all__, __version__, __version_info__  # noqa: F401


def _has_gpu():
  try:
    return bool(jax.devices("cuda"))
  except RuntimeError:
    return False


_LOWER_ONLY = os.environ.get("JMF_LOWER_ONLY") == "1" or not _has_gpu()


def triton_call(*args, **kwargs):
  if not _LOWER_ONLY:
    return _ours.triton_call(*args, **kwargs)
  # The arrays become the traced program's arguments; Refs, scalars and descriptors are closed over as passed.
  positions = [i for i, a in enumerate(args) if isinstance(a, jax.Array) and not isinstance(a, jax.Ref)]

  def call(*traced):
    full = list(args)
    for i, value in zip(positions, traced):
      full[i] = value
    return _ours.triton_call(*full, **kwargs)

  jax.jit(call).trace(*[args[i] for i in positions]).lower(lowering_platforms=("cuda",))
  raise unittest.SkipTest("lowered for CUDA (no GPU here)")
'''


def main(argv: list[str]) -> int:
  files, pytest_args = argv, []
  if "--" in argv:
    split = argv.index("--")
    files, pytest_args = argv[:split], argv[split + 1:]
  if not files or not all(os.path.isfile(f) for f in files):
    print(__doc__, file=sys.stderr)
    print(f"error: give the paths of jax-triton's test files (got {files})", file=sys.stderr)
    return 2
  shim_root = tempfile.mkdtemp(prefix="jmf-jax-triton-alias-")
  os.makedirs(os.path.join(shim_root, "jax_triton"))
  with open(os.path.join(shim_root, "jax_triton", "__init__.py"), "w") as f:
    f.write(textwrap.dedent(SHIM))
  sys.path.insert(0, shim_root)
  os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (shim_root, os.environ.get("PYTHONPATH")) if p)
  os.environ.setdefault("JAX_MOSAIC_FFI_CACHE_DIR", tempfile.mkdtemp(prefix="jmf-jax-triton-tests-cache-"))
  os.environ.setdefault("JAX_MOSAIC_FFI_POISON_OUTPUTS", "1")  # an element the kernel does not write fails
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
  if os.environ.get("JMF_PRETEND_SM90") == "1":
    from jax._src import test_util as jtu  # noqa: PLC0415  (only to answer the tests' own guards)
    jtu.is_cuda_compute_capability_at_least = lambda capability: float(capability) <= 9.0
  import jax_triton  # noqa: PLC0415  (the alias, before pytest imports the tests)
  assert jax_triton.__file__.startswith(shim_root), f"jax_triton is {jax_triton.__file__}, not the alias"
  import pytest  # noqa: PLC0415
  return pytest.main([*files, "-rA", "-p", "no:cacheprovider", *pytest_args])


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
