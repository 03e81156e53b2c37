"""cuTile kernels on the GPU: cuTile's samples (vector add, softmax, matmul, layer norm) against numpy on fresh
random inputs (outputs poisoned first, the suite's default), launched as tile kernels (a block of one: the driver
runs the threads and static shared memory the cubin declares), with clusters (num_ctas), PDL, both index widths;
with command buffers on and off, exported and run in a fresh process, under vmap, differentiated, sharded,
autotuned, checked; and cuda.tile.jax's own example through the drop-in."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutile_required  # noqa: F401  (skips without cuda-tile)
import fresh_process
import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.cutile_jax import InputOutput, OutputPlaceholder, cutile_call

import cuda.tile as ct  # noqa: E402  (after the guard)

S = cutile_required.samples()
pytestmark = pytest.mark.gpu


def vector_add(kernel=None, **options):
  return jmf.mosaic_kernel(jmf.cutile_kernel(kernel or S.vector_add, TILE=1024), lambda a, b: a,
                           grid=lambda a, b: jmf.cdiv(a.shape[0], 1024), **options)


def softmax(tile_n=1024):
  return jmf.mosaic_kernel(jmf.cutile_kernel(S.softmax, TILE_N=tile_n), lambda x: x, grid=lambda x: x.shape[0])


def matmul(tm=128, tn=128, tk=64, **hints):
  return jmf.mosaic_kernel(jmf.cutile_kernel(S.matmul, TM=tm, TN=tn, TK=tk, **hints),
                           lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
                           grid=lambda a, b: (jmf.cdiv(a.shape[0], tm), jmf.cdiv(b.shape[1], tn)))


def layer_norm(eps=1e-5, tile_n=1024):
  return jmf.mosaic_kernel(jmf.cutile_kernel(S.layer_norm, TILE_N=tile_n), lambda x, w, b: x,
                           grid=lambda x, w, b: x.shape[0], scalars=(np.float32(eps),))


def np_softmax(x):
  e = np.exp(x - x.max(axis=1, keepdims=True))
  return e / e.sum(axis=1, keepdims=True)


def np_layer_norm(x, w, b, eps):
  mean = x.mean(axis=1, keepdims=True)
  return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + eps) * w + b


@pytest.mark.parametrize("n", [1024, 5000, 1 << 20])
def test_vector_add_matches_numpy(rng, isolated_disk_cache, n):
  a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(vector_add())(a, b)), a + b, rtol=1e-6)


@pytest.mark.parametrize("shape", [(64, 1000), (3, 1024), (257, 77)])
def test_softmax_matches_numpy(rng, isolated_disk_cache, shape):
  x = rng.standard_normal(shape).astype(np.float32)
  np.testing.assert_allclose(np.asarray(jax.jit(softmax())(x)), np_softmax(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("m, k, n", [(512, 256, 384), (300, 200, 100), (128, 64, 128)])
def test_matmul_matches_numpy(rng, isolated_disk_cache, m, k, n):
  """The sm_90 matmul declares 74 KiB of static shared memory (above a SIMT kernel's 48 KiB): launched with a
  block of one, the driver gives it that and its 128 threads."""
  a = rng.standard_normal((m, k)).astype(np.float16)
  b = rng.standard_normal((k, n)).astype(np.float16)
  got = np.asarray(jax.jit(matmul())(a, b)).astype(np.float32)
  np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=2e-2, atol=5e-2)


def test_layer_norm_with_a_runtime_eps_matches_numpy(rng, isolated_disk_cache):
  x = rng.standard_normal((64, 1000)).astype(np.float32)
  w, b = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
  before = jmf.kernel_cache_stats().compiles["cutile"]
  for eps in (1e-5, 0.5):  # a launch value: one compile for both
    got = np.asarray(jax.jit(layer_norm(eps))(x, w, b))
    np.testing.assert_allclose(got, np_layer_norm(x, w, b, eps), rtol=1e-4, atol=1e-4)
  assert jmf.kernel_cache_stats().compiles["cutile"] - before == 1


def test_the_driver_runs_the_threads_and_shared_memory_the_cubin_declares(isolated_disk_cache):
  """What compiler/cubin.py reads from the cubin is what the driver reports of the loaded function."""
  import cuda.bindings.driver as driver  # noqa: PLC0415
  from jax_mosaic_ffi.base.module_format import Arch  # noqa: PLC0415
  from jax_mosaic_ffi.cutile.compiler import keys, plan as P  # noqa: PLC0415
  from jax_mosaic_ffi.cutile.compiler.compile import compile_plan  # noqa: PLC0415
  arch = gpu_info.visible_gpus()[0].arch
  tiles = tuple(P.ConstantArg(v, keys.exact_key(v).hex()) for v in (128, 128, 64))
  plan = P.Plan((P.ArrayArg(0, "float16", (512, 256)), P.ArrayArg(1, "float16", (256, 384)),
                 P.ArrayArg(2, "float16", (512, 384)), *tiles))
  kernel = compile_plan(S.matmul, plan, name="matmul", targets=(Arch(arch),))
  (image,) = kernel.images
  info = kernel.launch_info(image.arch.sm)
  (err,) = driver.cuInit(0)
  err, library = driver.cuLibraryLoadData(image.data, [], [], 0, [], [], 0)
  assert err == driver.CUresult.CUDA_SUCCESS, err
  err, handle = driver.cuLibraryGetKernel(library, kernel.symbol.encode())
  err, device = driver.cuDeviceGet(0)
  err, threads = driver.cuKernelGetAttribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                             handle, device)
  err, smem = driver.cuKernelGetAttribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, handle,
                                          device)
  assert (threads, smem) == (info.threads[0] * info.threads[1] * info.threads[2], info.static_smem)
  driver.cuLibraryUnload(library)


def test_clusters_of_num_ctas_blocks_match_numpy(rng, isolated_disk_cache):
  if gpu_info.visible_gpus()[0].arch < 90:
    pytest.skip("clusters need sm_90")
  a, b = (rng.standard_normal(8192 + 512).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(vector_add(S.vector_add_pairs))(a, b)), a + b, rtol=1e-6)
  x = rng.standard_normal((512, 256)).astype(np.float16)
  y = rng.standard_normal((256, 512)).astype(np.float16)
  got = np.asarray(jax.jit(matmul(num_ctas=2))(x, y)).astype(np.float32)
  np.testing.assert_allclose(got, x.astype(np.float32) @ y.astype(np.float32), rtol=2e-2, atol=5e-2)


def test_pdl_launch_after_a_kernel_that_writes_its_input(rng, isolated_disk_cache):
  """The second kernel reads what the first writes; it waits (ct.grid_dependency_control_wait) and may start early."""
  if gpu_info.visible_gpus()[0].arch < 90:
    pytest.skip("PDL needs sm_90")
  first = vector_add()
  second = vector_add(S.add_after_previous, uses_pdl=True)
  a, b = (rng.standard_normal(1 << 20).astype(np.float32) for _ in range(2))
  got = np.asarray(jax.jit(lambda x, y: second(first(x, y), y))(a, b))
  np.testing.assert_allclose(got, a + 2 * b, rtol=1e-6)


@pytest.mark.parametrize("n", [5000, 1 << 20])
def test_64_bit_indexing_matches_numpy(rng, isolated_disk_cache, n):
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.scale_wide, TILE=1024), lambda x: x, grid=lambda x: jmf.cdiv(x.size, 1024),
                        scalars=lambda x: (np.float32(-2.5), np.int64(x.size)))
  x = rng.standard_normal(n).astype(np.float32)
  np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), -2.5 * x, rtol=1e-6)


CHAIN = '''
  import json, sys
  import jax, numpy as np
  import jax_mosaic_ffi as jmf
  from cutile_required import samples
  S = samples()
  step = jmf.mosaic_kernel(jmf.cutile_kernel(S.vector_add, TILE=1024), lambda a, b: a,
                           grid=lambda a, b: jmf.cdiv(a.size, 1024))
  def chain(x, y):
    for _ in range(12):
      x = step(x, y)
    return x
  rng = np.random.default_rng(int(sys.argv[1]))
  f = jax.jit(chain)
  errors = []
  for _ in range(3):  # buffers at new addresses each time: a captured graph must follow them
    x, y = (rng.standard_normal(1 << 16).astype(np.float32) for _ in range(2))
    errors.append(float(np.max(np.abs(np.asarray(f(x, y)) - (x + 12 * y)))))
  print(json.dumps({"errors": errors}))
'''


@pytest.mark.parametrize("command_buffers", [True, False])
def test_a_chain_inside_and_outside_command_buffers(rng, tmp_path, command_buffers):
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}
  if not command_buffers:
    env["XLA_FLAGS"] = "--xla_gpu_enable_command_buffer="
  result = fresh_process.run(CHAIN, str(int(rng.integers(1 << 30))), env=env).result
  assert max(result["errors"]) < 1e-4, result


EXPORTED = '''
  import json, sys
  import jax, numpy as np
  import jax_mosaic_ffi as jmf
  exported = jax.export.deserialize(open(sys.argv[1], "rb").read())
  x = np.load(sys.argv[2])
  out = [np.asarray(exported.call(x[:n], x[:n])) for n in (1000, 4096, 70000)]
  print(json.dumps({"max_error": max(float(np.max(np.abs(o - 2 * x[:o.size]))) for o in out),
                    "cutile_imported": any(m == "cuda.tile" or m.startswith("cuda.tile.") for m in sys.modules),
                    "compiles": jmf.kernel_cache_stats().compiles["cutile"]}))
'''


def test_export_runs_in_a_fresh_process_for_every_size(rng, tmp_path, isolated_disk_cache):
  (n,) = jax.export.symbolic_shape("n")
  x = jax.ShapeDtypeStruct((n,), jnp.float32)
  exported = jax.export.export(jax.jit(vector_add()), platforms=["cuda"])(x, x)
  assert exported.disabled_safety_checks == ()
  (tmp_path / "add.bin").write_bytes(exported.serialize())
  np.save(tmp_path / "x.npy", rng.standard_normal(70000).astype(np.float32))
  result = fresh_process.run(EXPORTED, str(tmp_path / "add.bin"), str(tmp_path / "x.npy")).result
  assert result["max_error"] < 1e-6 and result["compiles"] == 0 and not result["cutile_imported"], result


def test_vmap_per_element_and_over_a_batch_axis(rng, isolated_disk_cache):
  a, b = (rng.standard_normal((3, 4096)).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(vector_add()))(a, b)), a + b, rtol=1e-6)
  batched = jmf.mosaic_kernel(jmf.cutile_kernel(S.batched_add, TILE=256, batch_bid=1), lambda x, y: x,
                              grid=lambda x, y: jmf.cdiv(x.shape[-1], 256))
  c, d = (rng.standard_normal((2, 3, 1000)).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(jax.vmap(batched)))(c, d)), c + d, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(batched)(c[0, 0], d[0, 0])), c[0, 0] + d[0, 0], rtol=1e-6)


def test_grad_and_jvp_through_cutile_kernels(rng, isolated_disk_cache):
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.scale_wide, TILE=1024), lambda x: x, grid=lambda x: jmf.cdiv(x.size, 1024),
                        scalars=lambda x: (np.float32(3), np.int64(x.size)))
  g = jmf.differentiable(f, bwd=f, linear=True)
  x = rng.standard_normal(3000).astype(np.float32)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(lambda v: (g(v) ** 2).sum()))(x)), 18 * x, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(jax.jvp(g, (x,), (x,))[1]), 3 * x, rtol=1e-6)


def test_sharding_with_one_device_and_fallback_unused(rng, isolated_disk_cache):
  mesh = jax.make_mesh((1,), ("b",))
  spec = jax.sharding.PartitionSpec("b")
  x = jax.device_put(rng.standard_normal(4096).astype(np.float32), jax.sharding.NamedSharding(mesh, spec))
  f = vector_add(sharding=jmf.Elementwise(), fallback=lambda a, b: a * 0)
  np.testing.assert_allclose(np.asarray(jax.jit(f)(x, x)), 2 * np.asarray(x), rtol=1e-6)


def test_autotuning_over_tiles_and_kernel_options_keeps_a_winner(rng, isolated_disk_cache):
  configs = [{"TM": 64, "TN": 64, "TK": 32}, {"TM": 128, "TN": 128, "TK": 64, "occupancy": 1},
             {"TM": 128, "TN": 256, "TK": 64, "num_ctas": 2}]
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.matmul), lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]),
                                                                                         a.dtype),
                        grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], meta["TM"]), jmf.cdiv(b.shape[1], meta["TN"])),
                        configs=configs)
  a = rng.standard_normal((512, 512)).astype(np.float16)
  b = rng.standard_normal((512, 512)).astype(np.float16)
  got = np.asarray(jax.jit(f)(a, b)).astype(np.float32)
  np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=2e-2, atol=1e-1)
  assert jmf.kernel_cache_stats().autotune_tunings >= 1


def test_check_compares_each_kernel_with_its_fallback(rng, isolated_disk_cache):
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.softmax, TILE_N=1024), lambda x: x, grid=lambda x: x.shape[0],
                        fallback=functools.partial(jax.nn.softmax, axis=-1))
  report = jmf.check(f, rng.standard_normal((32, 1000)).astype(np.float32), shapes=[(32, 1000), (5, 1024)])
  assert report.passed, report


@ct.kernel
def _scale(x, y, c: ct.Constant, TILE_SIZE: ct.Constant):
  ct.store(y, ct.bid(0), ct.load(x, ct.bid(0), TILE_SIZE) * c)


@ct.kernel
def _inplace(x, TILE_SIZE: ct.Constant):
  ct.store(x, ct.bid(0), ct.load(x, ct.bid(0), TILE_SIZE) / 2)


@ct.kernel
def _sincos(x, y1, y2, TILE_SIZE: ct.Constant):
  t = ct.load(x, ct.bid(0), TILE_SIZE)
  ct.store(y1, ct.bid(0), ct.sin(t))
  ct.store(y2, ct.bid(0), ct.cos(t))


def test_cuda_tile_jaxs_example_through_the_drop_in(rng, isolated_disk_cache):
  @functools.partial(jax.jit, static_argnums=(1, 2))
  def graph(x, c, tile_size):
    grid = (ct.cdiv(x.shape[0], tile_size),)
    ph = OutputPlaceholder(x.shape, x.dtype)
    y = cutile_call(grid, _scale, (x, ph, c, tile_size))
    y = cutile_call(grid, _inplace, (InputOutput(y), tile_size))
    ysin, ycos = cutile_call(grid, _sincos, (y, ph, ph, tile_size))
    return ysin + ycos

  x = rng.standard_normal(4096).astype(np.float32)
  y = x * np.pi / 2
  np.testing.assert_allclose(np.asarray(graph(x, float(np.pi), 256)), np.sin(y) + np.cos(y), rtol=1e-5, atol=1e-5)
