"""TMA descriptors as kernel parameters (jmf.TensorMap), the scratch buffer, and the Hopper GEMM.

CPU: the declarations, their lowering to the contract's attributes, and the
trace-time errors. GPU: TMA kernels against numpy on fresh random inputs
(outputs poisoned first, conftest), descriptors rebuilt when a buffer moves,
with command buffers on and off, the scratch zeroed, and the GEMM against
jnp on bf16 inputs.
"""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core

import fresh_process
from hlo_inspect import custom_calls, lower
from kernel_sources import TMA_AFFINE as AFFINE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEMM_SOURCE = os.path.join(REPO, "benchmarks", "kernels", "hopper_gemm.cu")

# The sum of a 2-D float32 array: each block TMA-loads a tile and adds its
# sum into scratch[0]; the last block to finish (a counter in scratch[1])
# writes the total. Right only if the scratch starts zeroed on every call.
# The descriptor sits after a pointer (at parameter offset 64).
SUM = r'''
#include <jax_mosaic_ffi/tma.cuh>
extern "C" __global__ void tma_sum(float* out, const __grid_constant__ jmf::TensorMap in_map, float* scratch) {
  __shared__ alignas(128) float tile[32 * 32];
  __shared__ alignas(8) unsigned long long bar;
  __shared__ float partial[4];
  if (threadIdx.x == 0) {
    jmf::mbarrier_init(&bar, 1);
    jmf::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    jmf::mbarrier_arrive_expect_tx(&bar, sizeof(tile));
    jmf::tma_load_2d(tile, &in_map, blockIdx.x * 32, blockIdx.y * 32, &bar);
  }
  jmf::mbarrier_wait(&bar, 0);
  float v = 0.0f;
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) v += tile[i];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(&scratch[0], partial[0] + partial[1] + partial[2] + partial[3]);
    __threadfence();
    const unsigned done = atomicAdd(reinterpret_cast<unsigned*>(&scratch[1]), 1u);
    if (done == gridDim.x * gridDim.y - 1) {
      __threadfence();
      out[0] = atomicAdd(&scratch[0], 0.0f);
    }
  }
}
'''


# out = x + y, both TMA-loaded, for vmap with an input shared by every element (stride 0).
ADD = r'''
#include <jax_mosaic_ffi/tma.cuh>
extern "C" __global__ void tma_add(const __grid_constant__ jmf::TensorMap x_map,
                                   const __grid_constant__ jmf::TensorMap y_map,
                                   const __grid_constant__ jmf::TensorMap out_map) {
  __shared__ alignas(1024) float xs[32 * 32];
  __shared__ alignas(1024) float ys[32 * 32];
  __shared__ alignas(8) unsigned long long bar;
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  if (threadIdx.x == 0) {
    jmf::mbarrier_init(&bar, 1);
    jmf::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    jmf::mbarrier_arrive_expect_tx(&bar, sizeof(xs) + sizeof(ys));
    jmf::tma_load_2d(xs, &x_map, c0, r0, &bar);
    jmf::tma_load_2d(ys, &y_map, c0, r0, &bar);
  }
  jmf::mbarrier_wait(&bar, 0);
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) xs[i] += ys[i];
  jmf::fence_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    jmf::tma_store_2d(&out_map, c0, r0, xs);
    jmf::tma_store_commit_and_wait();
  }
}
'''


def affine_call(kernel, a=2.0, b=1.0, swizzle=128):
  return jmf.mosaic_kernel(
      kernel, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda x: (jmf.cdiv(x.shape[1], 32), jmf.cdiv(x.shape[0], 32)), block=128,
      scalars=(np.float32(a), np.float32(b)),
      param_order=(jmf.TensorMap("in0", box=(32, 32), swizzle=swizzle),
                   jmf.TensorMap("out0", box=(32, 32), swizzle=swizzle), "scalar0", "scalar1"),
      fallback=lambda x: a * x + b)


def add_call(kernel):
  tile = dict(box=(32, 32), swizzle=128)
  return jmf.mosaic_kernel(
      kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda x, y: (jmf.cdiv(x.shape[1], 32), jmf.cdiv(x.shape[0], 32)), block=128,
      param_order=(jmf.TensorMap("in0", **tile), jmf.TensorMap("in1", **tile), jmf.TensorMap("out0", **tile)),
      fallback=lambda x, y: x + y)


def sum_call(kernel, zero=True):
  return jmf.mosaic_kernel(
      kernel, jax.ShapeDtypeStruct((1,), jnp.float32),
      grid=lambda x: (jmf.cdiv(x.shape[1], 32), jmf.cdiv(x.shape[0], 32)), block=128,
      scratch_bytes=8, zero_scratch=zero,
      param_order=("out0", jmf.TensorMap("in0", box=(32, 32)), "scratch"),
      fallback=lambda x: jnp.sum(x).reshape(1))


@pytest.fixture
def affine(isolated_disk_cache):
  return jmf.cuda_kernel(AFFINE, "tma_affine", targets=("sm_90",))


@pytest.fixture
def summed(isolated_disk_cache):
  return jmf.cuda_kernel(SUM, "tma_sum", targets=("sm_90",))


# ------------------------------------------------------------------ CPU

def test_tensor_map_lowers_to_the_contract_attributes(affine):
  x = jax.ShapeDtypeStruct((200, 72), jnp.float32)
  (cc,) = custom_calls(lower(affine_call(affine), x))
  config = cc["config"]
  code = _core.LIMITS["tensor_map_code"]
  assert config["param_order"] == [code, code + 1, -1, -2]
  maps = np.array(config["tensor_maps"]).reshape(2, _core.LIMITS["tensor_map_fields"])
  # buffer, FLOAT32, rank 2, no interleave, 128B swizzle, no L2 promotion, zero fill,
  # dims innermost first, the row stride in bytes, the box innermost first, element strides.
  head = [7, 2, 0, 3, 0, 0, 72, 200, 1, 1, 1, 72 * 4, 0, 0, 0, 32, 32, 1, 1, 1, 1, 1, 1, 1, 1]
  assert maps[0].tolist() == [0] + head
  assert maps[1].tolist() == [1] + head


def test_scratch_is_an_extra_result_the_caller_does_not_see(summed):
  x = jax.ShapeDtypeStruct((64, 96), jnp.float32)
  call = sum_call(summed)
  assert jax.eval_shape(call, x).shape == (1,)
  (cc,) = custom_calls(lower(call, x))
  assert cc["results"] == 2  # the output and the 8-byte scratch
  assert cc["config"]["zero_outputs"] == [1]
  assert cc["config"]["param_order"] == [1, _core.LIMITS["tensor_map_code"], 2]
  # Off CUDA the fallback runs, and the scratch stays out of sight there too.
  data = np.arange(64 * 96, dtype=np.float32).reshape(64, 96)
  np.testing.assert_allclose(jax.jit(call)(data), [data.sum()], rtol=1e-6)


def test_scratch_from_a_callable_and_in_the_default_order(isolated_disk_cache):
  kernel = jmf.cuda_kernel("extern \"C\" __global__ void k(const float* x, float* y, char* s, int n) {}", "k")
  call = jmf.mosaic_kernel(kernel, lambda x: x, grid=1, block=32, scalars=(np.int32(1),),
                           scratch_bytes=lambda x: x.size * 4)
  (cc,) = custom_calls(lower(call, jax.ShapeDtypeStruct((100,), jnp.float32)))
  assert cc["results"] == 2 and cc["config"]["param_order"] == [0, 1, 2, -1]
  assert "zero_outputs" not in cc["config"]


@pytest.mark.parametrize("declaration, shape, dtype, message", [
    (dict(box=(32, 64), swizzle=128), (64, 64), jnp.float32, "more than the 128-byte swizzle span"),
    (dict(box=(32, 2)), (64, 64), jnp.float32, "multiple of 16 bytes"),
    (dict(box=(32, 8)), (64, 3), jnp.float32, "stride of 12 bytes along axis 0"),
    (dict(box=(512, 32)), (1024, 64), jnp.float32, "box[1] = 512 is out of range 1..256"),
    (dict(box=(32,)), (64, 64), jnp.float32, "box has 1 sizes"),
    (dict(box=(1,) * 6), (1,) * 5 + (16,), jnp.float32, "rank 6"),
    (dict(box=(8, 16), oob_fill="nan"), (64, 64), jnp.int32, "NaN out-of-bounds fill"),
    (dict(box=(8, 16), element_strides=(9, 1)), (64, 64), jnp.float32, "element_strides[1] = 9"),
    (dict(box=(8, 16), interleave=32), (64, 64), jnp.float32, "interleaved tensor map needs rank 3"),
])
def test_driver_rules_are_trace_time_errors_naming_the_parameter(affine, declaration, shape, dtype, message):
  decl = jmf.TensorMap("in0", **declaration)
  call = jmf.mosaic_kernel(affine, lambda x: x, grid=1, block=128, scalars=(np.float32(1), np.float32(0)),
                           param_order=(decl, jmf.TensorMap("out0", box=(1, 4)), "scalar0", "scalar1"))
  with pytest.raises(jmf.LaunchError, match="TensorMap") as info:
    jax.eval_shape(call, jax.ShapeDtypeStruct(shape, dtype))
  assert message in str(info.value) and "tma_affine" in str(info.value)
  assert "TensorMap('in0'" in str(info.value)


def test_a_view_of_the_buffer_is_described_instead_of_the_array(affine):
  def view_call(shape, strides):
    return jmf.mosaic_kernel(affine, jax.ShapeDtypeStruct((100, 48), jnp.float32), grid=1, block=128,
                             scalars=(np.float32(1), np.float32(0)),
                             param_order=(jmf.TensorMap("in0", box=(32, 32), shape=shape, strides=strides),
                                          jmf.TensorMap("out0", box=(32, 32)), "scalar0", "scalar1"))

  x = jax.ShapeDtypeStruct((4, 50, 64), jnp.float32)
  (cc,) = custom_calls(lower(view_call((100, 48), (128, 1)), x))  # every other row, its first 48 floats
  record = cc["config"]["tensor_maps"][:_core.LIMITS["tensor_map_fields"]]
  assert record[:13] == [0, 7, 2, 0, 0, 0, 0, 48, 100, 1, 1, 1, 128 * 4]
  for shape, strides, message in [
      ((100, 64), (129, 1), "has a stride of 516 bytes along axis 0; TMA needs every stride to be a multiple of 16"),
      ((101, 64), (128, 1), "reaches 12864 elements, but in0 (float32[4, 50, 64]) holds 12800"),
      ((100, 64), (64, 2), "has an innermost stride of 2; TMA reads contiguous rows: make it 1"),
      ((100,), (1,), "box has 2 sizes for the view shape=[100] strides=[1]; give one per axis")]:
    with pytest.raises(jmf.LaunchError, match=re.escape(message)):
      lower(view_call(shape, strides), x)
  with pytest.raises(ValueError, match="give shape and strides together"):
    jmf.TensorMap("in0", box=(8, 8), shape=(8, 8))


def test_declaration_errors(affine):
  with pytest.raises(ValueError, match="swizzle = 100"):
    jmf.TensorMap("in0", box=(8, 8), swizzle=100)
  with pytest.raises(ValueError, match="operand must name"):
    jmf.TensorMap("x", box=(8, 8))
  with pytest.raises(TypeError, match="box must be a tuple of ints"):
    jmf.TensorMap("in0", box=(8.0, 8))
  # The driver ignores an innermost element stride without interleave: refused, not silently dropped.
  with pytest.raises(ValueError, match="round_f32_to_tf32 must be True or False, got 'no'"):
    jmf.TensorMap("in0", box=(8, 8), round_f32_to_tf32="no")  # truthy: it would read float32 as TF32
  with pytest.raises(ValueError, match="element_strides ends in 2, but without interleave"):
    jmf.TensorMap("in0", box=(8, 16), element_strides=(1, 2))
  assert jmf.TensorMap("in0", box=(8, 16), element_strides=(2, 1)).element_strides == (2, 1)
  call = jmf.mosaic_kernel(affine, lambda x: x, grid=1, block=128, scalars=(np.float32(1), np.float32(0)),
                           param_order=(jmf.TensorMap("in3", box=(32, 32)), jmf.TensorMap("out0", box=(32, 32)),
                                        "scalar0", "scalar1"))
  with pytest.raises(jmf.LaunchError, match="TensorMap of 'in3'"):
    jax.eval_shape(call, jax.ShapeDtypeStruct((64, 64), jnp.float32))
  with pytest.raises(jmf.LaunchError, match="zero_scratch=True without scratch_bytes"):
    jax.eval_shape(jmf.mosaic_kernel(affine, lambda x: x, grid=1, block=1, zero_scratch=True),
                   jax.ShapeDtypeStruct((4,), jnp.float32))


def test_a_pointer_where_the_kernel_takes_a_descriptor_is_named(affine):
  call = jmf.mosaic_kernel(affine, lambda x: x, grid=1, block=128, scalars=(np.float32(1), np.float32(0)),
                           param_order=("in0", jmf.TensorMap("out0", box=(32, 32)), "scalar0", "scalar1"))
  with pytest.raises(jmf.LaunchError, match=r"\[128, 128, 4, 4\] bytes.*in0 \(float32\[64, 64\] pointer"):
    jax.eval_shape(call, jax.ShapeDtypeStruct((64, 64), jnp.float32))


def test_vmap_of_a_tensor_map_call_is_one_call_with_descriptors_per_element(isolated_disk_cache):
  add = add_call(jmf.cuda_kernel(ADD, "tma_add", targets=("sm_90",)))
  x, y = jax.ShapeDtypeStruct((3, 200, 72), jnp.float32), jax.ShapeDtypeStruct((200, 72), jnp.float32)
  (cc,) = custom_calls(lower(jax.vmap(add, in_axes=(0, None)), x, y))
  config = cc["config"]
  element = 200 * 72 * 4
  assert config["batch_size"] == 3 and config["batch_strides"] == [element, 0, element]  # y shared: stride 0
  maps = np.array(config["tensor_maps"]).reshape(3, _core.LIMITS["tensor_map_fields"])
  assert maps[:, 0].tolist() == [0, 1, 2] and (maps[:, 7:9] == [72, 200]).all()  # each map describes an element
  # Off CUDA the fallback runs, vmapped.
  xs, ys = (np.arange(np.prod(s.shape), dtype=np.float32).reshape(s.shape) for s in (x, y))
  np.testing.assert_array_equal(jax.jit(jax.vmap(add, in_axes=(0, None)))(xs, ys), xs + ys)


def test_vmap_of_a_tensor_map_call_on_a_grid_axis_is_refused(isolated_disk_cache):
  # A kernel written for batch_grid_axis: after its own parameters, the element's grid length and the strides.
  source = r'''
  #include <jax_mosaic_ffi/tma.cuh>
  extern "C" __global__ void k(const __grid_constant__ jmf::TensorMap in_map,
                               const __grid_constant__ jmf::TensorMap out_map, float a, float b, unsigned length,
                               unsigned long long in_stride, unsigned long long out_stride) {}
  '''
  kernel = jmf.cuda_kernel(source, "k", targets=("sm_90",))
  call = jmf.mosaic_kernel(kernel, lambda x: x, grid=(2, 2), block=128, scalars=(np.float32(1), np.float32(0)),
                           param_order=(jmf.TensorMap("in0", box=(32, 32)), jmf.TensorMap("out0", box=(32, 32)),
                                        "scalar0", "scalar1"), batch_grid_axis="z")
  with pytest.raises(jmf.LaunchError, match="cannot be vmapped on a grid axis"):
    jax.eval_shape(jax.vmap(call), jax.ShapeDtypeStruct((3, 64, 64), jnp.float32))


def test_vmap_whose_elements_break_tma_alignment_is_refused_at_trace_time(isolated_disk_cache):
  source = r'''
  #include <jax_mosaic_ffi/tma.cuh>
  extern "C" __global__ void k(const __grid_constant__ jmf::TensorMap in_map, float* out) {}
  '''
  kernel = jmf.cuda_kernel(source, "k", targets=("sm_90",))
  call = jmf.mosaic_kernel(kernel, lambda x: x, grid=1, block=32,
                           param_order=(jmf.TensorMap("in0", box=(8,)), "out0"))
  jax.eval_shape(call, jax.ShapeDtypeStruct((5,), jnp.float32))   # one array: XLA aligns its buffer
  with pytest.raises(jmf.LaunchError, match=(
      r"mosaic_kernel 'k' at .*test_tma.py:\d+ .*tensor map 0 describes buffer 0, whose batch elements are 20 bytes "
      r"apart; TMA needs each element's address 16-byte aligned: pad the element to a multiple of 16 bytes, or "
      r"loop with lax.map instead of vmap")):
    jax.eval_shape(jax.vmap(call), jax.ShapeDtypeStruct((3, 5), jnp.float32))
  jax.eval_shape(jax.vmap(call), jax.ShapeDtypeStruct((3, 8), jnp.float32))   # 32 bytes apart


def test_a_batch_past_the_descriptor_bound_is_refused_at_trace_time(affine):
  limit = _core.LIMITS["max_batched_tensor_maps"]
  with pytest.raises(jmf.LaunchError, match=f"more than {limit}; vmap over fewer elements"):
    jax.eval_shape(jax.vmap(affine_call(affine)), jax.ShapeDtypeStruct((limit // 2 + 1, 32, 32), jnp.float32))
  jax.eval_shape(jax.vmap(affine_call(affine)), jax.ShapeDtypeStruct((limit // 2, 32, 32), jnp.float32))


def _attributes(**changes):
  fields = _core.LIMITS["tensor_map_fields"]
  record = [0, 7, 2, 0, 0, 0, 0, 64, 64, 1, 1, 1, 256, 0, 0, 0, 32, 32, 1, 1, 1, 1, 1, 1, 1, 1]
  assert len(record) == fields
  attrs = {"kernel_hash": b"h" * 32, "grid": [1, 1, 1], "block": [32, 1, 1], "cluster": [1, 1, 1],
           "num_inputs": 1, "num_outputs": 1, "param_order": [_core.LIMITS["tensor_map_code"], 1],
           "tensor_maps": record}
  attrs.update(changes)
  return attrs


@pytest.mark.parametrize("changes, message", [
    (dict(tensor_maps=[0] * 25), "26 per tensor map"),
    (dict(param_order=[1]), "tensor map 0 is not named in param_order"),
    (dict(param_order=[65536, 65536]), "missing or named twice"),
    (dict(param_order=[65537, 1]), "names tensor map 1"),
    (dict(zero_outputs=[1]), "zero_outputs names output 1"),
    (dict(zero_outputs=[0, 0]), "names each once"),
    (dict(batch_size=4097, batch_strides=[256, 256]), "needs a descriptor per element and map, more than 4096"),
])
def test_the_validator_bounds_the_new_attributes(changes, message):
  with pytest.raises(ValueError, match=message):
    _core.validate_launch(_attributes(**changes), False)


def test_the_validator_bounds_every_field():
  base = _attributes()["tensor_maps"]
  for index, value, message in [(0, 2, "buffer = 2"), (1, 13, "data_type = 13"), (2, 0, "rank = 0"),
                                (3, 3, "interleave = 3"), (4, 4, "swizzle = 4"), (5, -1, "l2_promotion = -1"),
                                (6, 2, "oob_fill = 2"), (7, 0, r"dims\[0\] = 0"), (9, 2, "must be 1 past the rank"),
                                (12, 8, r"strides\[1\] = 8"), (13, 16, "must be 0 past the rank"),
                                (16, 0, r"box\[0\] = 0"), (21, 0, r"element_strides\[0\] = 0"),
                                (8, 1 << 40, "out of range 1..2"), (12, 1 << 45, "below 2\\^40")]:
    record = list(base)
    record[index] = value
    with pytest.raises(ValueError, match=message):
      _core.validate_launch(_attributes(tensor_maps=record), False)
  assert _core.validate_launch(_attributes(), False)["param_sizes"] == [128, 8]
  assert _core.validate_launch(_attributes(batch_size=4096, batch_strides=[0, 256]), False)["param_sizes"] == [128, 8]


@pytest.mark.parametrize("index, value, message", [
    (21, 2, r"element_strides\[0\] = 2, but without interleave"),  # the driver would ignore it
    (12, 128, r"strides\[1\] = 128 bytes is less than the 256 bytes of dimension 0 \(a row\)"),
    (12, 16, r"strides\[1\] = 16 bytes is less than the 256 bytes"),
])
def test_the_validator_refuses_strides_the_driver_ignores_or_that_overlap(index, value, message):
  record = list(_attributes()["tensor_maps"])
  record[index] = value
  with pytest.raises(ValueError, match=message):
    _core.validate_launch(_attributes(tensor_maps=record), False)


def test_the_validator_refuses_an_outer_stride_within_the_one_below():
  # Rank 3, 8 x 8 x 8 floats: a row is 32 bytes, a plane 256; the outer stride of 128 overlaps planes.
  record = [0, 7, 3, 0, 0, 0, 0, 8, 8, 8, 1, 1, 32, 128, 0, 0, 8, 8, 8, 1, 1, 1, 1, 1, 1, 1]
  with pytest.raises(ValueError, match=r"strides\[2\] = 128 bytes is less than the 256 bytes of dimension 1;"):
    _core.validate_launch(_attributes(tensor_maps=record), False)
  record[13] = 256
  assert _core.validate_launch(_attributes(tensor_maps=record), False)["param_sizes"] == [128, 8]


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
def test_tma_load_transform_store_matches_numpy(affine, rng):
  for shape in [(200, 72), (64, 32), (33, 40)]:
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(affine_call(affine, a=3.0, b=-0.5))(x)), 3.0 * x - 0.5,
                               rtol=1e-6, atol=1e-6)
  x = rng.standard_normal((96, 64)).astype(np.float32)  # the same without swizzle
  np.testing.assert_allclose(np.asarray(jax.jit(affine_call(affine, swizzle=None))(x)), 2 * x + 1, rtol=1e-6)


@pytest.mark.gpu
def test_descriptors_are_rebuilt_only_when_the_buffer_moves(summed, rng):
  call = jax.jit(sum_call(summed))
  xs = [rng.standard_normal((100, 96)).astype(np.float32) for _ in range(2)]
  a, b = (jax.device_put(x) for x in xs)
  np.testing.assert_allclose(np.asarray(call(a)), [xs[0].sum()], rtol=1e-4, atol=1e-3)  # compiles, encodes
  before = jmf.kernel_cache_stats().tensor_map_encodes
  for _ in range(5):  # the same input buffer: the descriptor is reused, and the scratch zeroed each time
    np.testing.assert_allclose(np.asarray(call(a)), [xs[0].sum()], rtol=1e-4, atol=1e-3)
  assert jmf.kernel_cache_stats().tensor_map_encodes == before
  np.testing.assert_allclose(np.asarray(call(b)), [xs[1].sum()], rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(np.asarray(call(a)), [xs[0].sum()], rtol=1e-4, atol=1e-3)
  assert jmf.kernel_cache_stats().tensor_map_encodes == before + 2


# Reports the first scratch word it finds, and that it ran (the output starts poisoned).
PEEK_SCRATCH = r'''
extern "C" __global__ void peek_scratch(const float* x, unsigned* out, unsigned* scratch) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    out[0] = scratch[0];
    out[1] = 1u;
    scratch[0] = 12345u;  // what a next call would find if nothing reset it
  }
}
'''


@pytest.mark.gpu
def test_scratch_is_zeroed_only_when_asked(isolated_disk_cache, monkeypatch):
  # Poisoning fills every output, the scratch included, with 0xFF bytes before
  # the launch; zeroing comes after it. So a kernel sees 0 only if zeroed.
  monkeypatch.setenv("JAX_MOSAIC_FFI_POISON_OUTPUTS", "1")
  kernel = jmf.cuda_kernel(PEEK_SCRATCH, "peek_scratch")
  x = jax.device_put(np.zeros(4, np.float32))
  for zero, seen in ((True, 0), (False, 0xFFFFFFFF)):
    call = jax.jit(jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((2,), jnp.uint32), grid=1, block=32,
                                     scratch_bytes=8, zero_scratch=zero, param_order=("in0", "out0", "scratch")))
    for _ in range(2):
      np.testing.assert_array_equal(np.asarray(call(x)), np.array([seen, 1], np.uint32))


LOOP = '''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    sys.path.insert(0, sys.argv[3])
    import test_tma as t
    affine = t.affine_call(jmf.cuda_kernel(t.AFFINE, "tma_affine", targets=("sm_90",)), a=0.5, b=1.0)
    total = t.sum_call(jmf.cuda_kernel(t.SUM, "tma_sum", targets=("sm_90",)))
    def loop(x):
      sums = []
      for _ in range(12):
        x = affine(x)
        sums.append(total(x))
      return x, jnp.concatenate(sums)
    data = np.load(sys.argv[1])
    f = jax.jit(loop)
    # Inputs alive at once sit at different addresses, and results kept alive
    # move the outputs: the recorded launches and their descriptors must follow.
    inputs = [jax.device_put(data * k) for k in (1, 2, 3, 1)]
    kept = [f(x) for x in inputs]
    np.save(sys.argv[2], np.stack([np.asarray(o[0]) for o in kept]))
    np.save(sys.argv[2] + ".sums.npy", np.stack([np.asarray(o[1]) for o in kept]))
    stats = jmf.kernel_cache_stats()
    print(json.dumps({"records": stats.records_created, "encodes": stats.tensor_map_encodes,
                      "registration": jmf.registration.status()}))
'''


@pytest.mark.gpu
@pytest.mark.parametrize("command_buffers", [True, False], ids=["cb_on", "cb_off"])
def test_descriptors_follow_moving_buffers_in_and_out_of_command_buffers(rng, tmp_path, command_buffers):
  data = rng.standard_normal((96, 80)).astype(np.float32)
  paths = [tmp_path / "x.npy", tmp_path / "out.npy"]
  np.save(paths[0], data)
  result = fresh_process.run(LOOP, *paths, os.path.dirname(os.path.abspath(__file__)), cwd=tmp_path, env={
      "XLA_FLAGS": "" if command_buffers else "--xla_gpu_enable_command_buffer=",
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  print(result)
  outs, sums = np.load(paths[1]), np.load(str(paths[1]) + ".sums.npy")
  for i, k in enumerate((1, 2, 3, 1)):
    x = data.astype(np.float64) * k
    expected_sums = []
    for _ in range(12):
      x = 0.5 * x + 1.0
      expected_sums.append(x.sum())
    np.testing.assert_allclose(outs[i], x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sums[i], expected_sums, rtol=1e-4, atol=1e-2)
  if command_buffers:
    assert result["registration"]["record"], result["registration"]
    assert result["records"] >= 24  # every launch a kernel node of the graph, none captured
  else:
    assert result["records"] == 0
  assert result["encodes"] >= 4


VMAP = '''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    sys.path.insert(0, sys.argv[3])
    import test_tma as t
    affine = jax.vmap(t.affine_call(jmf.cuda_kernel(t.AFFINE, "tma_affine", targets=("sm_90",)), a=0.5, b=1.0))
    add = jax.vmap(t.add_call(jmf.cuda_kernel(t.ADD, "tma_add", targets=("sm_90",))), in_axes=(0, None))
    def chain(x, y):  # long enough for XLA to make a command buffer of it
      sums = []
      for _ in range(6):
        x = affine(x)
        sums.append(add(x, y))
      return jnp.stack(sums)
    data = np.load(sys.argv[1])
    xs, y = data[:-1], jax.device_put(data[-1])
    f = jax.jit(chain)
    # Batches alive at once sit at different addresses: every element's descriptors must follow its buffer.
    inputs = [jax.device_put(xs * k) for k in (1, 2, 1)]
    kept = [f(x, y) for x in inputs]
    np.save(sys.argv[2], np.stack([np.asarray(o) for o in kept]))
    stats = jmf.kernel_cache_stats()
    print(json.dumps({"records": stats.records_created, "encodes": stats.tensor_map_encodes}))
'''


@pytest.mark.gpu
@pytest.mark.parametrize("command_buffers", [True, False], ids=["cb_on", "cb_off"])
def test_vmap_gives_each_element_descriptors_of_its_own(rng, tmp_path, command_buffers):
  # Five elements of odd-sized arrays (edge tiles clipped), and an input shared by all of them (stride 0).
  data = rng.standard_normal((6, 200, 72)).astype(np.float32)
  paths = [tmp_path / "x.npy", tmp_path / "out.npy"]
  np.save(paths[0], data)
  result = fresh_process.run(VMAP, *paths, os.path.dirname(os.path.abspath(__file__)), cwd=tmp_path, env={
      "XLA_FLAGS": "" if command_buffers else "--xla_gpu_enable_command_buffer=",
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  print(result)
  outs = np.load(paths[1])
  xs, y = data[:-1].astype(np.float64), data[-1].astype(np.float64)
  for i, k in enumerate((1, 2, 1)):
    x = xs * k
    for step in range(6):
      x = 0.5 * x + 1.0
      np.testing.assert_allclose(outs[i, step], x + y, rtol=1e-5, atol=1e-5, err_msg=f"input {i}, step {step}")
  assert result["encodes"] >= 5 * 4 + 1  # per element the affine's two maps and the add's two; y's once
  if command_buffers:
    assert result["records"] >= 12 * 5  # every element's launch a kernel node of the graph
  else:
    assert result["records"] == 0


def gemm_call(stages=4, cluster=1):
  kernel = jmf.cuda_kernel(open(GEMM_SOURCE).read(), "hopper_gemm", targets=("sm_90a",),
                           options=(f"-DSTAGES={stages}", f"-DCLUSTER_M={cluster}"))
  smem = stages * (128 + 256) * 64 * 2 + 1024 + 1024
  return jmf.mosaic_kernel(
      kernel, lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[0]), jnp.bfloat16),
      grid=lambda a, b: (a.shape[0] // 128) * (b.shape[0] // 256), block=384, smem_bytes=smem,
      cluster=(cluster, 1, 1),
      scalars=lambda a, b: (np.int32(a.shape[0]), np.int32(b.shape[0]), np.int32(a.shape[1])),
      param_order=(jmf.TensorMap("in0", box=(128, 64), swizzle=128, l2_promotion=256),
                   jmf.TensorMap("in1", box=(256 // cluster, 64), swizzle=128, l2_promotion=256),
                   "out0", "scalar0", "scalar1", "scalar2"))


def test_the_gemm_compiles_for_sm90a_and_takes_two_descriptors(isolated_disk_cache):
  kernel = jmf.cuda_kernel(open(GEMM_SOURCE).read(), "hopper_gemm", targets=("sm_90a",))
  assert kernel.param_sizes == (128, 128, 8, 4, 4, 4)
  a = jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16)
  b = jax.ShapeDtypeStruct((768, 1024), jnp.bfloat16)
  assert jax.eval_shape(gemm_call(), a, b).shape == (512, 768)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [1, 2], ids=["one_cta", "cluster2_multicast"])
def test_hopper_gemm_matches_jnp(isolated_disk_cache, rng, cluster):
  gemm = jax.jit(gemm_call(cluster=cluster))
  for m, n, k in [(512, 768, 1024), (128 * cluster, 256, 64), (1024, 512, 4096), (256, 256, 320)]:
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((n, k)), jnp.bfloat16)
    got = np.asarray(gemm(a, b).astype(jnp.float32))
    expected = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2 * np.abs(expected).max())


@pytest.mark.gpu
def test_the_docs_tma_example_runs(isolated_disk_cache):
  """The TMA example of docs/guides/cuda_kernels.md runs its kernel (the docs' test runs its fallback on the CPU)."""
  import re
  import textwrap
  guide = os.path.join(REPO, "docs", "guides", "cuda_kernels.md")
  section = open(guide).read().split("\n## TMA descriptors\n")[1].split("\n## ")[0]
  (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
  namespace = {"jax": jax, "jnp": jnp, "np": np, "jmf": jmf}
  exec(compile(textwrap.dedent(block), guide, "exec"), namespace)
  np.testing.assert_array_equal(np.asarray(namespace["y"]), np.full((200, 72), 3.0, np.float32))
