"""Gluon kernels (@gluon.jit) through mosaic_kernel, on any machine: Triton's own compile of them (Gluon's source,
its metadata, its calling convention), the launch it lowers to, the compile key (the code of a class passed as a
constexpr included), a warm process, export, vmap, gradients, sharding, fallbacks, autotuning, PDL and the errors.
Runs on every Triton we support (3.6 to 3.9); tests/test_gluon_gpu.py runs the kernels."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from triton_required import import_triton

triton = import_triton()

from triton.experimental.gluon import language as gl  # noqa: E402

import jax_mosaic_ffi as jmf  # noqa: E402
from jax_mosaic_ffi.base.module_format import ImageKind  # noqa: E402

import benchmarks_package  # noqa: E402
import fresh_process  # noqa: E402
import gluon_sources as gs  # noqa: E402
from hlo_inspect import UNTUNED_OK, custom_calls, f32, lower, only_call  # noqa: E402

pytestmark = UNTUNED_OK

G = benchmarks_package.kernels("gluon_user")
VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])
BLOCKED = gl.BlockedLayout([4], [32], [4], [0])
F16 = gl.NVMMASharedLayout.get_default_for


def add_call(kernel=None, **options):
  kernel = kernel or jmf.gluon_kernel(gs.add, constexprs={"XBLOCK": 512, "layout": BLOCKED})
  return jmf.mosaic_kernel(kernel, lambda a, b: a, grid=lambda meta, a, b: jmf.cdiv(a.size, meta["XBLOCK"]),
                           scalars=lambda meta, a, b: (np.int32(a.size),), **options)


def axpy_call(kernel=None, **options):
  kernel = kernel or jmf.gluon_kernel(gs.axpy, constexprs={"XBLOCK": 1024}, num_warps=8)
  return jmf.mosaic_kernel(kernel, lambda x, y: x, grid=lambda meta, x, y: jmf.cdiv(x.size, meta["XBLOCK"]),
                           scalars=lambda meta, x, y: (np.int32(x.size), np.float32(0.5)), **options)


def gemm_call(kernel, constexprs, block=(128, 256, 64), warps=8, **options):
  """C = A @ B through host descriptors of both inputs and the output, as Gluon's tutorials launch their GEMMs."""
  bm, bn, bk = block
  TD = jmf.TensorDescriptor
  return jmf.mosaic_kernel(
      jmf.gluon_kernel(kernel, constexprs=constexprs, num_warps=warps),
      lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
      grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], bm), jmf.cdiv(b.shape[1], bn)),
      param_order=(TD.from_tensor("in0", [bm, bk], layout=F16([bm, bk], gl.float16)),
                   TD.from_tensor("in1", [bk, bn], layout=F16([bk, bn], gl.float16)),
                   TD.from_tensor("out0", [bm, bn], layout=F16([bm, bn], gl.float16))), **options)


def ptx(kernel) -> str:
  return next(image.data.decode() for image in kernel.images if image.kind == ImageKind.PTX)


# ---------------------------------------------------------------- the compile

def test_mosaic_kernel_picks_the_gluon_front_end_by_the_kernels_type(isolated_disk_cache):
  import triton_sources as ts
  from jax_mosaic_ffi import api
  gluon = api.front_end_of(jmf.gluon_kernel(gs.add))
  assert gluon.name == "a Gluon kernel" and gluon.makers == ("gluon_kernel",)
  compiled = jmf.gluon_kernel(gs.copy_scalar, signature=["*fp32", "*fp32"], targets=["sm_90"])
  assert api.front_end_of(compiled) is gluon and {i.kind for i in compiled.images} <= set(gluon.image_kinds)
  assert api.front_end_of(jmf.triton_kernel(ts.add)).name == "a Triton kernel"


def test_a_gluon_kernel_compiles_without_a_gpu(isolated_disk_cache):
  before = jmf.kernel_cache_stats().compiles["triton"]
  kernel = jmf.gluon_kernel(gs.add, signature=["*fp32", "*fp32", "*fp32", "i32"],
                            constexprs={"XBLOCK": 512, "layout": BLOCKED}, targets=["sm_90"])
  assert isinstance(kernel, jmf.GluonKernel) and isinstance(kernel, jmf.TritonKernel)
  assert {(image.kind, image.arch.sm) for image in kernel.images} == {(ImageKind.CUBIN, "sm_90a"),
                                                                     (ImageKind.PTX, "sm_90a")}
  # The four parameters, then Triton's global and profile scratch pointers, as for a Triton kernel.
  assert kernel.param_sizes == (8, 8, 8, 4, 8, 8) and kernel.info.num_warps == 4
  assert jmf.kernel_cache_stats().compiles["triton"] == before + 1
  again = jmf.gluon_kernel(gs.add, signature=["*fp32", "*fp32", "*fp32", "i32"],
                           constexprs={"XBLOCK": 512, "layout": BLOCKED}, targets=["sm_90"])
  assert jmf.kernel_cache_stats().compiles["triton"] == before + 1 and ptx(again) == ptx(kernel)


def test_the_ptx_is_what_tritons_own_launcher_compiles(isolated_disk_cache):
  """Triton's launcher compiles a Gluon kernel from GluonASTSource with the signature its binder gives the
  arguments: a host descriptor's type with its layout, the ints and pointers specialized. Ours is the same code."""
  from triton.backends.compiler import GPUTarget
  from triton.compiler import make_backend
  from triton.experimental.gluon._runtime import GluonASTSource
  from triton.runtime.jit import create_function_from_signature

  class Tensor:  # what Triton's binder reads of a torch tensor: its address and dtype
    def __init__(self, shape, dtype):
      self.shape, self.dtype = shape, dtype

    def data_ptr(self):
      return 1 << 20

  layouts = [F16([128, 64], gl.float16), F16([64, 256], gl.float16), F16([128, 256], gl.float16)]
  bound_descriptors = []
  for (rows, cols), layout, block in zip([(1024, 512), (512, 1024), (1024, 1024)], layouts,
                                         [[128, 64], [64, 256], [128, 256]]):
    bound_descriptors.append(_gluon_descriptor(Tensor((rows, cols), "fp16"), [rows, cols], [cols, 1], block, layout))
  backend = make_backend(GPUTarget("cuda", 90, 32))
  fn = G.blocked_matmul_pipelined
  binder = create_function_from_signature(fn.signature, fn.params, backend)
  bound, specialization, _ = binder(*bound_descriptors, num_warps=8)
  _, signature, constexprs, attrs = fn._pack_args(backend, {}, bound, specialization, None)
  theirs = triton.compile(GluonASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 8})
  ours = jmf.gluon_kernel(fn, num_warps=8, targets=["sm_90"],
                          signature=[f"tensordesc<fp16{block},{layout!r}>" for block, layout in
                                     zip([[128, 64], [64, 256], [128, 256]], layouts)])
  assert ptx(ours) == theirs.asm["ptx"]
  assert ours.info.shared == theirs.metadata.shared and ours.info.num_warps == 8


def _gluon_descriptor(base, shape, strides, block, layout):
  from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
  return TensorDescriptor(base, shape, strides, block, layout)


def test_a_warp_specialized_kernel_launches_the_warps_tritons_metadata_says(isolated_disk_cache):
  call = jmf.mosaic_kernel(jmf.gluon_kernel(gs.ws_add_one, constexprs={"XBLOCK": 512}), lambda x: x,
                           grid=lambda meta, x: x.size // (2 * meta["XBLOCK"]))
  config = only_call(call, f32(4096))["config"]
  # Asked for 4 warps; the 1-warp worker makes Triton's metadata say more, which the block follows.
  assert config["grid"] == [4, 1, 1] and config["block"][0] == 32 * 8


def test_descriptors_in_the_kernel_get_tritons_global_scratch(isolated_disk_cache):
  call = jmf.mosaic_kernel(jmf.gluon_kernel(gs.tile_copy_device, constexprs={"M": 32, "N": 32}), lambda x: x, grid=1)
  cc = only_call(call, f32(32, 32))
  # The output, then the scratch: 128 bytes per descriptor per program, an extra output XLA allocates.
  assert cc["results"] == 2 and cc["config"]["param_order"][:3] == [0, 1, 2]


def test_a_num_warps_parameter_takes_the_launch_option(isolated_disk_cache):
  """Gluon's tutorials write `num_warps: gl.constexpr` and launch with `num_warps=8`: both get it."""
  for warps in (4, 8):
    call = axpy_call(jmf.gluon_kernel(gs.axpy, constexprs={"XBLOCK": 1024}, num_warps=warps))
    assert only_call(call, f32(5000), f32(5000))["config"]["block"] == [32 * warps, 1, 1]
  tuned = axpy_call(jmf.gluon_kernel(gs.axpy), configs=[dict(XBLOCK=2048, num_warps=2), dict(XBLOCK=256)])
  assert only_call(tuned, f32(5000), f32(5000))["config"]["block"] == [64, 1, 1]  # no GPU: the first config
  with pytest.raises(ValueError, match="gluon_kernel 'axpy': its constexpr parameter 'num_warps' takes the launch "
                                       "option's value"):
    jmf.gluon_kernel(gs.axpy, constexprs={"XBLOCK": 1024, "num_warps": 8})


def test_the_wgmma_gemms_lower_with_three_tensor_maps(isolated_disk_cache):
  a = jax.ShapeDtypeStruct((1024, 1024), jnp.float16)
  for kernel, constexprs in [(G.blocked_matmul_pipelined, {}),
                             (G.matmul_pipelined, {"MMAImpl": G.WGMMA, "num_buffers": 4})]:
    config = only_call(gemm_call(kernel, constexprs), a, a)["config"]
    assert config["grid"] == [8, 4, 1] and config["block"] == [256, 1, 1]
    assert len(config["tensor_maps"]) == 3 * 26 and config["smem_bytes"] > 48 * 1024


def test_pdl_follows_the_kernels_wait(isolated_disk_cache):
  waits = jmf.gluon_kernel(gs.add_after_wait, signature=["*fp32"] * 3 + ["i32"], constexprs={"XBLOCK": 512},
                           targets=["sm_90"])
  plain = jmf.gluon_kernel(gs.axpy, signature=["*fp32"] * 3 + ["i32", "fp32"], constexprs={"XBLOCK": 512},
                           targets=["sm_90"])
  assert waits.pdl_safe and "griddepcontrol.wait" in ptx(waits) and not plain.pdl_safe
  call = jmf.mosaic_kernel(jmf.gluon_kernel(gs.add_after_wait, constexprs={"XBLOCK": 512}), lambda a, b: a,
                           grid=lambda meta, a, b: jmf.cdiv(a.size, 512),
                           scalars=lambda meta, a, b: (np.int32(a.size),))
  assert only_call(call, f32(4096), f32(4096))["config"]["uses_pdl"]


def test_debug_prints_gluons_forms(isolated_disk_cache, capsys):
  jmf.gluon_kernel(gs.copy_scalar, signature=["*fp32", "*fp32"], options={"debug": True}, targets=["sm_90"])
  printed = capsys.readouterr().out
  assert "// ---- copy_scalar for sm_90: ttgir ----" in printed and ": ptx ----" in printed
  assert ": ttir ----" not in printed  # Gluon has no Triton IR: it is written at Triton's GPU level


# ---------------------------------------------------------------- the compile key


EDITED_OP = '''
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from gluon_sources import aggregate


@aggregate
class Op:
  value: gl.tensor

  @gluon.constexpr_function
  def __init__(self, value):
    self.value = value

  @gluon.jit
  def apply(x):
    return {body}
'''

COMPILE_WITH_OP = '''
  import hashlib, json, sys
  sys.path.insert(0, sys.argv[1])
  import jax_mosaic_ffi as jmf
  import edited_op, gluon_sources
  kernel = jmf.gluon_kernel(gluon_sources.apply_op, signature=["*fp32", "*fp32", "i32"],
                            constexprs={"Op": edited_op.Op, "XBLOCK": 512}, targets=["sm_90"])
  ptx = next(i.data.decode() for i in kernel.images if i.kind.name == "PTX")
  s = jmf.kernel_cache_stats()
  print(json.dumps({"compiles": s.compiles["triton"], "disk": s.disk_hits,
                    "ptx": hashlib.sha256(ptx.encode()).hexdigest(),
                    "times3": "0f40400000" in ptx, "plus5": "0f40A00000" in ptx}))
'''


def test_the_code_of_a_class_passed_as_a_constexpr_is_in_the_key(tmp_path):
  """07-persistence passes MMAImpl=WGMMA: Triton's own key holds the class's name, not its methods' code, so an
  edited method would come back compiled as before from a warm cache (Triton's or ours). Ours keys the code."""
  module = tmp_path / "edited_op.py"
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
         "PYTHONDONTWRITEBYTECODE": "1"}

  def compile_with(body):
    module.write_text(EDITED_OP.format(body=body))
    return fresh_process.run(COMPILE_WITH_OP, str(tmp_path), env=env).result

  first = compile_with("x * 3.0")
  assert first["compiles"] == 1 and first["times3"], first
  warm = compile_with("x * 3.0")
  assert warm["compiles"] == 0 and warm["disk"] >= 1 and warm["ptx"] == first["ptx"], warm
  edited = compile_with("x + 5.0")  # the same lines, one method's body changed
  assert edited["compiles"] == 1 and edited["plus5"] and not edited["times3"], edited


def test_constexpr_classes_and_instances_are_keyed_by_their_code_and_layouts_by_their_fields():
  from jax_mosaic_ffi.triton.compiler import keys as triton_keys
  exact = triton_keys.exact
  assert exact(G.WGMMA) == exact(G.WGMMA) and exact((G.WGMMA, 4)) != exact(G.WGMMA)

  class Plain:  # a plain class with a JIT method: keyed by its methods' code, and so is an instance of it
    apply = gs.copy_scalar

  class Other:
    apply = gs.apply_op

  assert exact(Plain) not in (exact(G.WGMMA), exact(Other)) and exact(Plain()) != exact(Plain)
  # Layouts are a library's dataclasses: keyed by their class's name and every field.
  assert exact(gl.BlockedLayout([4], [32], [4], [0])) == exact(BLOCKED) != exact(gl.BlockedLayout([2], [32], [4], [0]))


def test_a_warm_process_compiles_nothing_and_exports(isolated_disk_cache):
  script = """
    import json
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    import test_gluon as t
    x = jax.ShapeDtypeStruct((4096,), jnp.float32)
    jax.jit(t.add_call()).trace(x, x).lower(lowering_platforms=("cuda",))
    exported = jax.export.export(jax.jit(t.add_call()), platforms=["cuda"],
                                 disabled_checks=jmf.export_disabled_checks())(x, x)
    s = jmf.kernel_cache_stats()
    print(json.dumps({"compiles": s.compiles["triton"], "disk": s.disk_hits,
                      "target": "jax_mosaic_ffi_launch_v1" in exported.mlir_module()}))
  """
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}
  cold = fresh_process.run(script, env=env).result
  warm = fresh_process.run(script, env=env).result
  assert cold["compiles"] == 1 and cold["target"], cold
  # The layout constexpr is no plain JSON value: the specialization is answered again (cheap), the kernel is not.
  assert warm == {"compiles": 0, "disk": warm["disk"], "target": True} and warm["disk"] >= 1, warm


# ---------------------------------------------------------------- what every kernel gets

def _add_with_fallback(**options):
  return add_call(fallback=lambda a, b: a + b, **options)


def test_a_fallback_runs_off_cuda_and_vmap_runs_per_element(rng):
  x, y = (rng.standard_normal((3, 700)).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(_add_with_fallback())(x[0], y[0])), x[0] + y[0], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(_add_with_fallback()))(x, y)), x + y, rtol=1e-6)
  (cc,) = custom_calls(lower(jax.vmap(add_call()), f32(3, 700), f32(3, 700)))
  assert cc["config"]["batch_size"] == 3


def test_gradients_come_from_differentiable(rng):
  add_d = jmf.differentiable(_add_with_fallback(), bwd=lambda g: (g, g))
  x, y = (rng.standard_normal(300).astype(np.float32) for _ in range(2))
  gx, gy = jax.grad(lambda a, b: (add_d(a, b) * a).sum(), argnums=(0, 1))(x, y)
  np.testing.assert_allclose(np.asarray(gx), 2 * x + y, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(gy), x, rtol=1e-5)


def test_sharding_runs_per_shard(rng):
  devices = jax.devices("cpu")
  if len(devices) < 8:
    pytest.skip("needs --xla_force_host_platform_device_count=8 before jax starts")
  mesh = jax.sharding.Mesh(np.array(devices[:8]), ("x",))
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
  x, y = (jax.device_put(rng.standard_normal(8 * 512).astype(np.float32), spec) for _ in range(2))
  out = jax.jit(_add_with_fallback(sharding=jmf.Elementwise()))(x, y)
  np.testing.assert_allclose(np.asarray(out), np.asarray(x) + np.asarray(y), rtol=1e-6)
  assert out.sharding.is_equivalent_to(spec, 1)


def test_the_reference_check_passes_through_the_fallbacks(isolated_disk_cache):
  report = jmf.check(axpy_call(fallback=lambda x, y: 0.5 * x + y), jnp.zeros(3000), jnp.zeros(3000), shapes=None,
                     grads=False)
  assert not report.failures, report
  assert report.status == ("passed" if jax.devices()[0].platform == "gpu" else "not checked"), report


def test_autotune_decorators_over_a_gluon_function(isolated_disk_cache):
  tuned = triton.autotune(configs=[triton.Config({"XBLOCK": 2048}, num_warps=8),
                                   triton.Config({"XBLOCK": 512}, num_warps=4)], key=["n"])(gs.axpy)
  config = only_call(axpy_call(jmf.gluon_kernel(tuned)), f32(5000), f32(5000))["config"]
  assert config["block"] == [256, 1, 1] and config["grid"] == [3, 1, 1]  # no GPU: the first config
  with pytest.raises(TypeError, match="gluon_kernel '_not_gluon' is a @triton.jit function"):
    jmf.gluon_kernel(triton.autotune(configs=[triton.Config({})], key=[])(triton.jit(_not_gluon)))


def _not_gluon(x_ptr):
  pass


# ---------------------------------------------------------------- errors


def test_the_wrong_maker_is_named():
  import triton_sources as ts
  with pytest.raises(TypeError, match=r"triton_kernel 'add' is a Gluon kernel: make it with jmf.gluon_kernel\(...\)"):
    jmf.triton_kernel(gs.add)
  with pytest.raises(TypeError, match=r"gluon_kernel 'add' is a @triton.jit function: make it with "
                                      r"jmf.triton_kernel\(...\)"):
    jmf.gluon_kernel(ts.add)
  with pytest.raises(TypeError, match="jmf.gluon_kernel needs a @gluon.jit function, got function"):
    jmf.gluon_kernel(lambda x: x)
  with pytest.raises(jmf.LaunchError, match="a Gluon kernel takes no block: Triton's metadata sets it.*warp-spec"):
    add_call(block=128)


def test_a_layout_that_does_not_fit_num_warps_names_the_cause(isolated_disk_cache):
  with pytest.raises(jmf.CompileError) as caught:
    jmf.gluon_kernel(gs.add, signature=["*fp32"] * 3 + ["i32"], constexprs={"XBLOCK": 512, "layout": BLOCKED},
                     num_warps=8, targets=["sm_90"])
  message = str(caught.value)
  assert "Layout has 4 warps per CTA, but the context requires 8 warps per CTA" in message, message
  assert "a layout's warps_per_cta must be num_warps" in message


def test_a_failing_compile_names_each_option_once(isolated_disk_cache):
  # axpy's num_warps parameter holds the launch option: the config names it once, with the options.
  with pytest.raises(jmf.CompileError) as caught:
    jmf.gluon_kernel(gs.axpy, signature=["*fp32"] * 3 + ["i32", "fp32"], constexprs={"XBLOCK": 16},
                     targets=["sm_90"])
  (config,) = re.findall(r"kernel 'axpy' for sm_90 with (.*); signature", str(caught.value))
  assert config == "num_warps=4, num_stages=3, num_ctas=1, XBLOCK=16", config


LEAK_AT_EXIT = """
    import json
    import jax_mosaic_ffi as jmf, gluon_sources as gs
    from triton.experimental.gluon import language as gl
    layout = repr(gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16))
    kernel = jmf.gluon_kernel(gs.tile_copy, signature=[f"tensordesc<fp16[64, 64],{layout}>", "*fp16"],
                              constexprs={"M": 64, "N": 64}, targets=["sm_90"])
    print(json.dumps(kernel.name))
"""


def test_the_leak_report_at_the_exit_of_a_gluon_process_is_tritons_own(tmp_path):
  # Triton 3.9's gluon_ir.cc keeps its Python layout classes for the process's life (layoutToGluon's static
  # GluonLayouts releases its references), made the first time Gluon turns a layout back into Python (tile_copy's
  # x[:, None]); nanobind reports what they reach at exit (docs/compatibility.md). None of it is ours.
  done = fresh_process.run(LEAK_AT_EXIT, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path)})
  assert done.result == "tile_copy"
  report = done.stderr[done.stderr.find("nanobind: leaked"):] if "nanobind: leaked" in done.stderr else ""
  assert "jax_mosaic_ffi" not in report, report
  leaked_types = re.findall(r'leaked type "([^"]+)"', report)
  assert all(name.startswith("triton._C.libtriton.") or "." not in name for name in leaked_types), report


@pytest.mark.skipif(VERSION >= (3, 8), reason="Triton >= 3.8 has tma.async_load")
def test_a_name_of_another_triton_release_gets_the_installed_ones(isolated_disk_cache):
  layout = repr(F16([64, 64], gl.float16))
  with pytest.raises(jmf.CompileError, match=re.escape(
      f"async_load came in Triton 3.8, and the installed Triton {VERSION[0]}.{VERSION[1]} calls it "
      "tma.async_copy_global_to_shared")):
    jmf.gluon_kernel(gs.uses_async_load, signature=[f"tensordesc<fp16[64, 64],{layout}>", "*fp16"],
                     constexprs={"M": 64, "N": 64}, targets=["sm_90"])


def test_the_advice_for_each_moved_name():
  from jax_mosaic_ffi.gluon.compiler import language
  missing = AttributeError("module 'triton.experimental.gluon.language' has no attribute 'thread_barrier'")
  if VERSION >= (3, 7):
    assert "Triton 3.7 replaced thread_barrier with gl.barrier" in language.advice(missing)
  removed = AttributeError("async_copy_global_to_shared has been removed; call async_load instead")
  assert "removed a name the kernel calls (the message says what replaced it)" in language.advice(removed)
  assert "warps_per_cta must be num_warps" in language.advice(ValueError("anything else"))


@pytest.mark.parametrize("layout, message", [
    (None, r"needs the block's shared layout: pass layout=gl.NVMMASharedLayout.get_default_for\(\[128, 64\], "
           r"gl.float16\)"),
    (BLOCKED, r"a Gluon host descriptor is a TMA descriptor, whose layout is an NVMMASharedLayout"),
    (gl.NVMMASharedLayout(128, 32, 2), r"has element_bitwidth=32, but the array is float16 \(16-bit elements\)"),
    (gl.NVMMASharedLayout(128, 16, 3), r"has rank 3, but block_shape \[128, 64\] has rank 2"),
])
def test_a_descriptor_layout_gluon_cannot_take_is_refused_on_the_host(isolated_disk_cache, layout, message):
  TD = jmf.TensorDescriptor
  call = jmf.mosaic_kernel(
      jmf.gluon_kernel(G.blocked_matmul_pipelined, num_warps=8), lambda a, b: a, grid=(1, 1),
      param_order=(TD.from_tensor("in0", [128, 64], layout=layout),
                   TD.from_tensor("in1", [64, 256], layout=F16([64, 256], gl.float16)),
                   TD.from_tensor("out0", [128, 256], layout=F16([128, 256], gl.float16))))
  a = jax.ShapeDtypeStruct((256, 256), jnp.float16)
  before = jmf.kernel_cache_stats().compiles["triton"]
  with pytest.raises(jmf.LaunchError, match=r"mosaic_kernel 'blocked_matmul_pipelined' at .*param_order entry "
                                            r"TensorDescriptor\('in0'\).*" + message):
    lower(call, a, a)
  assert jmf.kernel_cache_stats().compiles["triton"] == before  # refused before Triton saw it


def test_a_block_narrower_than_its_swizzle_is_refused():
  from jax_mosaic_ffi.gluon.kernel import check_layout
  with pytest.raises(jmf.LaunchError, match=r"a block row is 8 x float32 = 32 bytes, less than the layout's "
                                            r"swizzle_byte_width=128: widen block_shape\[-1\] to at least 32"):
    check_layout(gl.NVMMASharedLayout(128, 32, 2), np.float32, [16, 8], "here")
  check_layout(gl.NVMMASharedLayout(32, 32, 2), np.float32, [16, 8], "here")  # gluon_test.py's swizzle_32 case


def test_a_descriptor_type_with_its_layout_is_written_as_tritons_specialization_writes_it():
  desc = _gluon_descriptor(type("T", (), {"dtype": "fp32", "data_ptr": lambda self: 1 << 20})(), [16, 32], [32, 1],
                           [16, 32], gl.NVMMASharedLayout(128, 32, 2))
  from jax_mosaic_ffi.triton.compiler import tensordesc_abi
  ours = tensordesc_abi.with_layout("tensordesc<fp32[16, 32]>", desc.layout)
  assert ours.replace(" ", "") == f"tensordesc<fp32[16,32],{desc.layout!r}>".replace(" ", "")
  assert tensordesc_abi.parse_type(ours) == ("fp32", (16, 32))
