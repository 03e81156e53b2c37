"""Gluon kernels running on the GPU, through mosaic_kernel and triton_call, against numpy on fresh random inputs
(outputs poisoned first, conftest.py): elementwise kernels with layouts, a warp-specialized kernel, TMA copies with
host and in-kernel descriptors, the tutorials' wgmma + TMA GEMMs (sm_90), autotuning whose winner a fresh process
reuses, PDL, command buffers on and off, an exported artifact, and the reference check."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from triton_required import import_triton

triton = import_triton()

from triton.experimental.gluon import language as gl  # noqa: E402

import jax_mosaic_ffi as jmf  # noqa: E402
import jax_mosaic_ffi.jax_triton as jt  # noqa: E402

import fresh_process  # noqa: E402
import gluon_sources as gs  # noqa: E402
import test_gluon as t  # noqa: E402
import test_gluon_call as tc  # noqa: E402

pytestmark = pytest.mark.gpu


def hopper():
  """Skips below sm_90 (TMA) and on Blackwell (the wgmma GEMMs are Hopper's)."""
  capability = getattr(jax.devices()[0], "compute_capability", "0")
  if not str(capability).startswith("9"):
    pytest.skip(f"needs an sm_90 GPU (TMA, wgmma); this one is compute capability {capability}")


def normal(rng, *shape, dtype=np.float32):
  return rng.standard_normal(shape).astype(dtype)


def test_elementwise_kernels_match_numpy(rng, isolated_disk_cache):
  n = int(rng.integers(1000, 100_000))
  x, y = normal(rng, n), normal(rng, n)
  np.testing.assert_array_equal(np.asarray(jax.jit(t.add_call())(x, y)), x + y)
  for warps in (2, 4, 8):  # the num_warps parameter takes each launch's value; its layout follows
    call = t.axpy_call(jmf.gluon_kernel(gs.axpy, constexprs={"XBLOCK": 1024}, num_warps=warps))
    np.testing.assert_allclose(np.asarray(jax.jit(call)(x, y)), 0.5 * x + y, rtol=1e-6, atol=1e-6)
  ws = jmf.mosaic_kernel(jmf.gluon_kernel(gs.ws_add_one, constexprs={"XBLOCK": 512}), lambda v: v,
                         grid=lambda meta, v: v.size // 1024)
  z = normal(rng, 1024 * int(rng.integers(1, 64)))
  np.testing.assert_array_equal(np.asarray(jax.jit(ws)(z)), z + 1)  # both partitions wrote their block


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64, np.int16, np.int8, np.uint32])
def test_triton_call_copies_scalars_and_arrays_as_gluon_test_does(rng, isolated_disk_cache, dtype):
  with jax.enable_x64(True):  # as gluon_test.py runs: 64-bit dtypes stay 64-bit
    x = jnp.asarray(np.asarray(rng.standard_normal() * 100).astype(dtype))
    assert x.dtype == dtype
    out = jt.triton_call(x, kernel=gs.copy_scalar, out_type=jax.typeof(x), grid=1)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
  size = int(rng.integers(40, 20_000))
  v = normal(rng, size)
  out = jt.triton_call(jnp.asarray(v), xnumel=size, kernel=gs.memcpy, out_type=jax.typeof(v),
                       grid=(triton.cdiv(size, 64),), num_warps=1, XBLOCK=64)
  np.testing.assert_array_equal(np.asarray(out), v)
  y_ref = jax.new_ref(jnp.zeros_like(v))  # eager, in place: gluon_test.py's test_memcpy_inplace
  jt.triton_call(jnp.asarray(v), y_ref, size, kernel=gs.memcpy, out_type=(), grid=(triton.cdiv(size, 64),),
                 num_warps=1, XBLOCK=64)
  np.testing.assert_array_equal(np.asarray(y_ref[...]), v)


@pytest.mark.parametrize("shape, swizzle", [((16, 32), 128), ((16, 16), 64), ((16, 8), 32), ((64, 64), 128)])
def test_tma_copies_through_host_and_in_kernel_descriptors(rng, isolated_disk_cache, shape, swizzle):
  hopper()
  x = normal(rng, *shape)
  layout = gl.NVMMASharedLayout(swizzle, element_bitwidth=32, rank=2)
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: tc.tile_copy(v, layout))(x)), x)
  device = jt.triton_call(jnp.asarray(x), kernel=gs.tile_copy_device, out_type=jax.typeof(x), grid=1, M=shape[0],
                          N=shape[1])
  np.testing.assert_array_equal(np.asarray(device), x)


def _gemm_reference(a, b):
  return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def _close(got, want):
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("kernel", ["blocked_matmul_pipelined", "matmul_pipelined"])
def test_the_wgmma_tma_gemms_match_numpy(rng, isolated_disk_cache, kernel):
  hopper()
  fn = getattr(t.G, kernel)
  constexprs = {"MMAImpl": t.G.WGMMA, "num_buffers": 4} if kernel == "matmul_pipelined" else {}
  gemm = jax.jit(t.gemm_call(fn, constexprs))
  for m, n, k in [(512, 768, 1024), (256, 512, 4096), (1024, 1024, 192)]:
    a, b = normal(rng, m, k, dtype=np.float16), normal(rng, k, n, dtype=np.float16)
    _close(gemm(a, b), _gemm_reference(a, b))


@pytest.mark.parametrize("how", ["aliased", "ref"])
def test_a_gemm_through_triton_call_writes_its_output_through_a_descriptor(rng, isolated_disk_cache, how):
  hopper()
  a, b = normal(rng, 256, 512, dtype=np.float16), normal(rng, 512, 384, dtype=np.float16)
  _close(jax.jit(lambda x, y: tc.gemm(x, y, how))(a, b), _gemm_reference(a, b))


AUTOTUNED = """
  import json
  import jax, numpy as np, triton
  import jax_mosaic_ffi as jmf
  import gluon_sources as gs, test_gluon as t
  tuned = triton.autotune(configs=[triton.Config({"XBLOCK": 2048}, num_warps=8),
                                   triton.Config({"XBLOCK": 512}, num_warps=4),
                                   triton.Config({"XBLOCK": 256}, num_warps=1)], key=["n"])(gs.axpy)
  x = np.random.default_rng(int(__import__("sys").argv[1])).standard_normal(1 << 20).astype(np.float32)
  out = np.asarray(jax.jit(t.axpy_call(jmf.gluon_kernel(tuned)))(x, x))
  s = jmf.kernel_cache_stats()
  print(json.dumps({"ok": bool(np.allclose(out, 1.5 * x, rtol=1e-6)), "tunings": s.autotune_tunings,
                    "disk": s.autotune_disk_hits}))
"""


def test_autotuning_times_the_configs_and_a_fresh_process_reuses_the_winner(rng, isolated_disk_cache):
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}
  seed = str(int(rng.integers(1 << 30)))
  first = fresh_process.run(AUTOTUNED, seed, env=env).result
  second = fresh_process.run(AUTOTUNED, seed, env=env).result
  assert first == {"ok": True, "tunings": 1, "disk": 0}, first
  assert second == {"ok": True, "tunings": 0, "disk": 1}, second


def test_a_chain_of_kernels_that_wait_launches_with_pdl(rng, isolated_disk_cache):
  call = jmf.mosaic_kernel(jmf.gluon_kernel(gs.add_after_wait, constexprs={"XBLOCK": 512}), lambda a, b: a,
                           grid=lambda meta, a, b: jmf.cdiv(a.size, 512),
                           scalars=lambda meta, a, b: (np.int32(a.size),))

  def chain(x, y):
    for _ in range(8):
      x = call(x, y)
    return x
  x, y = normal(rng, 50_000), normal(rng, 50_000)
  np.testing.assert_allclose(np.asarray(jax.jit(chain)(x, y)), x + 8 * y, rtol=1e-5, atol=1e-5)


CHAIN = """
  import json, sys
  import jax, numpy as np
  import jax_mosaic_ffi as jmf
  import test_gluon as t
  gemm = t.gemm_call(t.G.matmul_pipelined, {"MMAImpl": t.G.WGMMA, "num_buffers": 4})
  axpy = t.axpy_call()
  def chain(a, b, x, y):
    for _ in range(6):
      x = axpy(x, y)
      a = gemm(a, b)
    return a, x
  rng = np.random.default_rng(int(sys.argv[1]))
  f = jax.jit(chain)
  errors = []
  for _ in range(3):  # buffers at new addresses each time: recorded launches must follow them
    a = rng.standard_normal((256, 256)).astype(np.float16)
    b = (np.eye(256) * 0.5).astype(np.float16)  # a halves each step: exact in fp16
    x, y = (rng.standard_normal(10_000).astype(np.float32) for _ in range(2))
    got_a, got_x = (np.asarray(o) for o in f(a, b, x, y))
    want_x = x.astype(np.float64)
    for _ in range(6):
      want_x = 0.5 * want_x + y
    errors.append(max(float(np.abs(got_a.astype(np.float64) - a.astype(np.float64) / 64).max()),
                      float(np.abs(got_x - want_x).max())))
  print(json.dumps({"errors": errors, "records": jmf.kernel_cache_stats().records_created}))
"""


@pytest.mark.parametrize("command_buffers", [True, False], ids=["command-buffers", "stream"])
def test_a_chain_of_gluon_kernels_inside_and_outside_command_buffers(rng, tmp_path, command_buffers):
  hopper()
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache"),
         "XLA_FLAGS": "" if command_buffers else "--xla_gpu_enable_command_buffer="}
  result = fresh_process.run(CHAIN, str(int(rng.integers(1 << 30))), env=env).result
  assert max(result["errors"]) < 1e-4, result
  # With command buffers the launches become graph nodes through the record stage; without, none is recorded.
  assert (result["records"] > 0) == command_buffers, result


def test_an_exported_gemm_runs_in_a_process_that_compiles_nothing(rng, isolated_disk_cache, tmp_path):
  hopper()
  a, b = jax.ShapeDtypeStruct((512, 256), jnp.float16), jax.ShapeDtypeStruct((256, 256), jnp.float16)
  call = t.gemm_call(t.G.blocked_matmul_pipelined, {})
  exported = jax.export.export(jax.jit(call), platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(a, b)
  (tmp_path / "gemm.bin").write_bytes(exported.serialize())
  x, y = normal(rng, 512, 256, dtype=np.float16), normal(rng, 256, 256, dtype=np.float16)
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "y.npy", y)
  script = """
    import json, sys
    import jax, numpy as np
    import jax_mosaic_ffi as jmf
    exported = jax.export.deserialize(open(sys.argv[1] + "/gemm.bin", "rb").read())
    out = np.asarray(exported.call(np.load(sys.argv[1] + "/x.npy"), np.load(sys.argv[1] + "/y.npy")), np.float64)
    np.save(sys.argv[1] + "/out.npy", out)
    print(json.dumps({"compiles": jmf.kernel_cache_stats().compiles["triton"]}))
  """
  result = fresh_process.run(script, str(tmp_path), env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "empty")}).result
  assert result == {"compiles": 0}
  _close(np.load(tmp_path / "out.npy"), _gemm_reference(x, y))


def test_the_reference_check_compares_each_kernel_with_its_fallback(isolated_disk_cache):
  report = jmf.check(t.axpy_call(fallback=lambda x, y: 0.5 * x + y), jnp.zeros(3000), jnp.zeros(3000), grads=False)
  assert report.passed, report
  compared = {r.kernel.split(" at ")[0] for r in report.rows if r.what.startswith("kernel vs fallback") and r.kernel}
  assert "mosaic_kernel 'axpy'" in compared, report
  if str(getattr(jax.devices()[0], "compute_capability", "0")).startswith("9"):
    gemm = t.gemm_call(t.G.matmul_pipelined, {"MMAImpl": t.G.WGMMA, "num_buffers": 4},
                       fallback=lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(a.dtype))
    report = jmf.check(gemm, jnp.zeros((256, 512), jnp.float16), jnp.zeros((512, 256), jnp.float16), shapes=None,
                       grads=False, tolerances={jnp.float16: (2e-2, 2e-2)})
    assert report.passed, report


def test_vmap_and_gradients_run(rng, isolated_disk_cache):
  xs, ys = normal(rng, 3, 5000), normal(rng, 3, 5000)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(t.axpy_call()))(xs, ys)), 0.5 * xs + ys, rtol=1e-6)
  add_d = jmf.differentiable(t.add_call(), bwd=lambda g: (g, g))
  gx, gy = jax.grad(lambda a, b: (add_d(a, b) * a).sum(), argnums=(0, 1))(xs[0], ys[0])
  np.testing.assert_allclose(np.asarray(gx), 2 * xs[0] + ys[0], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(gy), xs[0], rtol=1e-5)
