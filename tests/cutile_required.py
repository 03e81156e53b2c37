"""The cuTile tests' one guard: skip the module where cuda-tile (the cutile extra) is not installed, or tileiras,
its compiler, cannot be found."""

import pytest

from jax_mosaic_ffi.cutile.compiler import release

try:
  release.check_release(release.release())
  release.tileiras_identity()
except release.CutileUnavailable as e:
  pytest.skip(f"cuTile is not installed or cannot compile ({e}; pip install 'jax_mosaic_ffi[cutile]')",
              allow_module_level=True)


def samples():
  """benchmarks/kernels/cutile_samples.py, the kernels tests and the benchmark share."""
  import benchmarks_package  # noqa: PLC0415
  benchmarks_package.load()
  import benchmarks.kernels.cutile_samples as samples  # noqa: PLC0415
  return samples
