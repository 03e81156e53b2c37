"""Wrong use fails at trace time, with a message that names the problem."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import gpu_info

import kernel_sources

X = jax.ShapeDtypeStruct((1024,), jnp.float32)


@pytest.fixture
def kernel(isolated_disk_cache):
  return jmf.cuda_kernel(kernel_sources.ADD, "add")


def trace(kernel, *, inputs=(X, X), out=X, **kwargs):
  kwargs.setdefault("grid", 4)
  kwargs.setdefault("block", 256)
  kwargs.setdefault("scalars", (np.int32(1024),))
  call = jmf.mosaic_kernel(kernel, out, **kwargs)
  return jax.jit(call).trace(*inputs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(grid=0), r"grid\[0\] = 0 is out of range"),
    (dict(grid=(1, 70000)), r"grid\[1\] = 70000 is out of range"),
    (dict(block=(2048,)), r"block\[0\] = 2048 is out of range"),
    (dict(block=(32, 32, 2)), "2048 threads; a block holds at most 1024"),
    (dict(block=(1, 1, 1, 1)), "1 to 3 dimensions"),
    (dict(cluster=(3,), grid=4), r"grid\[0\] = 4 is not a multiple of cluster\[0\] = 3"),
    (dict(smem_bytes=-1), "negative"),
])
def test_launch_dimensions_are_checked(kernel, kwargs, message):
  with pytest.raises(jmf.LaunchError, match=message):
    trace(kernel, **kwargs)


@pytest.mark.skipif(not gpu_info.has_gpu(), reason="the shared-memory limit is known only with a GPU")
def test_shared_memory_over_the_device_limit(kernel):
  limit = gpu_info.visible_gpus()[0].max_shared_memory_per_block_optin
  with pytest.raises(jmf.LaunchError, match=f"over the {limit} bytes"):
    trace(kernel, smem_bytes=limit + 1)


@pytest.mark.parametrize("scalar, message", [
    (3, "Python int"),
    (2.5, "Python float"),
    (np.complex64(1), "unsupported type"),
    ("x", "unsupported type"),
])
def test_unsupported_scalars(kernel, scalar, message):
  with pytest.raises(jmf.LaunchError, match=message):
    trace(kernel, scalars=(scalar,))


def test_a_jax_array_as_a_scalar_is_refused(kernel):
  with pytest.raises(jmf.LaunchError, match="scalars are baked into the launch"):
    jmf.mosaic_kernel(kernel, X, grid=4, block=256, scalars=(jnp.int32(3),))


def test_the_kernel_signature_is_checked_against_the_call(kernel):
  with pytest.raises(jmf.LaunchError, match=r"takes 4 parameters of \[8, 8, 8, 4\] bytes, but the call passes 4"):
    trace(kernel, scalars=(np.int64(1024),))
  with pytest.raises(jmf.LaunchError, match="passes 3"):
    trace(kernel, scalars=())


@pytest.mark.parametrize("aliases, message", [
    ({2: 0}, "key 2 is not an input index"),
    ({0: 1}, "value 1 is not an output index"),
])
def test_aliases_out_of_range(kernel, aliases, message):
  with pytest.raises(jmf.LaunchError, match=message):
    trace(kernel, input_output_aliases=aliases)


def test_aliases_of_mismatched_type(kernel):
  ints = jax.ShapeDtypeStruct((1024,), jnp.int32)
  with pytest.raises(jmf.LaunchError, match="cannot alias output 0"):
    trace(kernel, inputs=(X, ints), input_output_aliases={1: 0})


def test_param_order_must_name_everything_once(kernel):
  with pytest.raises(jmf.LaunchError, match="names nothing"):
    trace(kernel, param_order=("in0", "in1", "out0", "bogus"))
  with pytest.raises(jmf.LaunchError, match="missing: \\['scalar0'\\]"):
    trace(kernel, param_order=("in0", "in1", "out0", "out0"))


def test_not_a_kernel():
  with pytest.raises(TypeError, match="needs a Kernel"):
    jmf.mosaic_kernel("add", X, grid=1, block=1)
