"""Triton kernels through our runtime: compile (any machine), lower, cache, export, run (GPU)."""

import os
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from triton_required import import_triton

triton = import_triton()

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.triton.compiler import compile as triton_lib
from jax_mosaic_ffi.triton.compiler import release as triton_release
from jax_mosaic_ffi.base.module_format import ImageKind

import fresh_process
import triton_sources as ts
from hlo_inspect import custom_calls, lower

gpu = pytest.mark.gpu
TESTS = os.path.dirname(os.path.abspath(__file__))


def add_call(kernel=None, block=1024):
  kernel = kernel or jmf.triton_kernel(ts.add, constexprs={"BLOCK": block})
  return jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                           scalars=lambda meta, x, y: (np.int32(x.size),))


def matmul_call(**options):
  return jmf.mosaic_kernel(
      jmf.triton_kernel(ts.matmul, **options), lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
      grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], meta["BM"]), jmf.cdiv(b.shape[1], meta["BN"])),
      scalars=lambda meta, a, b: (np.int32(a.shape[0]), np.int32(b.shape[1]), np.int32(a.shape[1])))


def stats():
  return jmf.kernel_cache_stats()


# ---------------------------------------------------------------- any machine

def test_compiles_to_a_kernel_for_an_explicit_target_without_a_gpu(isolated_disk_cache):
  before = stats().compiles["triton"]
  kernel = jmf.triton_kernel(ts.add, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"},
                             constexprs={"BLOCK": 256}, targets=["sm_90"])
  assert isinstance(kernel, jmf.Kernel) and isinstance(kernel, jmf.TritonKernel)
  kinds = {(image.kind, image.arch.sm) for image in kernel.images}
  assert kinds == {(ImageKind.CUBIN, "sm_90a"), (ImageKind.PTX, "sm_90a")}
  # The function's four parameters, then Triton's global and profile scratch pointers.
  assert kernel.param_sizes == (8, 8, 8, 4, 8, 8)
  assert kernel.info.num_warps == 4 and kernel.info.scratch == ((0, 1), (0, 1))
  assert stats().compiles["triton"] == before + 1


def test_tritons_own_settings_are_in_the_cache_key(isolated_disk_cache, monkeypatch):
  monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)

  def ptx():
    kernel = jmf.triton_kernel(ts.axpy, signature=["*fp32", "*fp32", "*fp32", "fp32", "i32"],
                               constexprs={"BLOCK": 256}, targets=["sm_90"])
    return next(image.data.decode() for image in kernel.images if image.kind == ImageKind.PTX)

  fused = ptx()
  assert "fma.rn.f32" in fused
  before = stats()
  # A knob in Triton's own cache key: the same function and options now compile to separate mul and add.
  monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
  jmf.clear_kernel_cache()
  unfused = ptx()
  assert "fma.rn.f32" not in unfused and "mul.rn.f32" in unfused
  assert stats().compiles["triton"] == before.compiles["triton"] + 1
  monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
  jmf.clear_kernel_cache()
  assert ptx() == fused
  after = stats()
  assert after.compiles["triton"] == before.compiles["triton"] + 1 and after.disk_hits == before.disk_hits + 1


def test_a_compile_pins_fp_fusion_on_without_tritons_warning(tmp_path, monkeypatch):
  # Triton 3.9 warns at a process's first compile that leaves fp fusion to its default (which 3.10 turns off): every
  # compile gives it explicitly, on as in every supported Triton, so nothing is said and the kernel still fuses.
  script = """
      import json, os, warnings
      warnings.simplefilter("always")
      import jax_mosaic_ffi as jmf
      from jax_mosaic_ffi.base.module_format import ImageKind
      import triton_sources as ts
      with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        kernel = jmf.triton_kernel(ts.axpy, signature=["*fp32", "*fp32", "*fp32", "fp32", "i32"],
                                   constexprs={"BLOCK": 256}, targets=["sm_90"])
      ptx = next(image.data.decode() for image in kernel.images if image.kind == ImageKind.PTX)
      print(json.dumps({"said": [str(w.message) for w in said if "FP_FUSION" in str(w.message)],
                        "fused": "fma.rn.f32" in ptx, "env": "TRITON_DEFAULT_FP_FUSION" in os.environ}))
  """
  monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
  r = fresh_process.run(script, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache"),
                                     "TRITON_CACHE_DIR": str(tmp_path / "triton")})
  assert r.result == {"said": [], "fused": True, "env": False}, r.stderr[-3000:]


def test_the_launch_comes_from_triton_metadata(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((5000,), jnp.float32)
  (cc,) = custom_calls(lower(add_call(), x, x))
  config = cc["config"]
  assert config["grid"] == [5, 1, 1] and config["block"] == [128, 1, 1] and config["cluster"] == [1, 1, 1]
  assert config["uses_pdl"] is False
  # in0, in1, out0, n, then the two scratch pointers as null u64 scalars.
  assert config["param_order"] == [0, 1, 2, -1, -2, -3]
  assert config["scalar_sizes"] == [4, 8, 8]
  assert config["scalar_data"][8:] == bytes(16)
  assert cc["operands"] == 2 and cc["results"] == 1
  kernel = jmf.triton_kernel(ts.matmul, constexprs={"BM": 64, "BN": 64, "BK": 32}, num_warps=8, num_stages=2)
  a = jax.ShapeDtypeStruct((256, 128), jnp.float16)
  (cc,) = custom_calls(lower(matmul_call(constexprs={"BM": 64, "BN": 64, "BK": 32}, num_warps=8, num_stages=2),
                             a, jax.ShapeDtypeStruct((128, 192), jnp.float16)))
  assert cc["config"]["block"] == [256, 1, 1] and cc["config"]["grid"] == [4, 3, 1]
  assert cc["config"]["smem_bytes"] > 0
  assert "kernel" in repr(kernel) or kernel.name == "matmul"


def test_the_signature_is_read_from_each_call(isolated_disk_cache):
  before = stats()
  call = add_call()
  for dtype in (jnp.float32, jnp.float16, jnp.float32):
    x = jax.ShapeDtypeStruct((300,), dtype)
    lower(call, x, x)
  s = stats()
  assert s.compiles["triton"] - before.compiles["triton"] == 2


def test_a_fresh_process_compiles_nothing_and_exports(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((4096,), jnp.float32)
  before = stats().compiles["triton"]
  (first,) = custom_calls(lower(add_call(), x, x))
  assert stats().compiles["triton"] == before + 1
  script = """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    import triton_sources as ts
    from hlo_inspect import custom_calls
    x = jax.ShapeDtypeStruct((4096,), jnp.float32)
    call = jmf.mosaic_kernel(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 1024}), x,
                             grid=lambda meta, x, y: x.size // meta["BLOCK"],
                             scalars=lambda meta, x, y: (np.int32(x.size),))
    (cc,) = custom_calls(jax.jit(call).trace(x, x).lower(lowering_platforms=("cuda",)))
    exported = jax.export.export(jax.jit(call), platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(x, x)
    s = jmf.kernel_cache_stats()
    print(json.dumps({"hash": cc["config"]["kernel_hash"].hex(), "triton": s.compiles["triton"], "disk": s.disk_hits,
                      "bytes": len(exported.serialize())}))
  """
  result = fresh_process.run(script, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}).result
  assert result["triton"] == 0 and result["disk"] == 1
  assert result["hash"] == first["config"]["kernel_hash"].hex() and result["bytes"] > 0


def test_global_scratch_becomes_an_output_xla_allocates(isolated_disk_cache):
  kernel = jmf.triton_kernel(ts.descriptor_copy, constexprs={"BM": 32, "BN": 64})
  call = jmf.mosaic_kernel(kernel, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x: (x.shape[0] // meta["BM"], x.shape[1] // meta["BN"]),
                           scalars=lambda meta, x: (np.int32(x.shape[0]), np.int32(x.shape[1])))
  m = jax.ShapeDtypeStruct((128, 128), jnp.float32)
  lowered = lower(call, m)
  (cc,) = custom_calls(lowered)
  assert cc["results"] == 2  # the output, then the scratch
  # in0, out0, M, N, global scratch (output 1), null profile scratch.
  assert cc["config"]["param_order"] == [0, 1, -1, -2, 2, -3]
  # The compile cache holds NVRTC and Triton compiles alike: the Triton kernel of that name.
  (kernel,) = [k for k in (found.value for found in stack.MEMORY.entries("compile"))
              if isinstance(k, triton_lib.TritonKernel) and k.name == "descriptor_copy"]
  size = kernel.info.scratch[0][0] * 4 * 2  # per program, 4 x 2 programs
  assert size > 0 and f"tensor<{size}xui8>" in lowered.as_text()


def test_zero_outputs_and_aliases_lower_to_the_contract(isolated_disk_cache):
  kernel = jmf.triton_kernel(ts.row_sums_atomic, constexprs={"BLOCK": 128})
  call = jmf.mosaic_kernel(kernel, lambda x: jax.ShapeDtypeStruct((x.shape[0],), x.dtype),
                           grid=lambda meta, x: (x.shape[0], jmf.cdiv(x.shape[1], meta["BLOCK"])),
                           scalars=lambda meta, x: (np.int32(x.shape[0]), np.int32(x.shape[1])), zero_outputs=True)
  lowered = lower(call, jax.ShapeDtypeStruct((64, 300), jnp.float32))
  (cc,) = custom_calls(lowered)
  assert cc["operands"] == 1 and cc["results"] == 1  # the runtime zeroes out0 before each launch
  assert cc["config"]["param_order"][:2] == [0, 1]
  assert cc["config"]["zero_outputs"] == [0]
  scale = jmf.mosaic_kernel(jmf.triton_kernel(ts.scale_in_place, constexprs={"BLOCK": 256}),
                            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            grid=lambda meta, x: jmf.cdiv(x.size, 256),
                            scalars=lambda meta, x: (np.int32(x.size), np.float32(3)), input_output_aliases={0: 0},
                            param_order=("out0", "scalar0", "scalar1"))
  (cc,) = custom_calls(lower(scale, jax.ShapeDtypeStruct((1000,), jnp.float32)))
  assert cc["config"]["param_order"] == [1, -1, -2, -3, -4]


def test_mistakes_are_named(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  with pytest.raises(jmf.LaunchError, match="takes 4 non-constexpr parameters.*passes 3"):
    lower(jmf.mosaic_kernel(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 256}), x, grid=1), x, x)
  with pytest.raises(jmf.LaunchError, match="takes no block"):
    jmf.mosaic_kernel(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 256}), x, grid=1, block=128)
  with pytest.raises(ValueError, match="no value for the constexpr parameter.*BLOCK"):
    lower(add_call(jmf.triton_kernel(ts.add)), x, x)
  with pytest.raises(ValueError, match="'BLOK' is not one of its tl.constexpr"):
    jmf.triton_kernel(ts.add, constexprs={"BLOK": 1})
  with pytest.raises(jmf.TritonUnavailable, match=r"supports Triton >= 3.6, < 3.10.*Triton 3.2.0 is installed"):
    triton_release.check_version("3.2.0")
  with pytest.raises(TypeError, match="needs a @triton.jit function"):
    jmf.triton_kernel(lambda x: x)
  scale = jmf.triton_kernel(ts.scale_in_place, constexprs={"BLOCK": 256})
  with pytest.raises(jmf.LaunchError, match="zero_outputs names output 0, which an input aliases"):
    lower(jmf.mosaic_kernel(scale, x, grid=1, scalars=lambda meta, x: (np.int32(x.size), np.float32(3)),
                            input_output_aliases={0: 0}, param_order=("out0", "scalar0", "scalar1"),
                            zero_outputs=(0,)), x)
  fixed = jmf.triton_kernel(ts.add, signature=["*fp16", "*fp16", "*fp16", "i32"], constexprs={"BLOCK": 256})
  with pytest.raises(jmf.LaunchError, match="compiled for"):
    lower(add_call(fixed), x, x)


def test_clusters_before_hopper_are_refused_by_name_for_every_front_end(isolated_disk_cache):
  # num_ctas > 1 launches clusters, which GPUs before sm_90 have not: refused before Triton compiles anything.
  refusal = ("triton_kernel 'add': num_ctas > 1 unsupported before Hopper (compute capability 90); the target is "
             "sm_80: pass num_ctas=1 (or a config without num_ctas), or compile for sm_90 or newer (triton_kernel's "
             "targets=, triton_call's compute_capability=)")
  before = stats().compiles["triton"]
  with pytest.raises(ValueError, match=re.escape(refusal)):  # compiled now
    jmf.triton_kernel(ts.add, signature=["*fp32", "*fp32", "*fp32", "i32"], constexprs={"BLOCK": 256}, num_ctas=2,
                      targets=["sm_80"])
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  with pytest.raises(ValueError, match=re.escape(refusal)):  # compiled when the call is traced
    lower(add_call(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 256}, num_ctas=2, targets=["sm_80"])), x, x)
  with pytest.raises(ValueError, match=re.escape(refusal.replace("sm_80", "sm_80, sm_90"))):  # one target of two
    lower(add_call(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 256}, num_ctas=2, targets=["sm_80", "sm_90"])),
          x, x)
  one_config = triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_ctas=2)], key=["n"])(ts.add)
  with pytest.raises(ValueError, match=re.escape(refusal)):  # a config's num_ctas
    lower(add_call(jmf.triton_kernel(one_config, targets=["sm_80"])), x, x)
  assert stats().compiles["triton"] == before
  clustered = jmf.triton_kernel(ts.add, signature=["*fp32", "*fp32", "*fp32", "i32"], constexprs={"BLOCK": 256},
                                num_ctas=2, targets=["sm_90"])
  assert clustered.info.num_ctas == 2


def test_a_triton_compile_failure_names_triton_its_message_and_the_config(isolated_disk_cache):
  # The frontend refuses a block of 255 (not a power of 2); ptxas refuses bogus inline PTX (Triton's backend).
  with pytest.raises(jmf.CompileError) as caught:
    jmf.triton_kernel(ts.add, signature=["*fp32", "*fp32", "*fp32", "i32"], constexprs={"BLOCK": 255},
                      num_warps=2, targets=["sm_90"])
  message = str(caught.value)
  assert message.startswith("Triton could not compile kernel 'add' for sm_90 with num_warps=2, num_stages=3, "
                            "num_ctas=1, BLOCK=255; signature (*fp32, *fp32, *fp32, i32) (called at "
                            "test_triton.py:"), message
  assert re.search(r"\(called at test_triton\.py:\d+ \(test_a_triton_compile_failure_names_triton_its_message_and_the_"
                   r"config\)\):\nCompilationError", message), message
  assert "arange's range must be a power of 2" in message and "NVRTC" not in message
  assert caught.value.compiler == "Triton"
  with pytest.raises(jmf.CompileError) as caught:
    jmf.triton_kernel(ts.bogus_asm, signature=["*fp32", "*fp32"], constexprs={"BLOCK": 128}, targets=["sm_90"])
  message = str(caught.value)
  assert message.startswith("Triton could not compile kernel 'bogus_asm' for sm_90 with num_warps=4"), message
  assert "Not a name of any known instruction: 'bogus'" in message and "NVRTC" not in message


def fill_warps_call(kernel, n, **options):
  return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.int32), grid=lambda meta: jmf.cdiv(n, meta["BLOCK"]),
                           scalars=(np.int32(n),), **options)


def test_a_constexpr_named_like_a_launch_option_takes_its_value(isolated_disk_cache):
  def block_of(call):
    (found,) = custom_calls(jax.jit(call).trace().lower(lowering_platforms=("cuda",)))
    return found["config"]["block"][0]
  # As Triton's launcher binds `num_warps=8` to the option and to the parameter: no constexpr to give.
  kernel = jmf.triton_kernel(ts.fill_warps, constexprs={"BLOCK": 256}, num_warps=8)
  assert block_of(fill_warps_call(kernel, 1000)) == 256
  assert block_of(fill_warps_call(jmf.triton_kernel(ts.fill_warps, constexprs={"BLOCK": 256}), 1000)) == 128
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # no GPU: the autotuner takes the first config, and says so
    configs = [dict(BLOCK=128, num_warps=2), dict(BLOCK=64, num_warps=1)]
    assert block_of(fill_warps_call(jmf.triton_kernel(ts.fill_warps), 1000, configs=configs)) == 64
  with pytest.raises(ValueError, match="constexpr parameter 'num_warps' takes the launch option's value.*pass "
                                       "num_warps= itself"):
    jmf.triton_kernel(ts.fill_warps, constexprs={"BLOCK": 256, "num_warps": 8})


def test_what_native_code_prints_on_stderr_is_kept_and_passed_on(capfd):
  import ctypes
  from jax_mosaic_ffi.base import native_stderr
  libc = ctypes.CDLL(None)
  text = b"error: a pass failed (written by native code)\n"
  with native_stderr.captured() as printed:
    libc.write(2, text, len(text))
  assert printed.text == text.decode()
  assert capfd.readouterr().err == text.decode()  # passed on unchanged once the block ends


def test_triton_extra_is_declared():
  import tomllib
  with open(os.path.join(os.path.dirname(TESTS), "pyproject.toml"), "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  low, high = triton_release.SUPPORTED_TRITON
  assert any(dep.startswith(f"triton>={low[0]}.{low[1]},<{high[0]}.{high[1]};") for dep in extras["triton"])
  # CI compiles and lowers with the newest (the README venv) and the oldest (pinned in the second venv).
  assert f"JMF_TRITON={low[0]}.{low[1]}.0" in open(os.path.join(os.path.dirname(TESTS), ".ci", "run")).read()


# ---------------------------------------------------------------- GPU

@gpu
def test_add_runs_for_each_dtype(rng, isolated_disk_cache):
  call = jax.jit(add_call())
  for dtype, n in ((np.float32, 5003), (np.float16, 70000)):
    x, y = (rng.standard_normal(n).astype(dtype) for _ in range(2))
    np.testing.assert_allclose(np.asarray(call(x, y)), x + y, rtol=1e-3)


@gpu
def test_matmul_matches_numpy(rng, isolated_disk_cache):
  a = rng.standard_normal((300, 200)).astype(np.float16)
  b = rng.standard_normal((200, 130)).astype(np.float16)
  c = jax.jit(matmul_call(constexprs={"BM": 64, "BN": 64, "BK": 32}))(a, b)
  np.testing.assert_allclose(np.asarray(c, np.float32), a.astype(np.float32) @ b.astype(np.float32),
                             rtol=2e-2, atol=5e-2)


@gpu
def test_zeroed_outputs_accumulate_from_zero(rng, isolated_disk_cache):
  kernel = jmf.triton_kernel(ts.row_sums_atomic, constexprs={"BLOCK": 128})
  call = jax.jit(jmf.mosaic_kernel(kernel, lambda x: jax.ShapeDtypeStruct((x.shape[0],), x.dtype),
                                   grid=lambda meta, x: (x.shape[0], jmf.cdiv(x.shape[1], meta["BLOCK"])),
                                   scalars=lambda meta, x: (np.int32(x.shape[0]), np.int32(x.shape[1])),
                                   zero_outputs=(0,)))
  x = rng.standard_normal((64, 1000)).astype(np.float32)
  for _ in range(2):  # the output is poisoned before each launch: only the zeroing makes it right
    np.testing.assert_allclose(np.asarray(call(x)), x.sum(axis=1), rtol=1e-4, atol=1e-3)


@gpu
def test_in_place_update_through_aliases(rng, isolated_disk_cache):
  scale = jmf.mosaic_kernel(jmf.triton_kernel(ts.scale_in_place, constexprs={"BLOCK": 256}),
                            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            grid=lambda meta, x: jmf.cdiv(x.size, 256),
                            scalars=lambda meta, x: (np.int32(x.size), np.float32(3)), input_output_aliases={0: 0},
                            param_order=("out0", "scalar0", "scalar1"))
  x = rng.standard_normal(1000).astype(np.float32)
  np.testing.assert_allclose(np.asarray(jax.jit(scale, donate_argnums=0)(jnp.asarray(x))), 3 * x, rtol=1e-6)


@gpu
def test_global_scratch_kernel_runs(rng, isolated_disk_cache):
  kernel = jmf.triton_kernel(ts.descriptor_copy, constexprs={"BM": 32, "BN": 64})
  call = jax.jit(jmf.mosaic_kernel(kernel, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                   grid=lambda meta, x: (x.shape[0] // meta["BM"], x.shape[1] // meta["BN"]),
                                   scalars=lambda meta, x: (np.int32(x.shape[0]), np.int32(x.shape[1]))))
  x = rng.standard_normal((256, 192)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(call(x)), x)


@gpu
def test_a_warm_process_and_an_exported_artifact_run_without_triton(rng, isolated_disk_cache, tmp_path):
  x = rng.standard_normal(8192).astype(np.float32)
  call = add_call()
  exported = jax.export.export(jax.jit(call), platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(x, x)
  (tmp_path / "add.jax_export").write_bytes(exported.serialize())
  np.save(tmp_path / "x.npy", x)
  script = """
    import json, sys
    import jax, numpy as np
    import jax_mosaic_ffi as jmf
    x = np.load(sys.argv[1] + "/x.npy")
    jmf.register()  # what a process that only runs artifacts does (docs/guides/transformations.md, jax.export)
    exported = jax.export.deserialize(open(sys.argv[1] + "/add.jax_export", "rb").read())
    ok_export = bool(np.allclose(np.asarray(exported.call(x, x)), 2 * x))
    loaded_triton = "triton" in sys.modules
    import triton_sources as ts
    call = jmf.mosaic_kernel(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 1024}), lambda x, y: x,
                             grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                             scalars=lambda meta, x, y: (np.int32(x.size),))
    ok_warm = bool(np.allclose(np.asarray(jax.jit(call)(x, x)), 2 * x))
    s = jmf.kernel_cache_stats()
    print(json.dumps({"export": ok_export, "triton_imported_by_export": loaded_triton, "warm": ok_warm,
                      "triton": s.compiles["triton"], "disk": s.disk_hits}))
  """
  result = fresh_process.run(script, tmp_path,
                             env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}).result
  assert result == {"export": True, "triton_imported_by_export": False, "warm": True, "triton": 0, "disk": 1}


@gpu
def test_a_constexpr_named_like_a_launch_option_runs_with_its_value(rng):
  n = int(rng.integers(300, 3000))
  for warps in (2, 8):
    call = fill_warps_call(jmf.triton_kernel(ts.fill_warps, constexprs={"BLOCK": 256}, num_warps=warps), n)
    np.testing.assert_array_equal(np.asarray(jax.jit(call)()), np.full(n, warps))
