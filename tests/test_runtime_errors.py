"""Launch failures on a GPU are errors naming the kernel and the fix, never a crash."""

import re

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


UNALIGNED = '''
    import json
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    import kernel_sources
    from dlpack_view import DevicePointerView
    n = 1000
    rng = np.random.default_rng()
    base = jax.device_put(rng.standard_normal(n + 16).astype(np.float32), jax.devices("cuda")[0])
    # 64 bytes past the start of a jax buffer: XLA itself accepts 16-byte alignment.
    view = DevicePointerView(base.unsafe_buffer_pointer() + 64, n, base)
    x = jax.dlpack.from_dlpack(view)
    report = {"address": x.unsafe_buffer_pointer(),
              "view_is_right": bool((np.asarray(x) == np.asarray(base)[16:]).all())}
    inc = jmf.mosaic_kernel(jmf.cuda_kernel(kernel_sources.INCREMENT, "increment"),
                            jax.ShapeDtypeStruct((n,), jnp.float32), grid=4, block=256, scalars=(np.int32(n),))
    try:
      jax.block_until_ready(jax.jit(inc)(x))
      report["error"] = None
    except jax.errors.JaxRuntimeError as e:
      report["error"] = str(e)
    a = rng.standard_normal(n).astype(np.float32)
    report["still_works"] = bool((np.asarray(jax.jit(inc)(a)) == a + 1).all())
    del x  # before the view it reads at its end
    print(json.dumps(report))
'''


def test_an_unaligned_buffer_is_refused(tmp_path):
  # A child process: the view is made by hand, and whatever goes wrong with it must not take the suite down.
  finished = fresh_process.run(UNALIGNED, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")})
  report = finished.result
  if report["address"] % 256 == 0:
    pytest.skip("this jax copies an unaligned DLPack view to an aligned buffer, so none can reach a kernel")
  assert report["view_is_right"]  # the view is what it claims to be
  assert report["error"] is not None and re.search("input 0 is at address .* not 256-byte aligned", report["error"])
  assert report["still_works"]


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
