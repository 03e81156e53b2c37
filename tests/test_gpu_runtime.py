"""The runtime on a real GPU: launches, features, caches, command buffers, errors.

Inputs are fresh random arrays; outputs are poisoned (conftest.py) so an
element a kernel did not write cannot match the reference.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

import kernel_sources

pytestmark = pytest.mark.gpu


def f32(rng, *shape):
  return rng.standard_normal(shape).astype(np.float32)


def test_elementwise_add(rng, isolated_disk_cache):
  n = 100_003
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=(n + 255) // 256,
                          block=256, scalars=(np.int32(n),))
  a, b = f32(rng, n), f32(rng, n)
  np.testing.assert_array_equal(np.asarray(jax.jit(add)(a, b)), a + b)


def test_reduction(rng, isolated_disk_cache):
  n, block = 1 << 20, 256
  kernel = jmf.cuda_kernel(kernel_sources.SUM, "block_sum")
  partial = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n // block,), jnp.float32), grid=n // block,
                              block=block, scalars=(np.int32(n),))
  x = f32(rng, n)
  total = jax.jit(lambda x: partial(x).sum())(x)
  np.testing.assert_allclose(float(total), x.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)


def test_several_outputs(rng, isolated_disk_cache):
  n = 4096
  kernel = jmf.cuda_kernel(kernel_sources.SUM_AND_PRODUCT, "sum_and_product")
  out = jax.ShapeDtypeStruct((n,), jnp.float32)
  call = jmf.mosaic_kernel(kernel, (out, out), grid=n // 128, block=128, scalars=(np.int32(n),))
  a, b = f32(rng, n), f32(rng, n)
  s, p = jax.jit(call)(a, b)
  np.testing.assert_array_equal(np.asarray(s), a + b)
  np.testing.assert_array_equal(np.asarray(p), a * b)


@pytest.mark.parametrize("ctype, dtype", [
    ("float", np.float32), ("double", np.float64), ("__half", np.float16),
    ("__nv_bfloat16", ml_dtypes.bfloat16), ("int", np.int32), ("signed char", np.int8),
    ("unsigned char", np.uint8), ("long long", np.int64)])
def test_dtypes_through_a_cpp_template(rng, isolated_disk_cache, ctype, dtype):
  kernel = jmf.cuda_kernel(kernel_sources.AXPB, f"ops::axpb<{ctype}>")
  n = 5000
  with jax.enable_x64(dtype in (np.float64, np.int64)):
    call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), dtype), grid=(n + 127) // 128, block=128,
                             scalars=(np.int64(n),))
    if np.issubdtype(dtype, np.integer):
      info = np.iinfo(dtype)
      x = rng.integers(max(info.min, -50), min(info.max, 50) // 2, size=n).astype(dtype)
    else:
      x = rng.standard_normal(n).astype(dtype)
    y = np.asarray(jax.jit(call)(x))
  expected = (x.astype(np.float32) * 2 + 1).astype(dtype)
  np.testing.assert_array_equal(y, expected)


SCALARS = r'''
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void scalars(double* out, signed char a, short b, int c, long long d,
                                   unsigned char e, unsigned short f, unsigned int g, unsigned long long h,
                                   __half i, __nv_bfloat16 j, float k, double l, bool m) {
  out[0] = a; out[1] = b; out[2] = c; out[3] = (double)d; out[4] = e; out[5] = f; out[6] = g;
  out[7] = (double)h; out[8] = __half2float(i); out[9] = __bfloat162float(j); out[10] = k; out[11] = l;
  out[12] = m ? 1.0 : 0.0;
}
'''


def test_scalars_of_every_supported_type(rng, isolated_disk_cache):
  kernel = jmf.cuda_kernel(SCALARS, "scalars")
  values = (np.int8(rng.integers(-128, 127)), np.int16(rng.integers(-3000, 3000)),
            np.int32(rng.integers(-2**31, 2**31 - 1)), np.int64(rng.integers(-2**40, 2**40)),
            np.uint8(rng.integers(0, 255)), np.uint16(rng.integers(0, 65535)),
            np.uint32(rng.integers(0, 2**32 - 1)), np.uint64(rng.integers(0, 2**40)),
            np.float16(rng.standard_normal()), ml_dtypes.bfloat16(rng.standard_normal()),
            np.float32(rng.standard_normal()), np.float64(rng.standard_normal()), True)
  with jax.enable_x64(True):
    call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((13,), jnp.float64), grid=1, block=1, scalars=values)
    out = np.asarray(jax.jit(call)())
  np.testing.assert_array_equal(out, np.array([float(v) for v in values]))


INCREMENT = r'''
extern "C" __global__ void increment(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
}
'''


def test_in_place_update_through_aliases(rng, isolated_disk_cache):
  n = 1 << 16
  kernel = jmf.cuda_kernel(INCREMENT, "increment")
  inc = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=n // 256, block=256,
                          scalars=(np.int32(n),), input_output_aliases={0: 0})
  x = f32(rng, n)
  y = jax.jit(inc, donate_argnums=0)(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(y), x + 1)
  z = jax.jit(lambda v: inc(inc(inc(v))))(x)
  np.testing.assert_array_equal(np.asarray(z), ((x + 1) + 1) + 1)


def test_zero_size_arrays_do_not_launch(isolated_disk_cache):
  kernel = jmf.cuda_kernel(INCREMENT, "increment")
  before = jmf.kernel_cache_stats()
  inc = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((0,), jnp.float32), grid=1, block=1,
                          scalars=(np.int32(0),))
  out = jax.jit(inc)(jnp.zeros((0,), jnp.float32))
  assert out.shape == (0,)
  assert jmf.kernel_cache_stats().module_loads == before.module_loads


INDEX_3D = r'''
extern "C" __global__ void index3d(int* out, int nx, int ny, int nz) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z * blockDim.z + threadIdx.z;
  if (x < nx && y < ny && z < nz) out[(z * ny + y) * nx + x] = (z * ny + y) * nx + x;
}
'''


@pytest.mark.parametrize("grid, block, shape", [
    ((3, 5), (32, 8), (1, 40, 96)),
    ((2, 3, 4), (16, 4, 2), (8, 12, 32)),
])
def test_2d_and_3d_grids_and_blocks(isolated_disk_cache, grid, block, shape):
  kernel = jmf.cuda_kernel(INDEX_3D, "index3d")
  nz, ny, nx = shape
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(shape, jnp.int32), grid=grid, block=block,
                           scalars=(np.int32(nx), np.int32(ny), np.int32(nz)))
  np.testing.assert_array_equal(np.asarray(jax.jit(call)()), np.arange(nx * ny * nz).reshape(shape))


BIG_SMEM = r'''
extern "C" __global__ void reverse_in_smem(const float* in, float* out, int per_block) {
  extern __shared__ float tile[];
  const float* src = in + blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) tile[i] = src[i];
  __syncthreads();
  for (int i = threadIdx.x; i < per_block; i += blockDim.x)
    out[blockIdx.x * per_block + i] = tile[per_block - 1 - i];
}
'''


def test_dynamic_shared_memory_above_48_kib(rng, isolated_disk_cache):
  per_block = 48 * 1024  # 192 KiB of floats
  blocks = 8
  kernel = jmf.cuda_kernel(BIG_SMEM, "reverse_in_smem")
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((blocks * per_block,), jnp.float32), grid=blocks,
                           block=512, smem_bytes=per_block * 4, scalars=(np.int32(per_block),))
  x = f32(rng, blocks * per_block)
  expected = x.reshape(blocks, per_block)[:, ::-1].reshape(-1)
  np.testing.assert_array_equal(np.asarray(jax.jit(call)(x)), expected)


CLUSTER = r'''
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void __cluster_dims__(2, 1, 1) swap_in_cluster(const float* in, float* out) {
  __shared__ float mine[256];
  cg::cluster_group cluster = cg::this_cluster();
  mine[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
  cluster.sync();
  unsigned int other = cluster.block_rank() ^ 1;
  float* theirs = cluster.map_shared_rank(mine, other);
  out[blockIdx.x * 256 + threadIdx.x] = theirs[threadIdx.x];
  cluster.sync();
}
'''


def test_thread_block_cluster_with_distributed_shared_memory(rng, isolated_disk_cache):
  blocks = 16
  kernel = jmf.cuda_kernel(CLUSTER, "swap_in_cluster")
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((blocks * 256,), jnp.float32), grid=blocks, block=256,
                           cluster=(2, 1, 1))
  x = f32(rng, blocks * 256)
  expected = x.reshape(blocks // 2, 2, 256)[:, ::-1].reshape(-1)
  np.testing.assert_array_equal(np.asarray(jax.jit(call)(x)), expected)


PDL = r'''
extern "C" __global__ void produce(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * 3.0f;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
extern "C" __global__ void consume(const float* y, float* z, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = y[i] + 1.0f;
}
'''


def test_programmatic_dependent_launch_pair(rng, isolated_disk_cache):
  n = 1 << 20
  out = jax.ShapeDtypeStruct((n,), jnp.float32)
  produce = jmf.mosaic_kernel(jmf.cuda_kernel(PDL, "produce"), out, grid=n // 256, block=256,
                              scalars=(np.int32(n),))
  consume = jmf.mosaic_kernel(jmf.cuda_kernel(PDL, "consume"), out, grid=n // 256, block=256,
                              scalars=(np.int32(n),), uses_pdl=True)
  x = f32(rng, n)
  z = jax.jit(lambda x: consume(produce(x)))(x)
  np.testing.assert_array_equal(np.asarray(z), x * 3 + 1)


def test_eight_call_sites_compile_once_and_a_new_jit_compiles_nothing(rng, isolated_disk_cache):
  n = 1024
  source = kernel_sources.ADD.replace("a[i] + b[i]", "a[i] + b[i] + 0.5f")  # a kernel no other test uses
  jmf.clear_kernel_cache()
  before = jmf.kernel_cache_stats()
  kernel = jmf.cuda_kernel(source, "add")
  add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=n // 256, block=256,
                          scalars=(np.int32(n),))

  def eight(a, b):
    for _ in range(8):
      a = add(a, b)
    return a

  a, b = f32(rng, n), f32(rng, n)
  out = jax.jit(eight)(a, b)
  expected = a.copy()
  for _ in range(8):
    expected = expected + b + 0.5
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6, atol=1e-5)
  mid = jmf.kernel_cache_stats()
  assert mid.nvrtc_compiles - before.nvrtc_compiles == 1
  assert mid.kernel_builds - before.kernel_builds == 1
  assert mid.kernel_hits - before.kernel_hits == 7
  assert mid.module_loads - before.module_loads == 1

  again = jax.jit(lambda a, b: add(add(a, b), b))(a, b)
  np.testing.assert_allclose(np.asarray(again), a + 2 * b + 1.0, rtol=1e-6, atol=1e-5)
  after = jmf.kernel_cache_stats()
  assert after.nvrtc_compiles == mid.nvrtc_compiles
  assert after.kernel_builds == mid.kernel_builds
  assert after.module_loads == mid.module_loads


LOOP_SCRIPT = textwrap.dedent('''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    source = r"""
    extern "C" __global__ void step(const float* x, const float* y, float* out, float alpha, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = x[i] * alpha + y[i];
    }
    """
    n = 1 << 16
    step = jmf.mosaic_kernel(jmf.cuda_kernel(source, "step"), jax.ShapeDtypeStruct((n,), jnp.float32),
                             grid=n // 256, block=256, scalars=(np.float32(0.5), np.int32(n)))
    def loop(x, y):
      for _ in range(12):
        x = step(x, y)
      return x
    x, y = (np.load(sys.argv[1]), np.load(sys.argv[2]))
    f = jax.jit(loop)
    # Inputs alive at once sit at different addresses: the recorded launches
    # must follow them from one execution to the next.
    inputs = [(jax.device_put(x * k), jax.device_put(y)) for k in (1, 2, 3, 1)]
    outs = [np.asarray(f(a, b)) for a, b in inputs]
    np.save(sys.argv[3], np.stack(outs))
    print(json.dumps({"same": bool((outs[0] == outs[3]).all()),
                      "records": jmf.kernel_cache_stats().records_created,
                      "registration": jmf.registration.status()}))
''')


def _run_loop(tmp_path, x, y, xla_flags):
  paths = [tmp_path / n for n in ("x.npy", "y.npy", f"out{len(xla_flags)}.npy")]
  np.save(paths[0], x)
  np.save(paths[1], y)
  env = dict(os.environ, XLA_FLAGS=xla_flags, JAX_MOSAIC_FFI_POISON_OUTPUTS="0")
  result = subprocess.run([sys.executable, "-c", LOOP_SCRIPT, *map(str, paths)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  import json
  return np.load(paths[2]), json.loads(result.stdout.strip().splitlines()[-1])


def test_command_buffers_on_and_off_agree_and_record_is_used(rng, tmp_path):
  n = 1 << 16
  x, y = f32(rng, n), f32(rng, n)
  expected = []
  for k in (1, 2, 3, 1):
    e = x.astype(np.float64) * k
    for _ in range(12):
      e = e * 0.5 + y
    expected.append(e)
  on, on_info = _run_loop(tmp_path, x, y, "")
  off, off_info = _run_loop(tmp_path, x, y, "--xla_gpu_enable_command_buffer=")
  np.testing.assert_allclose(on, np.stack(expected), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(on, off)
  assert on_info["same"] and off_info["same"]
  print("command buffers on:", on_info, "off:", off_info)
  assert on_info["registration"]["record"], on_info["registration"]
  assert on_info["records"] >= 12
  assert off_info["records"] == 0


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
  from jax_mosaic_ffi import gpu_info
  limit = gpu_info.visible_gpus()[0].max_shared_memory_per_block_optin
  kernel = jmf.cuda_kernel(STATIC_SMEM, "uses_smem")
  # Dynamic alone fits, but with 8 KiB of static shared memory it does not.
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((128,), jnp.float32), grid=1, block=128,
                           smem_bytes=limit)
  with pytest.raises(Exception, match=r"uses_smem.*shared memory.*lower smem_bytes") as info:
    jax.block_until_ready(jax.jit(call)())
  assert "test_gpu_runtime.py" in str(info.value)  # the call site
  _still_works(rng)


def test_an_invalid_cluster_reports_the_largest_that_fits(rng, isolated_disk_cache):
  kernel = jmf.cuda_kernel(BIG_SMEM, "reverse_in_smem")
  per_block = 40 * 1024
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((32 * per_block,), jnp.float32), grid=32, block=1024,
                           smem_bytes=per_block * 4, cluster=(32, 1, 1), scalars=(np.int32(per_block),))
  with pytest.raises(Exception, match=r"reverse_in_smem.*cluster \(32, 1, 1\).*(largest cluster|CLUSTER)") as info:
    jax.block_until_ready(jax.jit(call)(jnp.zeros(32 * per_block, jnp.float32)))
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


def test_an_unaligned_buffer_is_refused(rng, isolated_disk_cache):
  cupy = pytest.importorskip("cupy")
  kernel = jmf.cuda_kernel(INCREMENT, "increment")
  n = 1000
  base = cupy.asarray(f32(rng, n + 16))
  # 64 bytes past a 256-byte boundary: XLA itself accepts 16-byte alignment.
  view = base[16:]
  try:
    x = jax.dlpack.from_dlpack(view)
  except Exception as e:
    pytest.skip(f"jax copies or refuses unaligned dlpack views here: {e}")
  if x.unsafe_buffer_pointer() % 256 == 0:
    pytest.skip("jax copied the view to an aligned buffer")
  inc = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=4, block=256,
                          scalars=(np.int32(n),))
  with pytest.raises(Exception, match="input 0 is at address .* not 256-byte aligned"):
    jax.block_until_ready(jax.jit(inc)(x))
  _still_works(rng)


def test_no_growth_over_200_compile_delete_clear_cycles(rng, isolated_disk_cache):
  from cuda.bindings import driver
  n = 4096
  x = f32(rng, n)

  def cycle(i):
    source = INCREMENT.replace("+ 1.0f", f"+ {i}.0f")
    kernel = jmf.cuda_kernel(source, "increment")
    inc = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=n // 256, block=256,
                            scalars=(np.int32(n),))
    y = jax.jit(inc)(x)
    np.testing.assert_array_equal(np.asarray(y), x + i)
    del y, inc, kernel
    jax.clear_caches()
    jmf.clear_kernel_cache()

  def free_bytes():
    err, free, _ = driver.cuMemGetInfo()
    return free

  for i in range(5):  # warm up allocators and caches
    cycle(i)
  base_modules = jmf.kernel_cache_stats().loaded_modules
  base_free = free_bytes()
  for i in range(200):
    cycle(i + 5)
  stats = jmf.kernel_cache_stats()
  assert stats.loaded_modules == base_modules, stats
  assert stats.cached_kernels == 0
  assert base_free - free_bytes() < 64 << 20, (base_free, free_bytes())


SCALE = r'''
extern "C" __global__ void scale(const float* x, float* y, float factor, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * factor;
}
'''


def test_gradients_through_custom_vjp_and_vmap(rng, isolated_disk_cache):
  n = 4096
  kernel = jmf.cuda_kernel(SCALE, "scale")

  def scale_by(factor):
    return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=n // 256, block=256,
                             scalars=(np.float32(factor), np.int32(n)))

  @jax.custom_vjp
  def triple(x):
    return scale_by(3.0)(x)

  triple.defvjp(lambda x: (triple(x), None), lambda _, g: (scale_by(3.0)(g),))
  x = rng.standard_normal(n).astype(np.float32)
  grad = jax.jit(jax.grad(lambda v: (triple(v) ** 2).sum()))(x)
  np.testing.assert_allclose(np.asarray(grad), 18.0 * x, rtol=1e-5)
  batch = rng.standard_normal((3, n)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(triple))(batch)), batch * np.float32(3.0))
