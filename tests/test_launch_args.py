"""The arguments of mosaic_kernel: shape-generic forms, and wrong use failing at trace
time with a message that names the problem (no GPU needed)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info

import kernel_sources
from hlo_inspect import custom_calls

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
    # Values that were once silently coerced, or crashed with a raw error.
    (dict(grid="12"), "grid must be an int or a tuple"),
    (dict(grid=(1.9,)), r"grid\[0\] must be an integer, got 1.9"),
    (dict(grid=float("inf")), "grid must be an int or a tuple"),
    (dict(grid=(float("nan"),)), r"grid\[0\] must be an integer"),
    (dict(grid=(True,)), r"grid\[0\] must be an integer"),
    (dict(smem_bytes=1.5), "smem_bytes must be an integer, got 1.5"),
    (dict(smem_bytes=2**31), "smem_bytes = 2147483648 is out of range"),
    (dict(smem_bytes=2**80), "smem_bytes = .* is out of range"),
    (dict(scalars=np.int32(5)), r"scalars must be a tuple of numpy scalars.*scalars=\(np.int32\(n\),\)"),
    (dict(scalars="abc"), "scalars must be a tuple"),
    (dict(uses_pdl="yes"), "uses_pdl must be True, False or None"),
    (dict(param_order="in0"), "param_order must be a sequence of names"),
    (dict(input_output_aliases=[(0, 0)]), "input_output_aliases must be a dict"),
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
  # Its types known (NVRTC), a wrong width is named by parameter; by size alone (PTX), by the sizes.
  with pytest.raises(jmf.LaunchError, match=r"parameter 3 is 'int', but the call passes scalars\[0\], an int64"):
    trace(kernel, scalars=(np.int64(1024),))
  (ptx,) = [i.data for i in kernel.images if i.kind.name == "PTX"]
  sized = jmf.ptx_kernel(ptx, "add")
  with pytest.raises(jmf.LaunchError, match=r"takes 4 parameters of \[8, 8, 8, 4\] bytes, but the call passes 4"):
    trace(sized, scalars=(np.int64(1024),))
  for k in (kernel, sized):
    with pytest.raises(jmf.LaunchError, match="passes 3"):
      trace(k, scalars=())


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


@pytest.mark.parametrize("out, message", [
    ("abc", "out_shape must be a jax.ShapeDtypeStruct"),
    (jax.ShapeDtypeStruct((-1,), jnp.float32), "negative dimension"),
    ((X, "abc"), r"out_shape\[1\] must be a jax.ShapeDtypeStruct"),
    ((), "at least one output"),
])
def test_bad_out_shapes(kernel, out, message):
  with pytest.raises(jmf.LaunchError, match=message):
    trace(kernel, out=out)


def test_kernel_names_with_control_characters_are_refused():
  with pytest.raises(ValueError, match="control characters"):
    jmf.cuda_kernel(kernel_sources.ADD, "add\0evil")
  with pytest.raises(ValueError, match="control characters"):
    jmf.cubin_kernel({"sm_90": b"\x7fELF"}, "a\nb")


@pytest.mark.parametrize("arch", ["sm_0", "sm_99999", "sm_90x", 5, "compute_1000"])
def test_cubin_archs_the_runtime_cannot_load_are_refused_on_any_machine(arch):
  # Both readers of the module once disagreed: these lowered on a CPU and failed only on a GPU.
  with pytest.raises(ValueError, match="architecture"):
    jmf.cubin_kernel({arch: b"\x7fELF" + bytes(64)}, "k")


def test_not_a_kernel():
  with pytest.raises(TypeError, match="needs a kernel from cuda_kernel"):
    jmf.mosaic_kernel("add", X, grid=1, block=1)


# ------------------------------------------------ shape-generic wrappers

def test_launch_parameters_as_callables_of_the_input_avals(kernel):
  add = jmf.mosaic_kernel(
      kernel, lambda a, b: jax.ShapeDtypeStruct(a.shape, a.dtype),
      grid=lambda a, b: jmf.cdiv(a.size, 256), block=256,
      scalars=lambda a, b: (np.int32(a.size),))
  for n in (256, 1000, 70_000):
    x = jax.ShapeDtypeStruct((n,), jnp.float32)
    (cc,) = custom_calls(jax.jit(add).trace(x, x).lower(lowering_platforms=("cuda",)))
    assert cc["config"]["grid"] == [jmf.cdiv(n, 256), 1, 1]
    assert cc["config"]["scalar_data"][:4] == np.int32(n).tobytes()
    assert jax.jit(add).trace(x, x).out_info.shape == (n,)


def test_each_shape_is_checked_as_a_fixed_call_would_be(kernel):
  add = jmf.mosaic_kernel(kernel, lambda a, b: a, grid=lambda a, b: a.size // 256, block=256,
                          scalars=lambda a, b: (np.int32(a.size),))
  x = jax.ShapeDtypeStruct((100,), jnp.float32)  # 100 // 256 == 0 blocks
  with pytest.raises(jmf.LaunchError, match=r"grid\[0\] = 0 is out of range"):
    jax.jit(add).trace(x, x)


def test_a_callable_that_raises_is_named(kernel):
  add = jmf.mosaic_kernel(kernel, X, grid=lambda a, b: 1 // 0, block=256, scalars=(np.int32(1),))
  with pytest.raises(jmf.LaunchError, match="grid, a callable of the input avals, raised ZeroDivisionError"):
    jax.jit(add).trace(X, X)


def test_cdiv():
  assert [jmf.cdiv(n, 256) for n in (0, 1, 255, 256, 257)] == [0, 1, 1, 1, 2]


# ------------------------------------------------------- in-place pairs

INPLACE = r'''
extern "C" __global__ void scale_in_place(float* x, const float* s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s[i];
}
'''


def test_param_order_may_name_either_member_of_an_aliased_pair(isolated_disk_cache):
  kernel = jmf.cuda_kernel(INPLACE, "scale_in_place")
  for name in ("in0", "out0"):
    call = jmf.mosaic_kernel(kernel, X, grid=4, block=256, scalars=(np.int32(1024),),
                             input_output_aliases={0: 0}, param_order=(name, "in1", "scalar0"))
    (cc,) = custom_calls(jax.jit(call).trace(X, X).lower(lowering_platforms=("cuda",)))
    assert cc["config"]["param_order"] == [0 if name == "in0" else 2, 1, -1]
    assert cc["config"]["num_inputs"] == 2 and cc["config"]["num_outputs"] == 1


def test_param_order_that_names_neither_member_of_a_pair_is_refused(isolated_disk_cache):
  kernel = jmf.cuda_kernel(INPLACE, "scale_in_place")
  call = jmf.mosaic_kernel(kernel, X, grid=4, block=256, scalars=(np.int32(1024),),
                           input_output_aliases={0: 0}, param_order=("in1", "scalar0"))
  with pytest.raises(jmf.LaunchError, match=r"aliased pairs named by neither member: \['in0 / out0'\]"):
    jax.jit(call).trace(X, X)


def test_without_aliases_every_buffer_must_be_named(isolated_disk_cache):
  kernel = jmf.cuda_kernel(INPLACE, "scale_in_place")
  call = jmf.mosaic_kernel(kernel, X, grid=4, block=256, scalars=(np.int32(1024),),
                           param_order=("in0", "in1", "scalar0"))
  with pytest.raises(jmf.LaunchError, match=r"missing: \['out0'\]"):
    jax.jit(call).trace(X, X)
