"""Triton kernels as Triton's own launcher compiles and launches them: integer and pointer specialization,
do_not_specialize / do_not_specialize_on_alignment, PDL for kernels that wait, fallback=, the version range.

Compiling and lowering needs no GPU; the GPU tests run strided views and a grouped matmul against numpy."""

import functools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from triton_required import import_triton

triton = import_triton()

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.triton.compiler import release as triton_release
from jax_mosaic_ffi.toolchain.compiled import param_sizes

import triton_sources as ts
from hlo_inspect import custom_calls, lower

gpu = pytest.mark.gpu


def lowered_call(fn, *avals):
  """The one custom call of ``fn``, its config, and the PTX of the module it carries."""
  (cc,) = custom_calls(lower(fn, *avals))
  parsed = module_format.parse(cc["config"]["module"])
  ptx = next(image.data.decode() for image in parsed.images if image.kind == ImageKind.PTX)
  return cc["config"], ptx, parsed


def global_loads(ptx: str) -> set[str]:
  return set(re.findall(r"ld\.global(?:\.\w+)*", ptx))


def int32_scalars(config, count: int) -> list[int]:
  """The first ``count`` scalars the launch passes (8 bytes each in scalar_data), as int32."""
  return [int(np.frombuffer(config["scalar_data"][8 * k:8 * k + 4], np.int32)[0]) for k in range(count)]


def vectorized(ptx: str) -> bool:
  return any(".v4." in load or ".v2." in load for load in global_loads(ptx))


# ---------------------------------------------------------------- a strided copy: x viewed with strides

BR, BC = 16, 64


def copy_call(fn, rows, cols, stride_r, stride_c, **options):
  """out[r, c] = x[r * stride_r + c * stride_c] for a flat x: any strided view of x (transposed, padded,
  contiguous), its strides passed as scalars the way Triton kernels take them."""
  kernel = jmf.triton_kernel(fn, constexprs={"BR": BR, "BC": BC})
  return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((rows, cols), jnp.float32),
                           grid=(jmf.cdiv(rows, BR), jmf.cdiv(cols, BC)),
                           scalars=(np.int32(rows), np.int32(cols), np.int32(stride_r), np.int32(stride_c)),
                           **options)


def flat(size):
  return jax.ShapeDtypeStruct((size,), jnp.float32)


def test_a_stride_of_one_is_compiled_in_and_not_passed(isolated_disk_cache):
  # Row stride 64 (16-divisible), column stride 1: Triton's launcher makes the 1 a constexpr and drops it from
  # the kernel's parameters, and knows each row starts 64 elements (256 bytes) apart: 128-bit loads.
  config, ptx, parsed = lowered_call(copy_call(ts.copy_2d, 100, 64, 64, 1), flat(100 * 64))
  assert vectorized(ptx), global_loads(ptx)
  # x, out, rows, cols, stride_r: stride_c is gone from the entry, then Triton's two scratch pointers.
  assert param_sizes(parsed) == (8, 8, 4, 4, 4, 8, 8)
  assert config["param_order"] == [0, 1, -1, -2, -3, -4, -5]
  assert config["scalar_sizes"] == [4, 4, 4, 8, 8]
  assert int32_scalars(config, 3) == [100, 64, 64]


def test_a_stride_of_sixteen_is_divisible_and_seventeen_is_not(isolated_disk_cache):
  _, sixteen, _ = lowered_call(copy_call(ts.copy_2d, 100, 64, 16, 1), flat(100 * 16 + 64))
  _, seventeen, parsed = lowered_call(copy_call(ts.copy_2d, 100, 64, 17, 1), flat(100 * 17 + 64))
  assert vectorized(sixteen), global_loads(sixteen)
  # Rows 17 floats apart are not 16-byte aligned: one element per load.
  assert not vectorized(seventeen) and global_loads(seventeen) == {"ld.global.b32"}
  assert param_sizes(parsed) == (8, 8, 4, 4, 4, 8, 8)  # 17 is passed, the 1 still is not
  # A transposed view: the row stride is the 1, and the column stride (64, the row count) is passed.
  config, _, _ = lowered_call(copy_call(ts.copy_2d, 64, 100, 1, 64), flat(100 * 64))
  assert config["scalar_sizes"] == [4, 4, 4, 8, 8]
  assert int32_scalars(config, 3) == [64, 100, 64]


def test_do_not_specialize_keeps_the_strides_as_written(isolated_disk_cache):
  config, ptx, parsed = lowered_call(copy_call(ts.copy_2d_unspecialized, 100, 64, 64, 1), flat(100 * 64))
  assert not vectorized(ptx), global_loads(ptx)
  assert param_sizes(parsed) == (8, 8, 4, 4, 4, 4, 8, 8)  # the stride of 1 is passed
  assert config["scalar_sizes"] == [4, 4, 4, 4, 8, 8]
  assert int32_scalars(config, 4) == [100, 64, 64, 1]


def test_do_not_specialize_on_alignment_drops_the_pointers_alignment(isolated_disk_cache):
  # The same strides as the vectorized case, but x's alignment is unknown: no wide loads from it.
  config, ptx, parsed = lowered_call(copy_call(ts.copy_2d_unaligned, 100, 64, 64, 1), flat(100 * 64))
  assert not vectorized(ptx), global_loads(ptx)
  assert param_sizes(parsed) == (8, 8, 4, 4, 4, 8, 8)  # the 1 is still specialized


def test_a_kernel_compiled_ahead_passes_every_stride(isolated_disk_cache):
  # signature= compiles before any value is known: a stride of 1 at the call stays a parameter.
  kernel = jmf.triton_kernel(ts.copy_2d, signature=["*fp32", "*fp32", "i32", "i32", "i32", "i32"],
                             constexprs={"BR": BR, "BC": BC})
  assert kernel.param_sizes == (8, 8, 4, 4, 4, 4, 8, 8)
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((100, 64), jnp.float32), grid=(7, 1),
                           scalars=(np.int32(100), np.int32(64), np.int32(64), np.int32(1)))
  config, _, _ = lowered_call(call, flat(100 * 64))
  assert int32_scalars(config, 4) == [100, 64, 64, 1]


def test_the_specialization_is_tritons_own(isolated_disk_cache):
  # What the compiler is given, beside what Triton's launcher would give it (its binder and _pack_args).
  from triton.backends.compiler import GPUTarget
  from triton.compiler import make_backend
  from jax_mosaic_ffi.triton.compiler import specialize as triton_specialize
  backend = make_backend(GPUTarget("cuda", 90, 32))
  types = ["*fp32", "*fp32", "i32", "i32", "i32", "i32"]
  spec = triton_specialize.specialize(ts.copy_2d, types, {2: np.int32(100), 3: np.int32(64), 4: np.int32(48),
                                                          5: np.int32(1)}, {"BR": 16, "BC": 64}, backend)
  assert spec.signature == {"x_ptr": "*fp32", "out_ptr": "*fp32", "rows": "i32", "cols": "i32", "stride_xr": "i32",
                            "stride_xc": "constexpr", "BR": "constexpr", "BC": "constexpr"}
  assert spec.constexprs == {(5,): 1, (6,): 16, (7,): 64}
  divisible = [["tt.divisibility", 16]]
  assert {k: v for k, v in spec.attrs.items() if v} == {(0,): divisible, (1,): divisible, (3,): divisible,
                                                         (4,): divisible}
  assert spec.dropped == (5,)
  # A kernel compiled ahead (signature=) knows no values: its integers are left unspecialized.
  ahead = triton_specialize.specialize(ts.copy_2d, types, {}, {"BR": 16, "BC": 64}, backend)
  assert ahead.dropped == () and {k: v for k, v in ahead.attrs.items() if v} == {(0,): divisible, (1,): divisible}


def test_a_specialization_is_asked_of_triton_once_then_read_from_the_disk_cache(isolated_disk_cache, monkeypatch):
  """A second process whose kernels are all cache hits does not run Triton's binder (Triton 3.6's imports torch,
  seconds where torch is installed); a different value class asks Triton again; a damaged entry is asked again."""
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "0")  # it counts Triton's answers: the audit asks on each hit
  from triton.backends.compiler import GPUTarget
  from triton.compiler import make_backend
  from jax_mosaic_ffi.base import disk_cache
  from jax_mosaic_ffi.store import compile_cache
  from jax_mosaic_ffi.triton.compiler import specialize as triton_specialize
  asked = []
  real = triton_specialize.specialize
  monkeypatch.setattr(triton_specialize, "specialize", lambda *a: asked.append(a) or real(*a))
  types = ["*fp32", "*fp32", "i32", "i32", "i32", "i32"]

  def answer(stride_c):
    values = {2: np.int32(100), 3: np.int32(64), 4: np.int32(48), 5: np.int32(stride_c)}
    return triton_specialize.specialize_cached(ts.copy_2d, types, values, {"BR": 16, "BC": 64}, "sm_90",
                                               lambda: make_backend(GPUTarget("cuda", 90, 32)))

  first = answer(1)
  assert len(asked) == 1 and first.dropped == (5,)
  compile_cache.clear_memory_cache()  # as in a new process: the specialization is in the one compile cache
  assert answer(1) == first and len(asked) == 1
  assert answer(3).dropped == () and len(asked) == 2
  # Every stored entry damaged: read as missing, asked again, and the answer is the same.
  for path in disk_cache.cache_dir().rglob("*"):
    if path.is_file():
      path.write_bytes(path.read_bytes()[:-7] + b"garbage")
  compile_cache.clear_memory_cache()
  assert answer(1) == first and len(asked) == 3
  assert triton_specialize._decode(b'{"signature": [{"tuple": [1, 2]}]}') is None
  assert triton_specialize._decode(triton_specialize._encode(first)) == first


def _crafted(first):
  """Ways a well-typed cached specialization can be wrong for the call (x, out, rows=100, cols=64,
  stride_xr=48, stride_xc=1 of copy_2d: parameters 0..5, then the constexprs BR and BC at 6 and 7)."""
  import dataclasses
  replace = functools.partial(dataclasses.replace, first) if first is not None else lambda **_: None
  signature = dict(first.signature) if first is not None else {}
  return {
      # stride_xr (48) compiled in as the constant 1, and not passed.
      "a dropped argument whose value is not 1": replace(
          dropped=(4, 5), signature={**signature, "stride_xr": "constexpr"},
          constexprs={**(first.constexprs if first else {}), (4,): 1}),
      "an index out of range": replace(dropped=(5, 99)),
      "a pointer index that is a scalar": replace(aligned=(0, 1, 2)),
      # rows (100) hinted as a multiple of 16.
      "a divisibility the value does not have": replace(
          attrs={**(first.attrs if first else {}), (2,): [["tt.divisibility", 16]]}),
      "a parameter of another kind": replace(signature={**signature, "rows": "i64"}),
      "another function's names": replace(signature={"y" + k: v for k, v in signature.items()}),
      "a constexpr of another value": replace(constexprs={**(first.constexprs if first else {}), (6,): 32}),
  }


@pytest.mark.parametrize("case", list(_crafted(None)))
def test_a_cached_specialization_that_does_not_fit_the_call_is_dropped_and_rebuilt(isolated_disk_cache, monkeypatch,
                                                                                    case):
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "0")  # it counts Triton's answers: the audit asks on each hit
  import hashlib
  from triton.backends.compiler import GPUTarget
  from triton.compiler import make_backend
  from jax_mosaic_ffi.base import disk_cache
  from jax_mosaic_ffi.store import compile_cache
  from jax_mosaic_ffi.triton.compiler import specialize as triton_specialize
  asked = []
  real = triton_specialize.specialize
  monkeypatch.setattr(triton_specialize, "specialize", lambda *a: asked.append(a) or real(*a))
  types = ["*fp32", "*fp32", "i32", "i32", "i32", "i32"]
  values = {2: np.int32(100), 3: np.int32(64), 4: np.int32(48), 5: np.int32(1)}

  def answer():
    return triton_specialize.specialize_cached(ts.copy_2d, types, values, {"BR": 16, "BC": 64}, "sm_90",
                                               lambda: make_backend(GPUTarget("cuda", 90, 32)))

  compile_cache.clear_memory_cache()
  first = answer()
  assert len(asked) == 1 and first.dropped == (5,)
  (path,) = [p for p in disk_cache.cache_dir().rglob("*.bin") if b'"dropped"' in p.read_bytes()]
  payload = triton_specialize._encode(_crafted(first)[case])
  assert triton_specialize._decode(payload) is not None, case  # well-typed: it reads back
  path.write_bytes(disk_cache._ENTRY_HEADER.pack(disk_cache._ENTRY_MAGIC, len(payload),
                                                 hashlib.sha256(payload).digest()) + payload)
  compile_cache.clear_memory_cache()  # as in a new process
  assert answer() == first and len(asked) == 2, case  # asked of Triton again, not taken as read
  assert disk_cache.load(path.stem) == triton_specialize._encode(first)  # and the entry rebuilt
  compile_cache.clear_memory_cache()
  assert answer() == first and len(asked) == 2  # which is used from then on


def test_vmap_keeps_the_alignment_the_kernel_was_compiled_for(isolated_disk_cache):
  # Under vmap element i of a buffer is at i x its size: a pointer Triton took as 16-byte aligned must stay so.
  def batched(fn, size):
    return lower(jax.vmap(copy_call(fn, 100, 64, 64, 1)), jax.ShapeDtypeStruct((3, size), jnp.float32))

  (cc,) = custom_calls(batched(ts.copy_2d, 100 * 64))
  assert cc["config"]["batch_strides"] == [25600, 25600]
  with pytest.raises(jmf.LaunchError, match=r"mosaic_kernel 'copy_2d' .*under vmap each batch element of input 0 "
                                            r"starts 25612 bytes after the last, not a multiple of 16, but the kernel "
                                            r"was compiled taking its parameter 0 as 16-byte aligned.*"
                                            r"do_not_specialize_on_alignment"):
    batched(ts.copy_2d, 100 * 64 + 3)
  # Told not to assume x aligned, the same odd elements are fine (its output's 25600 bytes still are).
  (cc,) = custom_calls(batched(ts.copy_2d_unaligned, 100 * 64 + 3))
  assert cc["config"]["batch_strides"] == [25612, 25600]


def test_the_cache_keys_on_the_value_class(isolated_disk_cache):
  def compiles(stride_r, stride_c=1):
    before = jmf.kernel_cache_stats().compiles["triton"]
    lower(copy_call(ts.copy_2d, 100, 64, stride_r, stride_c), flat(100 * 200 + 6400))
    return jmf.kernel_cache_stats().compiles["triton"] - before

  assert compiles(64) == 1
  assert compiles(128) == 0 and compiles(16) == 0    # 16-divisible: the same kernel
  assert compiles(17) == 1
  assert compiles(19) == 0 and compiles(100) == 0    # neither 1 nor 16-divisible: the same kernel
  assert compiles(1, 100) == 1                       # the 1 moved to the other stride
  assert compiles(1, 200) == 0
  assert compiles(64, 2) == 1                        # no 1 at all


# ---------------------------------------------------------------- a grouped matmul as Triton's tutorial writes it

MATMUL = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}


def matmul_call(m, n, k, strides):
  """C (m x n, row-major) = A @ B with A and B read through ``strides`` = (am, ak, bk, bn) from flat inputs."""
  kernel = jmf.triton_kernel(ts.grouped_matmul, constexprs=MATMUL, num_warps=8, num_stages=3)
  return jmf.mosaic_kernel(
      kernel, jax.ShapeDtypeStruct((m, n), jnp.float16),
      grid=lambda meta, a, b: jmf.cdiv(m, meta["BLOCK_M"]) * jmf.cdiv(n, meta["BLOCK_N"]),
      scalars=tuple(np.int32(v) for v in (m, n, k, *strides, n, 1)))


def test_a_strided_matmul_compiles_as_tritons_launcher_compiles_it(isolated_disk_cache):
  a, b = jax.ShapeDtypeStruct((512 * 512,), jnp.float16), jax.ShapeDtypeStruct((512 * 512,), jnp.float16)
  config, ptx, parsed = lowered_call(matmul_call(512, 512, 512, (512, 1, 512, 1)), a, b)
  # 16-divisible leading strides: 16-byte asynchronous copies into shared memory, then wgmma.
  assert "cp.async.cg.shared.global" in ptx and "wgmma.mma_async" in ptx
  # Its three unit strides (ak, bn, cn) are compiled in: 12 parameters less 3, plus Triton's 2 scratch.
  assert len(param_sizes(parsed)) == 11
  assert config["block"] == [256, 1, 1] and config["grid"] == [16, 1, 1]
  # Leading strides of 511: rows not 16-byte aligned, element loads.
  odd = jax.ShapeDtypeStruct((512 * 511,), jnp.float16)
  _, unaligned, _ = lowered_call(matmul_call(511, 511, 511, (511, 1, 511, 1)), odd, odd)
  assert "cp.async.cg.shared.global" not in unaligned and "ld.global.b16" in global_loads(unaligned)


# ---------------------------------------------------------------- PDL

def add_call(fn, **options):
  return jmf.mosaic_kernel(jmf.triton_kernel(fn, constexprs={"BLOCK": 1024}),
                           lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                           scalars=lambda meta, x, y: (np.int32(x.size),), **options)


def test_a_kernel_that_waits_launches_with_pdl(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((5000,), jnp.float32)
  config, ptx, parsed = lowered_call(add_call(ts.add_after_wait), x, x)
  assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
  assert parsed.pdl_wait and config["uses_pdl"] is True
  (cc,) = custom_calls(lower(add_call(ts.add_after_wait, uses_pdl=False), x, x))
  assert cc["config"]["uses_pdl"] is False


def test_a_kernel_that_does_not_wait_never_launches_with_pdl(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((5000,), jnp.float32)
  config, ptx, parsed = lowered_call(add_call(ts.add), x, x)
  assert "griddepcontrol" not in ptx and not parsed.pdl_wait and config["uses_pdl"] is False
  with pytest.raises(jmf.LaunchError, match=r"uses_pdl=True, but the kernel does not wait for the previous kernel"
                                            r".*tl\.extra\.cuda\.gdc_wait\(\)"):
    lower(add_call(ts.add, uses_pdl=True), x, x)


# ---------------------------------------------------------------- fallback

def test_a_triton_call_runs_its_fallback_off_cuda(isolated_disk_cache):
  call = jax.jit(add_call(ts.add, fallback=lambda x, y: x + y))
  x = np.arange(3000, dtype=np.float32)
  with jax.default_device(jax.devices("cpu")[0]):
    np.testing.assert_array_equal(np.asarray(call(x, 2 * x)), 3 * x)
  # Triton's scratch outputs are the primitive's, not the fallback's: a kernel that has some runs its fallback too.
  copy = jmf.mosaic_kernel(jmf.triton_kernel(ts.descriptor_copy, constexprs={"BM": 32, "BN": 64}),
                           lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x: (x.shape[0] // meta["BM"], x.shape[1] // meta["BN"]),
                           scalars=lambda meta, x: (np.int32(x.shape[0]), np.int32(x.shape[1])),
                           fallback=lambda x: x * 1)
  m = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
  with jax.default_device(jax.devices("cpu")[0]):
    np.testing.assert_array_equal(np.asarray(jax.jit(copy)(m)), m)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(copy))(np.stack([m, -m]))), np.stack([m, -m]))


def test_without_a_fallback_the_message_advises_one_that_works(isolated_disk_cache):
  x = np.arange(3000, dtype=np.float32)
  with jax.default_device(jax.devices("cpu")[0]):
    with pytest.raises(NotImplementedError, match=r"mosaic_kernel 'add' .* runs only on CUDA GPUs.*"
                                                  r"mosaic_kernel\(\.\.\., fallback=fn\)") as info:
      jax.jit(add_call(ts.add))(x, x)
    # What the message advises is accepted: the same call with a fallback runs.
    advice = add_call(ts.add, fallback=lambda x, y: x + y)
    np.testing.assert_array_equal(np.asarray(jax.jit(advice)(x, x)), 2 * x)
  assert "test_triton_specialization.py" in str(info.value)


@pytest.mark.skipif(gpu_info.has_gpu(), reason="checks the fallback where there is no GPU to time the configs on")
def test_an_autotuned_triton_call_runs_its_fallback_off_cuda(isolated_disk_cache):
  call = jmf.mosaic_kernel(jmf.triton_kernel(ts.add), lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                           scalars=lambda meta, x, y: (np.int32(x.size),),
                           configs=[{"BLOCK": 256}, {"BLOCK": 1024}], fallback=lambda x, y: x - y)
  x = np.arange(3000, dtype=np.float32)
  compiles = jmf.kernel_cache_stats().compiles["triton"]
  with jax.default_device(jax.devices("cpu")[0]), warnings.catch_warnings():
    warnings.simplefilter("error")  # nothing to time, and nothing built: nothing to say
    np.testing.assert_array_equal(np.asarray(jax.jit(call)(x, 3 * x)), -2 * x)
  assert jmf.kernel_cache_stats().compiles["triton"] == compiles


def test_reference_mode_lowers_a_triton_calls_fallback_on_cuda(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_REFERENCE", "1")
  x = jax.ShapeDtypeStruct((3000,), jnp.float32)
  assert custom_calls(lower(add_call(ts.add, fallback=lambda x, y: x + y), x, x)) == []
  # Without one, the kernel itself is lowered, with a warning advising what the line above does.
  with pytest.warns(UserWarning, match=r"mosaic_kernel 'add' .*has no fallback, so the kernel itself runs; give "
                                       r"mosaic_kernel\(\.\.\., fallback=fn\)"):
    assert len(custom_calls(lower(add_call(ts.add), x, x))) == 1


def test_a_fallback_that_does_not_match_is_named(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((300,), jnp.float32)
  with pytest.raises(jmf.LaunchError, match=r"mosaic_kernel 'add' .*its fallback returns \(float16\[300\]\) but "
                                            r"the kernel's out_shape is \(float32\[300\]\)"):
    lower(add_call(ts.add, fallback=lambda x, y: (x + y).astype(jnp.float16)), x, x)
  with pytest.raises(TypeError, match=r"mosaic_kernel 'add': fallback must be a function"):
    add_call(ts.add, fallback=3)


def test_options_a_triton_kernel_does_not_take_say_why_and_what_instead():
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  kernel = jmf.triton_kernel(ts.add, constexprs={"BLOCK": 256})
  cases = (
      (dict(block=128), r"takes no block: Triton's metadata sets it \(32 x num_warps\); pass num_warps="),
      (dict(scratch_bytes=64), r"takes no scratch_bytes: Triton's metadata sets its scratch; for a buffer of your "
                               r"own add an output"),
      (dict(batch_grid_axis="y"), r"takes no batch_grid_axis: a Triton kernel's program ids are its own"),
  )
  for options, message in cases:
    with pytest.raises(jmf.LaunchError, match=r"mosaic_kernel 'add': a Triton kernel " + message):
      jmf.mosaic_kernel(kernel, x, grid=1, **options)


# ---------------------------------------------------------------- versions

@pytest.mark.parametrize("version", ["3.5.0", "3.5.2", "3.10.0", "4.0.0", "2.3.1"])
def test_versions_outside_the_range_are_refused_by_name(version):
  with pytest.raises(jmf.TritonUnavailable, match=re.escape(
      f"jmf.triton_kernel supports Triton >= 3.6, < 3.10 (tested: 3.6.0 to 3.9.0 compiling and lowering on CPU, "
      f"3.6.0 on an H200); Triton {version} is installed.") + r".*pip install 'jax_mosaic_ffi\[triton\]'"):
    triton_release.check_version(version)


@pytest.mark.parametrize("version", ["3.6.0", "3.7.0", "3.8.0", "3.9.0", "3.9.1", "3.7.0+gitabc"])
def test_versions_inside_the_range_are_accepted(version):
  triton_release.check_version(version)


@pytest.mark.parametrize("version", [triton.__version__])
def test_the_installed_triton_compiles_and_lowers(version, isolated_disk_cache):
  """Runs with whatever Triton is installed (CI: the newest in one venv, the oldest in the other)."""
  low, high = triton_release.SUPPORTED_TRITON
  assert low <= tuple(int(p) for p in version.split("+")[0].split(".")[:2]) < high
  x = jax.ShapeDtypeStruct((5000,), jnp.float32)
  config, ptx, parsed = lowered_call(add_call(ts.add), x, x)
  # Every supported release's entry: the non-constexpr parameters, then a global and a profile scratch pointer.
  assert param_sizes(parsed) == (8, 8, 8, 4, 8, 8)
  assert config["param_order"] == [0, 1, 2, -1, -2, -3] and config["block"] == [128, 1, 1]
  _, copy_ptx, _ = lowered_call(copy_call(ts.copy_2d, 100, 64, 64, 1), flat(100 * 64))
  assert vectorized(copy_ptx)


# ---------------------------------------------------------------- GPU

def strided_views(rng):
  """(name, flat buffer, rows, cols, stride_r, stride_c, the view as numpy sees it)."""
  base = rng.standard_normal(300 * 130).astype(np.float32)
  views = []
  for name, rows, cols, sr, sc in (("contiguous", 300, 128, 128, 1),   # a 1 and a 16-divisible stride
                                   ("padded", 300, 100, 130, 1),        # rows 130 apart: not 16-divisible
                                   ("padded16", 200, 100, 176, 1),      # rows 176 apart: 16-divisible, ragged cols
                                   ("transposed", 128, 300, 1, 128),    # the 1 on the row stride
                                   ("every-17th", 100, 20, 17 * 20, 17)):
    view = np.lib.stride_tricks.as_strided(base, (rows, cols), (sr * 4, sc * 4))
    views.append((name, base, rows, cols, sr, sc, np.array(view)))
  return views


@gpu
@pytest.mark.parametrize("fn", [ts.copy_2d, ts.copy_2d_unspecialized, ts.copy_2d_unaligned],
                         ids=lambda f: f.__name__)
def test_strided_views_copy_out_right_in_every_specialization(rng, isolated_disk_cache, fn):
  for name, base, rows, cols, sr, sc, expected in strided_views(rng):
    out = jax.jit(copy_call(fn, rows, cols, sr, sc))(base)
    np.testing.assert_array_equal(np.asarray(out), expected, err_msg=name)


@gpu
def test_grouped_matmul_on_strided_layouts_matches_numpy(rng, isolated_disk_cache):
  m, n, k = 384, 320, 256
  a = rng.standard_normal((m, k)).astype(np.float16)
  b = rng.standard_normal((k, n)).astype(np.float16)
  reference = a.astype(np.float32) @ b.astype(np.float32)
  pad = 16  # a padded leading dimension: k + 16 and n + 16 are 16-divisible, k + 17 and n + 17 are not
  layouts = {
      "row-major": (a.ravel(), b.ravel(), (k, 1, n, 1)),
      "A transposed": (a.T.copy().ravel(), b.ravel(), (1, m, n, 1)),
      "B transposed": (a.ravel(), b.T.copy().ravel(), (k, 1, 1, k)),
      "padded 16-divisible": (np.pad(a, ((0, 0), (0, pad))).ravel(), np.pad(b, ((0, 0), (0, pad))).ravel(),
                              (k + pad, 1, n + pad, 1)),
      "padded odd": (np.pad(a, ((0, 0), (0, pad + 1))).ravel(), np.pad(b, ((0, 0), (0, pad + 1))).ravel(),
                     (k + pad + 1, 1, n + pad + 1, 1)),
  }
  for name, (flat_a, flat_b, strides) in layouts.items():
    c = jax.jit(matmul_call(m, n, k, strides))(flat_a, flat_b)
    np.testing.assert_allclose(np.asarray(c, np.float32), reference, rtol=2e-2, atol=0.25, err_msg=name)


@gpu
def test_a_waiting_kernel_with_pdl_reads_what_the_previous_kernel_wrote(rng, isolated_disk_cache):
  # A chain of PDL launches, each reading the previous one's output: only the wait makes every link right.
  step = add_call(ts.add_after_wait)

  def chain(x, y):
    for _ in range(24):
      x = step(x, y)
    return x

  x = rng.standard_normal(1 << 20).astype(np.float32)
  y = rng.standard_normal(1 << 20).astype(np.float32)
  (cc,) = custom_calls(lower(step, x, y))
  assert cc["config"]["uses_pdl"] is True
  expected = x.copy()
  for _ in range(24):
    expected = expected + y
  np.testing.assert_allclose(np.asarray(jax.jit(chain)(x, y)), expected, rtol=1e-5, atol=1e-4)
