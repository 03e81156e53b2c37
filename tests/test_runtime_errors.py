"""Launch failures on a GPU are errors naming the kernel and the fix, never a crash."""

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

import fresh_process
import kernel_sources

pytestmark = pytest.mark.gpu


def f32(rng, *shape):
  return rng.standard_normal(shape).astype(np.float32)


def _still_works(rng):
  n = 512
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=2, block=256,
                          scalars=(np.int32(n),))
  a, b = f32(rng, n), f32(rng, n)
  np.testing.assert_array_equal(np.asarray(jax.jit(add)(a, b)), a + b)


STATIC_SMEM = r'''
extern "C" __global__ void uses_smem(float* out) {
  __shared__ float fixed[2048];
  extern __shared__ float dynamic[];
  fixed[threadIdx.x] = 1.0f; dynamic[threadIdx.x] = 2.0f;
  __syncthreads();
  out[threadIdx.x] = fixed[threadIdx.x] + dynamic[threadIdx.x];
}
'''


def test_too_much_shared_memory_is_an_error_not_a_crash(rng, isolated_disk_cache):
  from jax_mosaic_ffi.base import gpu_info
  limit = gpu_info.visible_gpus()[0].max_shared_memory_per_block_optin
  kernel = jmf.cuda_kernel(STATIC_SMEM, "uses_smem")
  # Dynamic alone fits, but with 8 KiB of static shared memory it does not.
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((128,), jnp.float32), grid=1, block=128,
                           smem_bytes=limit)
  with pytest.raises(Exception, match=r"uses_smem.*shared memory.*lower smem_bytes") as info:
    jax.block_until_ready(jax.jit(call)())
  assert "test_runtime_errors.py" in str(info.value)  # the call site
  _still_works(rng)


def largest_cluster(kernel, block: int, smem_bytes: int) -> int:
  """What the driver says the largest cluster of this kernel and launch is."""
  from cuda.bindings import driver
  driver.cuInit(0)
  _, device = driver.cuDeviceGet(0)
  _, context = driver.cuDevicePrimaryCtxRetain(device)
  driver.cuCtxPushCurrent(context)
  try:
    _, module = driver.cuModuleLoadData(kernel.images[0].data)
    _, function = driver.cuModuleGetFunction(module, kernel.symbol.encode())
    attribute = driver.CUfunction_attribute
    driver.cuFuncSetAttribute(function, attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes)
    driver.cuFuncSetAttribute(function, attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 64, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = smem_bytes
    err, size = driver.cuOccupancyMaxPotentialClusterSize(function, config)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    driver.cuModuleUnload(module)
    return size
  finally:
    driver.cuCtxPopCurrent()


def test_an_invalid_cluster_reports_the_largest_that_fits(rng, isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.BIG_SMEM, "reverse_in_smem")
  per_block = 48 * 1024  # 192 KiB of shared memory and 1024 threads: one block fills an SM
  largest = largest_cluster(kernel, 1024, per_block * 4)
  if largest >= 16:
    pytest.skip(f"this GPU fits clusters of {largest} such blocks: none within the contract's 16 fails")
  blocks = largest + 1
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((blocks * per_block,), jnp.float32), grid=blocks,
                           block=1024, smem_bytes=per_block * 4, cluster=(blocks, 1, 1),
                           scalars=(np.int32(per_block),))
  with pytest.raises(Exception, match=rf"reverse_in_smem.*cluster \({blocks}, 1, 1\).*largest cluster.* is "
                                      rf"{largest} blocks") as info:
    jax.block_until_ready(jax.jit(call)(jnp.zeros(blocks * per_block, jnp.float32)))
  print(info.value)
  _still_works(rng)


def test_a_missing_symbol_in_a_cubin_names_the_kernel(rng, isolated_disk_cache):
  compiled = jmf.cuda_kernel(kernel_sources.ADD, "add")
  cubin = compiled.images[0]
  wrong = jmf.cubin_kernel({cubin.arch.sm: cubin.data}, "not_add")
  call = jmf.mosaic_kernel(wrong, jax.ShapeDtypeStruct((256,), jnp.float32), grid=1, block=256,
                           scalars=(np.int32(256),))
  with pytest.raises(Exception, match="no kernel named 'not_add'"):
    jax.block_until_ready(jax.jit(call)(jnp.zeros(256), jnp.zeros(256)))
  _still_works(rng)


def test_a_cubin_with_the_wrong_signature_is_caught_at_load(rng, isolated_disk_cache):
  compiled = jmf.cuda_kernel(kernel_sources.ADD, "add")
  cubin = compiled.images[0]
  kernel = jmf.cubin_kernel({cubin.arch.sm: cubin.data}, "add")
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((256,), jnp.float32), grid=1, block=256)
  with pytest.raises(Exception, match=r"takes 4 parameters of \[8, 8, 8, 4\] bytes, but the call passes 3"):
    jax.block_until_ready(jax.jit(call)(jnp.zeros(256), jnp.zeros(256)))
  _still_works(rng)


class _DLDevice(ctypes.Structure):
  _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
  _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
  _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
              ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
              ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
  _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DevicePointerView:
  """A float32 vector at an arbitrary device address, offered to jax through DLPack.

  The way a buffer from another library (or a view into one) reaches jax;
  made by hand so that no such library is needed. `owner` keeps the memory alive.
  """

  def __init__(self, address: int, n: int, owner):
    self.owner = owner
    self.shape = (ctypes.c_int64 * 1)(n)
    self.managed = _DLManagedTensor(_DLTensor(address, _DLDevice(2, 0), 1, _DLDataType(2, 32, 1),  # kDLCUDA, f32
                                              self.shape, None, 0), None, None)

  def __dlpack_device__(self):
    return (2, 0)

  def __dlpack__(self, **_):
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(self.managed), b"dltensor", None)


def test_an_unaligned_buffer_is_refused(rng, isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.INCREMENT, "increment")
  n = 1000
  base = jax.device_put(f32(rng, n + 16), jax.devices("cuda")[0])
  # 64 bytes past the start of a jax buffer: XLA itself accepts 16-byte alignment.
  x = jax.dlpack.from_dlpack(DevicePointerView(base.unsafe_buffer_pointer() + 64, n, base))
  if x.unsafe_buffer_pointer() % 256 == 0:
    pytest.skip("this jax copies an unaligned DLPack view to an aligned buffer, so none can reach a kernel")
  np.testing.assert_array_equal(np.asarray(x), np.asarray(base)[16:])  # the view is what it claims to be
  inc = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=4, block=256,
                          scalars=(np.int32(n),))
  with pytest.raises(jax.errors.JaxRuntimeError, match="input 0 is at address .* not 256-byte aligned"):
    jax.block_until_ready(jax.jit(inc)(x))
  _still_works(rng)


FAULT = '''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    source = r"""
    extern "C" __global__ void faulty(const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] = x[i];
      if (i == n / 2) __trap();
    }
    """
    n = 4096
    call = jmf.mosaic_kernel(jmf.cuda_kernel(source, "faulty"), jax.ShapeDtypeStruct((n,), jnp.float32),
                             grid=n // 256, block=256, scalars=(np.int32(n),))
    try:
      jax.block_until_ready(jax.jit(call)(jnp.ones(n, jnp.float32)))
      print(json.dumps({"error": None}))
    except Exception as e:
      print(json.dumps({"error": str(e)}))
'''


def test_a_device_fault_names_the_kernel_with_the_debug_switch(tmp_path):
  # A fault leaves the CUDA context unusable: only a fresh process can show it.
  finished = fresh_process.run(FAULT, cwd=tmp_path, env={
      "JAX_MOSAIC_FFI_SYNC_LAUNCHES": "1", "XLA_FLAGS": "--xla_gpu_enable_command_buffer=",
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}, check=False)
  error = finished.result["error"]
  print(error)
  assert error is not None
  assert "mosaic_kernel 'faulty' at <string>" in error
  assert "failed while running on device 0" in error
  assert "compute-sanitizer" in error
