"""Lowering a function for CUDA on a machine without a GPU, and reading the custom calls out of the program.

``custom_calls`` is benchmarks/hlo_inspect.py's, which the benchmarks use too.
"""

import jax
import jax.numpy as jnp
import pytest
from jax._src import source_info_util

import benchmarks_package

custom_calls = benchmarks_package.load().hlo_inspect.custom_calls

# A helper's frames are not the caller's: the call site an error or a warning names is the test's line, as it is
# a user's line when the user calls jax.jit directly.
source_info_util.register_exclusion(__file__)


# A module whose kernels are autotuned, lowered without a GPU, where tuning is not what it tests (an autotuner
# there takes its default config and says so with AutotuneSkipped): ``pytestmark = UNTUNED_OK``.
UNTUNED_OK = pytest.mark.filterwarnings("ignore::jax_mosaic_ffi.transforms.autotune.AutotuneSkipped")


def lower(fn, *avals):
  """``jax.jit(fn)`` lowered for CUDA."""
  return jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",))


def only_call(fn, *avals) -> dict:
  """The one custom call of ``fn`` lowered for CUDA (fails if there are more or none)."""
  (call,) = custom_calls(lower(fn, *avals))
  return call


def f32(*shape) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, jnp.float32)
