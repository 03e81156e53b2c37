"""The CuTe tests' one guard: skip the module where nvidia-cutlass-dsl (the cute extra) is not installed."""

import pytest

from jax_mosaic_ffi.cute.compiler import package as cute_package

if cute_package.compiler_release() is None:
  pytest.skip("nvidia-cutlass-dsl is not installed (pip install 'jax_mosaic_ffi[cute]')", allow_module_level=True)
