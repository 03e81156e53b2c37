"""CuTe DSL kernels on the GPU: real kernels against numpy on fresh random inputs (outputs poisoned first, the
suite's default), with command buffers on and off, exported and run in a fresh process, under vmap,
differentiated, sharded, autotuned; and the runtime's refusals (another DSL release, a crafted object, host code
this process did not lower under JAX_MOSAIC_FFI_HOST_CODE=lowered)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)
import jax_mosaic_ffi as jmf

import cute_kernels as K
import fresh_process

from cutlass.jax import TensorSpec  # noqa: E402  (after the guard)

pytestmark = pytest.mark.gpu

COLUMN_MAJOR = TensorSpec(layout=(0, 1))  # CuTe's stride order: dimension 0 innermost


def test_add_one_matches_numpy(rng, isolated_disk_cache):
  x = rng.standard_normal(1000).astype(np.float32)
  before = jmf.kernel_cache_stats()
  f = jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct(x.shape, x.dtype)))
  np.testing.assert_allclose(np.asarray(f(x)), x + 1, rtol=1e-6)
  after = jmf.kernel_cache_stats()
  assert after.compiles["cute"] - before.compiles["cute"] == 1 and after.loaded_modules >= 1


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("shape", [(7, 33), (128, 256)])
def test_axpy_with_constexprs_and_static_tensors(rng, isolated_disk_cache, static, shape):
  a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
  f = jax.jit(jmf.cute_call(K.axpy, output_shape_dtype=jax.ShapeDtypeStruct(shape, jnp.float32),
                            use_static_tensors=static, alpha=-1.5, threads=64))
  np.testing.assert_allclose(np.asarray(f(a, b)), -1.5 * a + b, rtol=1e-5, atol=1e-6)


def test_in_place_alias(rng, isolated_disk_cache):
  x = rng.standard_normal(4096).astype(np.float32)
  f = jax.jit(jmf.cute_call(K.scale_in_place, output_shape_dtype=jax.ShapeDtypeStruct(x.shape, x.dtype),
                            input_output_aliases={0: 0}), donate_argnums=0)
  np.testing.assert_allclose(np.asarray(f(jnp.asarray(x))), x + 1, rtol=1e-6)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("which", ["input", "output", "both"])
def test_column_major_buffers_match_numpy(rng, isolated_disk_cache, which, static):
  # The kernel reads a[i, j] and writes c[i, j] through its tensors' layouts: XLA must lay the buffers out as the
  # specs say (a row-major buffer read as column-major gives the transpose's elements).
  shape = (33, 70)
  a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
  in_spec = (COLUMN_MAJOR, None) if which != "output" else None
  out_spec = COLUMN_MAJOR if which != "input" else None
  f = jax.jit(jmf.cute_call(K.axpy, output_shape_dtype=jax.ShapeDtypeStruct(shape, jnp.float32), input_spec=in_spec,
                            output_spec=out_spec, use_static_tensors=static, alpha=-1.5))
  np.testing.assert_allclose(np.asarray(f(a, b)), -1.5 * a + b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(f(b, a)), -1.5 * b + a, rtol=1e-5, atol=1e-6)  # fresh buffers


def test_column_major_buffers_under_vmap(rng, isolated_disk_cache):
  shape = (8, 32)  # 1 KiB per element: each batch element aligned as the kernel assumes
  out = jax.ShapeDtypeStruct(shape, jnp.float32)
  a, b = (rng.standard_normal((5, *shape)).astype(np.float32) for _ in range(2))
  per_element = jmf.cute_call(K.axpy, output_shape_dtype=out, input_spec=(COLUMN_MAJOR, COLUMN_MAJOR),
                              output_spec=COLUMN_MAJOR, alpha=3.0)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(per_element))(a, b)), 3 * a + b, rtol=1e-5, atol=1e-6)
  shared = jax.jit(jax.vmap(per_element, in_axes=(0, None)))(a, b[0])
  np.testing.assert_allclose(np.asarray(shared), 3 * a + b[0], rtol=1e-5, atol=1e-6)
  # One call over the batch: the launcher's (M, N, L) tensors, M innermost, the batch outermost.
  batched = jmf.cute_call(K.axpy_batched, output_shape_dtype=out, input_spec=(COLUMN_MAJOR, None), batch_mode=-1,
                          alpha=3.0)
  np.testing.assert_allclose(np.asarray(jax.jit(batched)(a[0], b[0])), 3 * a[0] + b[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(batched))(a, b)), 3 * a + b, rtol=1e-5, atol=1e-6)
  nested = jax.jit(jax.vmap(jax.vmap(batched)))(a[:4].reshape(2, 2, *shape), b[:4].reshape(2, 2, *shape))
  np.testing.assert_allclose(np.asarray(nested).reshape(4, *shape), 3 * a[:4] + b[:4], rtol=1e-5, atol=1e-6)


def test_key_path_alias_updates_one_leaf_in_place(rng, isolated_disk_cache):
  m, v = (rng.standard_normal(2048).astype(np.float32) for _ in range(2))
  leaf = jax.ShapeDtypeStruct(m.shape, m.dtype)
  path = (jax.tree_util.SequenceKey(0), jax.tree_util.DictKey("m"))
  f = jax.jit(jmf.cute_call(K.step_state, output_shape_dtype=({"m": leaf, "v": leaf},),
                            input_output_aliases={path: path}), donate_argnums=0)
  (new,) = f({"m": jnp.asarray(m), "v": jnp.asarray(v)})
  np.testing.assert_allclose(np.asarray(new["m"]), m + 1, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(new["v"]), v + 1, rtol=1e-6)


CHAIN = '''
  import json, sys
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  import cute_kernels as K
  n = 1 << 14
  step = jmf.cute_call(K.axpy, output_shape_dtype=jax.ShapeDtypeStruct((64, n // 64), jnp.float32), alpha=0.5)
  def chain(x, y):
    for _ in range(12):
      x = step(x, y)
    return x
  rng = np.random.default_rng(int(sys.argv[1]))
  f = jax.jit(chain)
  results = []
  for k in (1, 2, 3, 1):  # buffers at new addresses each time: a captured graph must follow them
    x = rng.standard_normal((64, n // 64)).astype(np.float32); y = rng.standard_normal(x.shape).astype(np.float32)
    want = x.astype(np.float64)
    for _ in range(12):
      want = 0.5 * want + y
    results.append(float(np.max(np.abs(np.asarray(f(x, y)) - want))))
  print(json.dumps({"errors": results, "text": "command_buffer" in f.lower(x, y).compile().as_text(),
                    "status": jmf.registration.status()["record"]}))
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
  if sys.argv[3] == "by_hand":
    jmf.register()  # as earlier versions asked; otherwise the first lowering registers and finds the library
  x = np.load(sys.argv[2])
  out = [np.asarray(exported.call(x[:n])) for n in (256, 512, 1024)]
  print(json.dumps({"max_error": max(float(np.max(np.abs(o - (x[:o.size] + 1)))) for o in out),
                    "dsl_imported": any(m == "cutlass" or m.startswith("cutlass.") for m in sys.modules),
                    "compiles": jmf.kernel_cache_stats().compiles["cute"],
                    "registered": jmf.registration.status()["done"]}))
'''


@pytest.mark.parametrize("registration", ["by_hand", "at_first_lowering"])
def test_export_runs_in_a_fresh_process_without_the_compiler(rng, tmp_path, isolated_disk_cache, registration):
  (n,) = jax.export.symbolic_shape("256*n")
  x = jax.ShapeDtypeStruct((n,), jnp.float32)
  spec = jmf.cute.dsl.tensor_spec_class()(divisibility=(256,))
  f = jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=x, input_spec=spec, output_spec=spec))
  exported = jax.export.export(f, platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(x)
  (tmp_path / "add.bin").write_bytes(exported.serialize())
  data = rng.standard_normal(1024).astype(np.float32)
  np.save(tmp_path / "x.npy", data)
  result = fresh_process.run(EXPORTED, str(tmp_path / "add.bin"), str(tmp_path / "x.npy"), registration).result
  assert result["max_error"] < 1e-6 and not result["dsl_imported"] and result["compiles"] == 0, result
  assert result["registered"], result


DAMAGED_RUNTIME = '''
  import json, sys
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.cute.compiler import package as cute_package

  def damaged():
    raise OSError("the nvidia-cutlass-dsl package cannot be read")

  cute_package.runtime = damaged
  exported = jax.export.deserialize(open(sys.argv[1], "rb").read())
  x = np.load(sys.argv[2])
  try:
    exported.call(x).block_until_ready()
    message = ""
  except Exception as e:
    message = str(e)
  source = 'extern "C" __global__ void add_one(const float* x, float* y) { y[threadIdx.x] = x[threadIdx.x] + 1; }'
  cuda = jax.jit(jmf.mosaic_kernel(jmf.cuda_kernel(source, "add_one"), jax.ShapeDtypeStruct(x.shape, x.dtype),
                                   grid=1, block=x.size))
  print(json.dumps({"message": message, "status": jmf.registration.status(),
                    "cuda_error": float(np.max(np.abs(np.asarray(cuda(x)) - (x + 1))))}))
'''


def test_a_damaged_runtime_library_fails_a_deserialized_call_by_name_and_other_kernels_run(rng, tmp_path,
                                                                                          isolated_disk_cache):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  exported = jax.export.export(jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=x)), platforms=["cuda"],
                               disabled_checks=jmf.export_disabled_checks())(x)
  (tmp_path / "add.bin").write_bytes(exported.serialize())
  np.save(tmp_path / "x.npy", rng.standard_normal(256).astype(np.float32))
  r = fresh_process.run(DAMAGED_RUNTIME, str(tmp_path / "add.bin"), str(tmp_path / "x.npy")).result
  # The call's instantiate reports the kept cause (not "not installed", not a crash); a CUDA C++ kernel runs.
  assert ("could not find NVIDIA's CuTe DSL runtime library: OSError: the nvidia-cutlass-dsl package cannot be read"
          in r["message"] and "reinstall nvidia-cutlass-dsl in the supported range" in r["message"]), r
  kept = r["status"]["runtime_libraries"]["libcute_dsl_runtime.so"]
  assert r["status"]["done"] and "OSError: the nvidia-cutlass-dsl package cannot be read" in kept, r
  assert r["cuda_error"] < 1e-6, r


def test_vmap_runs_once_per_element(rng, isolated_disk_cache):
  x = rng.standard_normal((5, 256)).astype(np.float32)
  shared = rng.standard_normal(256).astype(np.float32)
  one = jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct((256,), jnp.float32))
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(one))(x)), x + 1, rtol=1e-6)
  two = jmf.cute_call(K.axpy, output_shape_dtype=jax.ShapeDtypeStruct((4, 64), jnp.float32), alpha=3.0)
  a = rng.standard_normal((3, 4, 64)).astype(np.float32)
  got = jax.jit(jax.vmap(two, in_axes=(0, None)))(a, shared.reshape(4, 64))
  # The kernel's fused multiply-add rounds once; numpy's 3 * a + b twice: near zero that is a relative 1e-5 apart.
  want = 3 * a.astype(np.float64) + shared.reshape(4, 64)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_vmap_of_a_launcher_with_a_batch_mode_is_one_call_over_the_batch(rng, isolated_disk_cache):
  # The launcher's tensors are (M, N, L); the arrays (M, N), batched by vmap into L.
  shape = (33, 64)
  f = jmf.cute_call(K.axpy_batched, output_shape_dtype=jax.ShapeDtypeStruct(shape, jnp.float32), batch_mode=-1,
                    alpha=-1.5)
  a, b = (rng.standard_normal((6, *shape)).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(f)(a[0], b[0])), -1.5 * a[0] + b[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(f))(a, b)), -1.5 * a + b, rtol=1e-5, atol=1e-6)
  shared = jax.jit(jax.vmap(f, in_axes=(0, None)))(a, b[0])  # broadcast to the batch
  np.testing.assert_allclose(np.asarray(shared), -1.5 * a + b[0], rtol=1e-5, atol=1e-6)
  nested = jax.jit(jax.vmap(jax.vmap(f)))(a.reshape(2, 3, *shape), b.reshape(2, 3, *shape))
  np.testing.assert_allclose(np.asarray(nested).reshape(a.shape), -1.5 * a + b, rtol=1e-5, atol=1e-6)


def test_grad_and_jvp_through_cute_kernels(rng, isolated_disk_cache):
  shape = (16, 64)
  out = jax.ShapeDtypeStruct(shape, jnp.float32)
  axpy2 = jmf.cute_call(K.axpy, output_shape_dtype=out, alpha=2.0)
  zeros = lambda t: jnp.zeros_like(t)  # noqa: E731
  f = jmf.differentiable(axpy2, bwd=lambda ct: (axpy2(ct, zeros(ct)), ct),
                         jvp=lambda ta, tb: axpy2(ta, tb))
  a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
  ga, gb = jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b) ** 2), argnums=(0, 1)))(a, b)
  c = 2 * a + b
  np.testing.assert_allclose(np.asarray(ga), 4 * c, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(gb), 2 * c, rtol=1e-4)
  ta, tb = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
  _, tangent = jax.jvp(f, (a, b), (ta, tb))
  np.testing.assert_allclose(np.asarray(tangent), 2 * ta + tb, rtol=1e-5)


def test_shard_map_and_sharding_with_one_device(rng, isolated_disk_cache):
  mesh = jax.make_mesh((1,), ("b",))
  spec = jax.sharding.PartitionSpec("b")
  # Sharded as in_specs says: newer jax refuses in_specs that differ from an argument's own sharding.
  x = jax.device_put(rng.standard_normal(1024).astype(np.float32), jax.sharding.NamedSharding(mesh, spec))
  per_shard = jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct((1024,), jnp.float32))
  f = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=spec, out_specs=spec))
  np.testing.assert_allclose(np.asarray(f(x)), x + 1, rtol=1e-6)
  g = jmf.mosaic_kernel(jmf.cute_kernel(K.add_one), lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype),
                        sharding=jmf.Elementwise())
  np.testing.assert_allclose(np.asarray(jax.jit(g)(x)), x + 1, rtol=1e-6)


def test_fallback_is_not_used_on_the_gpu(rng, isolated_disk_cache):
  x = rng.standard_normal(512).astype(np.float32)
  f = jmf.mosaic_kernel(jmf.cute_kernel(K.add_one), jax.ShapeDtypeStruct(x.shape, x.dtype), fallback=lambda v: v * 0)
  np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), x + 1, rtol=1e-6)


def test_autotuning_over_constexprs_persists_the_winner(rng, isolated_disk_cache):
  shape = (32, 128)
  a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
  f = jmf.mosaic_kernel(jmf.cute_kernel(K.axpy, alpha=2.0), jax.ShapeDtypeStruct(shape, jnp.float32),
                        configs=[{"threads": 64}, {"threads": 256}])
  before = jmf.kernel_cache_stats()
  np.testing.assert_allclose(np.asarray(jax.jit(f)(a, b)), 2 * a + b, rtol=1e-5)
  after = jmf.kernel_cache_stats()
  assert after.autotune_tunings - before.autotune_tunings == 1 and after.compiles["cute"] - before.compiles["cute"] == 2
  # A fresh process finds the winner and its object on disk: it times and compiles nothing.
  inputs = isolated_disk_cache.parent / "ab.npy"
  np.save(inputs, np.stack([a, b]))
  result = fresh_process.run(TUNED, inputs, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}).result
  assert result["max_error"] < 1e-5 * np.max(np.abs(2 * a + b)), result
  assert (result["tunings"], result["autotune_disk_hits"], result["compiles"]) == (0, 1, 0), result


TUNED = '''
  import json, sys
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  import cute_kernels as K
  a, b = np.load(sys.argv[1])
  f = jmf.mosaic_kernel(jmf.cute_kernel(K.axpy, alpha=2.0), jax.ShapeDtypeStruct(a.shape, jnp.float32),
                        configs=[{"threads": 64}, {"threads": 256}])
  got = np.asarray(jax.jit(f)(a, b))
  s = jmf.kernel_cache_stats()
  print(json.dumps({"max_error": float(np.max(np.abs(got - (2 * a + b)))), "tunings": s.autotune_tunings,
                    "autotune_disk_hits": s.autotune_disk_hits, "compiles": s.compiles["cute"]}))
'''


MISMATCH = '''
  import json
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  from jax_mosaic_ffi.base.native import core
  import cute_kernels as K
  jmf.register()
  found = cute_package.runtime()
  core.set_cute_dsl_runtime(str(found.library), "4.7.0")  # as if another release were installed
  f = jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct((256,), jnp.float32)))
  try:
    f(np.zeros(256, np.float32)).block_until_ready()
    message = ""
  except Exception as e:
    message = str(e)
  print(json.dumps({"message": message}))
'''


def test_an_object_of_another_release_is_refused_naming_both(tmp_path):
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}
  message = fresh_process.run(MISMATCH, env=env).result["message"]
  assert "4.7.0" in message and "compiled by CuTe DSL" in message, message


CRAFTED = '''
  import hashlib, json, sys
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  import cute_objects as objects
  # A program carrying a crafted CuTe DSL object, as an edited jax.export artifact would: the custom call built by
  # hand, its module written without the package's writer (which would refuse it). Its instantiate must refuse it
  # by name before NVIDIA's runtime sees it (which aborts the process on some: a missing entry point throws).
  jmf.register()
  obj = {"gcc": lambda: objects.gcc_object(__import__("pathlib").Path(sys.argv[2])),
         "zeroed body": lambda: objects.zeroed_body(objects.real_object()),
         "zeroed data": lambda: objects.zeroed_sections(objects.real_object()),
         "no kernel table": lambda: objects.renamed(objects.real_object(), "jmf_cute_kernel_info"),
         "no cuda init": lambda: objects.renamed(objects.real_object(), "_mlir_jmf_cute_cuda_init"),
         "another hash": objects.real_object}[sys.argv[1]]()
  module = objects.module(obj, kinds=(1, 2, 1, 2))
  digest = hashlib.sha256(module + (b"edited" if sys.argv[1] == "another hash" else b"")).digest()
  call = jax.ffi.ffi_call("jax_mosaic_ffi_cute_v1", jax.ShapeDtypeStruct((256,), jnp.float32))
  i32 = lambda *v: np.array(v, np.int32)
  try:
    jax.jit(lambda x: call(x, module=module, kernel_hash=digest, grid=i32(1, 1, 1), block=i32(1, 1, 1),
                           cluster=i32(1, 1, 1), num_inputs=np.int32(1), num_outputs=np.int32(1),
                           param_order=np.zeros(0, np.int32), host_args=i32(1, 0, 0, 2, 0, 0, 1, 1, 0, 2, 1, 0)))(
        np.zeros(256, np.float32)).block_until_ready()
    message = ""
  except Exception as e:
    message = str(e)
  print(json.dumps({"message": message}))
'''


@pytest.mark.parametrize("crafted, expected", [
    ("gcc", "it does not define '_mlir_jmf_cute_cuda_init', which NVIDIA's runtime looks up"),
    ("zeroed body", "CuTe DSL object 0 is refused before NVIDIA's runtime would link it into this process: "),
    ("zeroed data", "its object format version is ''; the runtime reads 1.0 and 1.1"),
    ("no kernel table", "it does not define 'jmf_cute_kernel_info'"),
    ("no cuda init", "it does not define '_mlir_jmf_cute_cuda_init'"),
    ("another hash", "kernel_hash is not the sha256 of the module the call carries"),
])
def test_a_crafted_object_in_a_jitted_program_is_refused_by_name_not_an_abort(tmp_path, crafted, expected):
  # In a child process: an abort (SIGABRT in NVIDIA's runtime) fails the run instead of the test session.
  result = fresh_process.run(CRAFTED, crafted, str(tmp_path),
                             env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert expected in result["message"] and "mosaic_kernel" in result["message"], result


EXPORT_ADD_ONE = '''
  import json, sys
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  import cute_kernels as K
  x = np.load(sys.argv[2])
  f = jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct(x.shape, x.dtype)))
  exported = jax.export.export(f, platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(
      jax.ShapeDtypeStruct(x.shape, x.dtype))
  open(sys.argv[1], "wb").write(exported.serialize())
  print(json.dumps({}))
'''

RUN_EXPORTED = '''
  import json, sys
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  import cute_kernels as K
  x = np.load(sys.argv[2])
  jmf.register()
  out = {}
  if sys.argv[3] == "lowered here too":  # this process lowers (and runs) the same program first
    f = jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct(x.shape, x.dtype)))
    out["own_error"] = float(np.max(np.abs(np.asarray(f(x)) - (x + 1))))
  exported = jax.export.deserialize(open(sys.argv[1], "rb").read())
  try:
    out["error"] = float(np.max(np.abs(np.asarray(exported.call(x)) - (x + 1))))
  except Exception as e:
    out["message"] = str(e)
  print(json.dumps(out))
'''


@pytest.mark.parametrize("policy", [None, "any", "lowered", "lowered here too"])
def test_host_code_policy_refuses_objects_this_process_did_not_lower(rng, tmp_path, policy):
  # The artifact is made by another process, as a downloaded one would be; outputs are poisoned (a kernel that
  # did not run reads as NaN).
  x = rng.standard_normal(4096).astype(np.float32)
  np.save(tmp_path / "x.npy", x)
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache"), "JAX_MOSAIC_FFI_POISON_OUTPUTS": "1"}
  fresh_process.run(EXPORT_ADD_ONE, str(tmp_path / "add.bin"), str(tmp_path / "x.npy"), env=env)
  if policy is not None:
    env["JAX_MOSAIC_FFI_HOST_CODE"] = "lowered" if policy.startswith("lowered") else policy
  r = fresh_process.run(RUN_EXPORTED, str(tmp_path / "add.bin"), str(tmp_path / "x.npy"), str(policy),
                        env=env).result
  if policy == "lowered":
    assert "HostCodeRefused: the kernel's CuTe DSL object" in r["message"] and "error" not in r, r
  else:  # the default (any), any, or the same kernel lowered here: its bytes are this process's own
    assert r.get("error", 1) < 1e-6 and r.get("own_error", 0) < 1e-6, r


def test_a_persistent_cache_entry_runs_under_the_policy_once_this_process_lowered_it(rng, tmp_path):
  # jax lowers a program before it looks it up in its persistent compilation cache, and lowering notes the
  # kernel: a cached executable of a program this process traced runs with JAX_MOSAIC_FFI_HOST_CODE=lowered.
  x = rng.standard_normal(4096).astype(np.float32)
  np.save(tmp_path / "x.npy", x)
  script = '''
    import json, sys
    import jax, numpy as np
    jax.config.update("jax_compilation_cache_dir", sys.argv[2])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import jax_mosaic_ffi as jmf
    import cute_kernels as K
    x = np.load(sys.argv[1])
    f = jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct(x.shape, x.dtype)))
    print(json.dumps({"error": float(np.max(np.abs(np.asarray(f(x)) - (x + 1))))}))
  '''
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache"), "JAX_MOSAIC_FFI_POISON_OUTPUTS": "1"}
  first = fresh_process.run(script, str(tmp_path / "x.npy"), str(tmp_path / "xla"), env=env).result
  assert any((tmp_path / "xla").iterdir()), "no persistent cache entry was written"
  second = fresh_process.run(script, str(tmp_path / "x.npy"), str(tmp_path / "xla"),
                             env={**env, "JAX_MOSAIC_FFI_HOST_CODE": "lowered"}).result
  assert first["error"] < 1e-6 and second["error"] < 1e-6, (first, second)
