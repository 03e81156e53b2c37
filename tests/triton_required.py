"""The one guard of the Triton test files: they skip where triton is absent, and fail where it is installed but
does not import (a missing dependency, a bad build), which a skip would hide."""

import pytest


def import_triton():
  """The triton module; skips the calling test module (at its import) where triton is not installed."""
  try:
    import triton  # noqa: PLC0415  (optional dependency)
  except ModuleNotFoundError as e:
    if e.name != "triton":
      raise
    pytest.skip("triton is not installed (pip install 'jax_mosaic_ffi[triton]')", allow_module_level=True)
  return triton
