"""The custom-call contract, as lowered for CUDA on a machine without a GPU."""

import hashlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax._src.lib.mlir import ir

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import contract

import kernel_sources
from hlo_inspect import custom_calls, lower


@pytest.fixture
def add_kernel(isolated_disk_cache):
  return jmf.cuda_kernel(kernel_sources.ADD, "add")


def test_one_custom_call_with_every_contract_attribute(add_kernel):
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, x, grid=(4,), block=256, smem_bytes=1024, scalars=(np.int32(1000),))
  lowered = lower(call, x, x)
  (cc,) = custom_calls(lowered)
  assert cc["target"] == contract.LAUNCH_TARGET == "jax_mosaic_ffi_launch_v1"
  # StableHLO spells the typed FFI (api_version=4) as a dictionary backend
  # config; XLA's HLO shows the version itself.
  assert isinstance(cc["attributes"]["mhlo.backend_config"], ir.DictAttr)
  assert "api_version=API_VERSION_TYPED_FFI" in lowered.as_text(dialect="hlo")
  assert cc["operands"] == 2 and cc["results"] == 1
  config = cc["config"]
  assert config["module"] == add_kernel.module
  assert config["kernel_hash"] == hashlib.sha256(config["module"]).digest()
  assert len(config["kernel_hash"]) == 32
  assert config["use_custom_barrier"] is False
  assert config["uses_xla_collective_metadata"] is False
  assert config["grid"] == [4, 1, 1] and config["block"] == [256, 1, 1] and config["cluster"] == [1, 1, 1]
  assert config["smem_bytes"] == 1024 and config["uses_pdl"] is True  # PDL-safe by default
  assert config["num_inputs"] == 2
  assert config["param_order"] == [0, 1, 2, -1]
  assert config["scalar_sizes"] == [4]
  assert config["scalar_data"] == np.int32(1000).tobytes() + bytes(4)
  assert config["kernel_name"] == b"add"
  assert config["call_site"].startswith(b"test_lowering.py:")
  assert "xla_replica_ids" not in config
  layouts = [list(ir.DenseIntElementsAttr(a)) for a in ir.ArrayAttr(cc["attributes"]["operand_layouts"])]
  assert layouts == [[0], [0]]


def test_row_major_layouts_for_any_rank(add_kernel):
  for shape in [(), (7,), (3, 5), (2, 3, 4, 5)]:
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    call = jmf.mosaic_kernel(add_kernel, x, grid=1, block=1, scalars=(np.int32(1),))
    (cc,) = custom_calls(lower(call, x, x))
    result_layout = list(ir.DenseIntElementsAttr(ir.ArrayAttr(cc["attributes"]["result_layouts"])[0]))
    assert result_layout == list(reversed(range(len(shape))))


@pytest.mark.parametrize("dtype", [jnp.bool_, jnp.int8, jnp.uint8, jnp.int16, jnp.uint16, jnp.int32,
                                   jnp.uint32, jnp.int64, jnp.uint64, jnp.float16, jnp.bfloat16,
                                   jnp.float32, jnp.float64, jnp.complex64, ml_dtypes.float8_e4m3fn,
                                   ml_dtypes.float8_e5m2])
def test_every_numeric_dtype_lowers(isolated_disk_cache, dtype):
  # Byte pointers, which take arrays of any dtype (a float kernel takes float32 only: test_param_types.py).
  source = 'extern "C" __global__ void add(const void* a, const void* b, void* out, int n) {}'
  kernel = jmf.cuda_kernel(source, "add")
  jax.config.update("jax_enable_x64", True)
  try:
    x = jax.ShapeDtypeStruct((16, 4), dtype)
    call = jmf.mosaic_kernel(kernel, x, grid=1, block=64, scalars=(np.int32(64),))
    (cc,) = custom_calls(lower(call, x, x))
    assert cc["results"] == 1
  finally:
    jax.config.update("jax_enable_x64", False)


def test_aliases_become_operand_output_aliases(add_kernel):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, x, grid=1, block=256, scalars=(np.int32(256),),
                           input_output_aliases={1: 0})
  text = lower(call, x, x).as_text()
  assert "output_operand_aliases" in text and "operand_index = 1" in text


def test_explicit_param_order(add_kernel):
  x = jax.ShapeDtypeStruct((8,), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, x, grid=1, block=8, scalars=(np.int32(8),),
                           param_order=("in1", "in0", "out0", "scalar0"))
  (cc,) = custom_calls(lower(call, x, x))
  assert cc["config"]["param_order"] == [1, 0, 2, -1]


def test_zero_size_outputs_launch_nothing(add_kernel):
  x = jax.ShapeDtypeStruct((0, 3), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, x, grid=1, block=1, scalars=(np.int32(0),))
  assert custom_calls(lower(call, x, x)) == []
  out = jax.jit(call)(jnp.zeros((0, 3)), jnp.zeros((0, 3)))
  assert out.shape == (0, 3)


def test_several_outputs(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.SUM_AND_PRODUCT, "sum_and_product")
  x = jax.ShapeDtypeStruct((64,), jnp.float32)
  call = jmf.mosaic_kernel(kernel, (x, x), grid=1, block=64, scalars=(np.int32(64),))
  (cc,) = custom_calls(lower(call, x, x))
  assert cc["results"] == 2 and cc["config"]["param_order"] == [0, 1, 2, 3, -1]


def test_lowering_for_the_cpu_names_the_problem(add_kernel):
  x = jax.ShapeDtypeStruct((8,), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, x, grid=1, block=8, scalars=(np.int32(8),))
  with pytest.raises(NotImplementedError, match="runs only on CUDA GPUs"):
    jax.jit(call).trace(x, x).lower(lowering_platforms=("cpu",))
