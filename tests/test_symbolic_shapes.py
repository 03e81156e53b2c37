"""jax.export with shape polymorphism: what is supported, and the message for what is not.

A symbolic size (``jax.export.symbolic_shape("n")``) is only known when the
exported function is called. out_shape may use it (jax refines the custom
call's result shapes then), and so may the grid and integer scalars
(``jmf.cdiv(x.shape[0], 256)``, ``jmf.dim_scalar(x.shape[0], np.int32)``): they
lower as launch programs (contract v2, tests/test_launch_programs.py) that the
runtime computes from the buffers' shapes at the first execution. block,
smem_bytes and scratch_bytes fix the compiled launch's limits and stay
constants; a call that makes them depend on a symbolic size is refused,
naming the call site, the kernel and the value.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core

import fresh_process
from hlo_inspect import custom_calls

SCALE_ADD = r'''
extern "C" __global__ void scale_add(const float* x, const float* y, const int* n, float* out) {
  int count = *n;  // the size, from an input array: the grid does not depend on it
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    out[i] = 2.0f * x[i] + y[i];
  }
}
'''
ADD = r'''
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
'''


def scale_add():
  kernel = jmf.cuda_kernel(SCALE_ADD, "scale_add")
  call = jmf.mosaic_kernel(kernel, lambda x, y, n: jax.ShapeDtypeStruct(x.shape, x.dtype), grid=132, block=256,
                           fallback=lambda x, y, n: 2 * x + y)

  def f(x, y):
    return call(x, y, jnp.asarray(x.shape[0], jnp.int32).reshape(1))
  return f


def symbolic_export(f, platforms):
  (n,) = jax.export.symbolic_shape("n")
  spec = jax.ShapeDtypeStruct((n,), jnp.float32)
  return jax.export.export(jax.jit(f), platforms=platforms, disabled_checks=jmf.export_disabled_checks())(spec, spec)


def test_a_launch_independent_of_the_symbolic_size_exports_and_runs_at_any_size(isolated_disk_cache):
  exported = symbolic_export(scale_add(), ("cuda", "cpu"))
  assert [str(a) for a in exported.out_avals] == ["float32[n]"]
  text = exported.mlir_module()
  # The custom call's result shape is symbolic, given as a shape operand for jax to refine at call time.
  (call,) = re.findall(r"stablehlo.custom_call @jax_mosaic_ffi_launch\w*\(.*", text)
  assert "indices_of_shape_operands" in call and "-> tensor<?xf32>" in call
  assert "grid = array<i32: 132, 1, 1>" in call
  restored = jax.export.deserialize(exported.serialize())
  rng = np.random.default_rng()
  for size in (7, 3000):  # on the CPU, the same artifact runs its fallback at both sizes
    x, y = rng.standard_normal(size, np.float32), rng.standard_normal(size, np.float32)
    np.testing.assert_allclose(np.asarray(restored.call(x, y)), 2 * x + y, rtol=1e-6)


def add_call(**launch):
  kernel = jmf.cuda_kernel(ADD, "add")
  return jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype), **launch)


def any_size_add():
  """add(a, b, out, n) over any size: the grid and n follow the inputs' symbolic size."""
  return add_call(grid=lambda x, y: jmf.cdiv(x.shape[0], 256), block=256,
                  scalars=lambda x, y: (jmf.dim_scalar(x.shape[0], np.int32),), fallback=lambda x, y: x + y)


def test_a_grid_and_scalar_that_follow_the_symbolic_size_lower_as_launch_programs(isolated_disk_cache):
  (n,) = jax.export.symbolic_shape("n")
  spec = jax.ShapeDtypeStruct((n,), jnp.float32)
  (call,) = custom_calls(jax.jit(any_size_add()).trace(spec, spec).lower(lowering_platforms=("cuda",)))
  config = call["config"]
  # Contract v2's own target: a runtime that predates it has no such target and refuses the call, rather than
  # launching the placeholders (grid 1, n = 0) it would read from grid and scalar_data.
  assert call["target"] == jmf.contract.LAUNCH_TARGET_V2 == "jax_mosaic_ffi_launch_v2"
  assert config["grid"] == [1, 1, 1] and config["scalar_data"] == bytes(8) and config["scalar_sizes"] == [4]
  # grid[0] = (in0.shape[0] + 255) // 256 and scalar 0 = in0.shape[0], an int32 (target 1: signed).
  assert config["launch_programs"] == [0, 0, 9, 1, 0, 0, 0, 255, 2, 0, 256, 4,
                                       1, 0, 3, 1, 0, 0]
  # The runtime's evaluator, on the shapes the exported function is called with.
  for size, blocks in ((1, 1), (1000, 4), (256 * 37, 37), ((1 << 20) + 3, 4097)):
    assert _core._testing.evaluate_launch(config, [[size]] * 3) == ([blocks, 1, 1], [size])
  with pytest.raises(ValueError) as caught:
    _core._testing.evaluate_launch(config, [[1 << 31]] * 3)
  assert str(caught.value) == ("scalars[0] = in0.shape[0] is 2147483648 for these shapes, which does not fit its "
                               "int32")


def test_launch_values_given_as_values_of_symbolic_sizes_lower_as_the_callables_do(isolated_disk_cache):
  kernel = jmf.cuda_kernel(ADD, "add")

  def f(x, y):  # the wrapper made inside the traced function, from its symbolic shapes
    return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), grid=jmf.cdiv(x.shape[0], 256),
                             block=256, scalars=(jmf.dim_scalar(x.shape[0], np.int32),))(x, y)
  (n,) = jax.export.symbolic_shape("n")
  spec = jax.ShapeDtypeStruct((n,), jnp.float32)
  (given,) = custom_calls(jax.jit(f).trace(spec, spec).lower(lowering_platforms=("cuda",)))
  (computed,) = custom_calls(jax.jit(any_size_add()).trace(spec, spec).lower(lowering_platforms=("cuda",)))
  assert given["target"] == computed["target"] == "jax_mosaic_ffi_launch_v2"
  assert given["config"]["launch_programs"] == computed["config"]["launch_programs"]
  assert given["config"]["scalar_data"] == bytes(8) and given["config"]["grid"] == [1, 1, 1]


def test_the_same_artifact_exports_and_runs_its_fallback_at_any_size_on_the_cpu(isolated_disk_cache):
  exported = symbolic_export(any_size_add(), ("cuda", "cpu"))
  (call,) = re.findall(r"stablehlo.custom_call @jax_mosaic_ffi_launch\w*\(.*", exported.mlir_module())
  assert call.startswith("stablehlo.custom_call @jax_mosaic_ffi_launch_v2(") and "launch_programs = " in call
  restored = jax.export.deserialize(exported.serialize())
  rng = np.random.default_rng()
  for size in (7, 3000):
    x, y = rng.standard_normal(size, np.float32), rng.standard_normal(size, np.float32)
    np.testing.assert_allclose(np.asarray(restored.call(x, y)), x + y, rtol=1e-6)


def refused(call):
  """The LaunchError of exporting `call` on symbolic shapes, and the line it names, checked to be the caller's."""
  with pytest.raises(jmf.LaunchError) as caught:
    symbolic_export(lambda x, y: call(x, y), ("cuda",))
  message = str(caught.value)
  site = re.match(r"mosaic_kernel 'add' at test_symbolic_shapes.py:(\d+) \(<lambda>\): ", message)
  assert site is not None, message
  source = open(__file__).read().splitlines()[int(site.group(1)) - 1]
  assert "symbolic_export(lambda x, y: call(x, y)" in source
  return message[site.end():]


INPUTS = "in0 float32[n]; in1 float32[n]"
CONSTANT = ("{what} depends on a symbolic dimension of the inputs (" + INPUTS + "). Under jax.export with shape "
            "polymorphism the grid and integer scalars may follow the symbolic sizes (the runtime computes them "
            "when the shapes are known), but block, smem_bytes and scratch_bytes must be constants: they set the "
            "compiled launch's limits (threads per block against the kernel's registers, shared memory against the "
            "device's), checked once when the kernel is loaded. Fix {what} and let the grid follow the size, or "
            "export once per concrete size")
INCONCLUSIVE = ("{what} could not be computed on the symbolic dimensions of the inputs (" + INPUTS + "): {jax}. "
                "Under jax.export with shape polymorphism the grid and integer scalars may be expressions of the "
                "sizes (+, -, *, //, %, jmf.cdiv), which the runtime computes when the shapes are known: write "
                "integer scalars as jmf.dim_scalar(x.shape[0], np.int32) rather than np.int32(x.shape[0]), and "
                "avoid int(), math functions and comparisons of symbolic sizes")
REQUIRES_A_CONSTANT = "Symbolic dimension 'n' used in a context that requires a constant"


@pytest.mark.parametrize("what, value, message", [
    ("block", lambda x, y: (x.shape[0] // 8,), CONSTANT.format(what="block")),
    ("smem_bytes", lambda x, y: 4 * x.shape[0], CONSTANT.format(what="smem_bytes")),
    ("scratch_bytes", lambda x, y: 4 * x.shape[0], CONSTANT.format(what="scratch_bytes")),
    ("scalars", lambda x, y: (np.int32(x.size),), INCONCLUSIVE.format(what="scalars", jax=REQUIRES_A_CONSTANT)),
    ("grid", lambda x, y: int(x.shape[0]) // 256, INCONCLUSIVE.format(what="grid", jax=REQUIRES_A_CONSTANT)),
    ("grid", lambda x, y: max(x.shape[0] // 256, 1), INCONCLUSIVE.format(
        what="grid", jax="Symbolic dimension comparison 'floordiv(n, 256)' < '1' is inconclusive")),
    ("scalars", lambda x, y: (x.shape[0],), "scalars[0] = n is a symbolic size, whose width the kernel's parameter "
                                            "cannot be guessed from; pass jmf.dim_scalar(n, np.int32) (or another "
                                            "integer dtype)"),
])
def test_a_launch_value_that_cannot_follow_the_symbolic_size_is_refused(isolated_disk_cache, what, value, message):
  launch = dict(grid=4, block=256, scalars=(np.int32(1000),))
  launch[what] = value
  assert refused(add_call(**launch)) == message


def test_a_symbolic_size_no_buffer_has_as_a_whole_dimension_is_refused(isolated_disk_cache):
  kernel = jmf.cuda_kernel(ADD, "add")
  # The inputs are [2n]: the runtime reads dimensions of buffers, and none of them is n itself.
  call = jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype), block=256,
                           grid=lambda x, y: jmf.cdiv(x.shape[0] // 2, 256), scalars=(np.int32(1),))
  (n,) = jax.export.symbolic_shape("n")
  spec = jax.ShapeDtypeStruct((2 * n,), jnp.float32)
  with pytest.raises(jmf.LaunchError) as caught:
    jax.export.export(jax.jit(lambda x, y: call(x, y)), platforms=("cuda",),
                      disabled_checks=jmf.export_disabled_checks())(spec, spec)
  message = re.sub(r"^mosaic_kernel 'add' at test_symbolic_shapes.py:\d+ \(<lambda>\): ", "", str(caught.value))
  assert message == ("grid[0] = floordiv(n + 255, 256) uses the symbolic dimension 'n', which is not a whole "
                     "dimension of any input or output of the call (in0[2*n]; in1[2*n]; out0[2*n]); the runtime "
                     "reads it from one. Pass an array whose shape has n as one of its dimensions")


def test_a_call_with_launch_programs_cannot_be_vmapped(isolated_disk_cache):
  (n,) = jax.export.symbolic_shape("n")
  spec = jax.ShapeDtypeStruct((3, n), jnp.float32)
  with pytest.raises(jmf.LaunchError, match=r"grid or scalars depend on symbolic dimensions \(jax.export\) cannot "
                                            r"be vmapped"):
    jax.jit(jax.vmap(any_size_add())).trace(spec, spec).lower(lowering_platforms=("cuda",))


def test_dim_scalar_is_the_numpy_scalar_on_concrete_sizes_and_takes_integer_dtypes_only():
  assert type(jmf.dim_scalar(1000, np.uint16)) is np.uint16 and jmf.dim_scalar(1000, np.uint16) == 1000
  with pytest.raises(TypeError, match=r"^jmf.dim_scalar takes an integer dtype \(np.int32, np.int64, np.uint32, "
                                      r"...\), got float32$"):
    jmf.dim_scalar(3, np.float32)
  with pytest.raises(OverflowError, match=r"^jmf.dim_scalar: 70000 does not fit uint16$"):
    jmf.dim_scalar(70000, np.uint16)
  with pytest.raises(TypeError, match=r"^jmf.dim_scalar takes a size \(an int, or a symbolic dimension\), got 2.5$"):
    jmf.dim_scalar(2.5)


@pytest.mark.parametrize("scalar", [np.int32, lambda size: jmf.dim_scalar(size, np.int32)], ids=["numpy", "dim_scalar"])
def test_concrete_shapes_still_lower_as_before(isolated_disk_cache, scalar):
  call = add_call(grid=lambda x, y: jmf.cdiv(x.shape[0], 256), block=256, scalars=lambda x, y: (scalar(x.size),))
  spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
  (cc,) = custom_calls(jax.jit(call).trace(spec, spec).lower(lowering_platforms=("cuda",)))
  assert cc["target"] == jmf.contract.LAUNCH_TARGET == "jax_mosaic_ffi_launch_v1"
  assert cc["config"]["grid"] == [4, 1, 1] and cc["config"]["scalar_data"] == np.int64(1000).tobytes()
  assert "launch_programs" not in cc["config"] and "indices_of_shape_operands" not in cc["attributes"]


@pytest.mark.gpu
def test_a_deserialized_symbolic_export_runs_on_the_gpu_at_two_sizes(rng, isolated_disk_cache):
  restored = jax.export.deserialize(symbolic_export(scale_add(), ("cuda",)).serialize())
  for size in (1000, 1 << 20):  # fewer and more elements than the fixed grid's threads (132 x 256)
    x, y = rng.standard_normal(size, np.float32), rng.standard_normal(size, np.float32)
    out = restored.call(x, y)  # outputs are poisoned first (conftest): an unwritten element is NaN
    assert out.shape == (size,)
    np.testing.assert_allclose(np.asarray(out), 2 * x + y, rtol=1e-6, atol=1e-6)


ADD_SHORT = r'''
extern "C" __global__ void add(const float* a, const float* b, float* out, short n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
'''


@pytest.mark.gpu
def test_a_size_its_scalar_cannot_hold_is_an_error_naming_the_call_site_and_the_process_goes_on(
    rng, isolated_disk_cache):
  call = jmf.mosaic_kernel(jmf.cuda_kernel(ADD_SHORT, "add"), lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda x, y: jmf.cdiv(x.shape[0], 256), block=256,
                           scalars=lambda x, y: (jmf.dim_scalar(x.shape[0], np.int16),))
  restored = jax.export.deserialize(symbolic_export(lambda x, y: call(x, y), ("cuda",)).serialize())
  big = rng.standard_normal(40000, np.float32)
  with pytest.raises(Exception) as caught:  # XLA's runtime error, carrying the runtime's message
    jax.block_until_ready(restored.call(big, big))
  assert re.search(r"mosaic_kernel 'add' at test_symbolic_shapes.py:\d+ \(<lambda>\): scalars\[0\] = in0.shape\[0\] "
                   r"is 40000 for these shapes, which does not fit its int16. The grid and scalars were computed from "
                   r"symbolic shapes", str(caught.value)), str(caught.value)
  small = rng.standard_normal(1000, np.float32)
  np.testing.assert_allclose(np.asarray(restored.call(small, small)), 2 * small, rtol=1e-6)


POISON_AND_SIZES = """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    restored = jax.export.deserialize(open(sys.argv[1], "rb").read())
    jmf.register()  # a process that only deserializes registers the targets itself (docs/guides/transformations.md)
    rng = np.random.default_rng(int(sys.argv[2]))
    def chain(x, y):  # six calls in a row: XLA puts them in one command buffer
      outs = []
      for _ in range(6):
        x = restored.call(x, y)
        outs.append(x)
      return outs
    f = jax.jit(chain)
    errors = []
    for size in (1000, 256 * 37, (1 << 20) + 3):
      x, y = rng.standard_normal(size, np.float32), rng.standard_normal(size, np.float32)
      for repeat in range(2):  # the second run replays the recorded graph
        expected = x
        for o in f(x, y):
          expected = expected + y
          o = np.asarray(o)
          errors.append(float("nan") if np.isnan(o).any() else float(np.abs(o - expected).max()))
    print(json.dumps({"errors": errors, "records": jmf.kernel_cache_stats().records_created,
                      "registration": jmf.registration.status()}))
"""


@pytest.mark.gpu
def test_a_deserialized_symbolic_export_computes_its_grid_and_scalar_at_each_size(rng, isolated_disk_cache):
  restored = jax.export.deserialize(symbolic_export(any_size_add(), ("cuda",)).serialize())
  # Sizes below one block, a whole number of blocks and one past a power of two (a partial last block).
  for size in (1000, 256 * 37, (1 << 20) + 3):
    x, y = rng.standard_normal(size, np.float32), rng.standard_normal(size, np.float32)
    out = restored.call(x, y)  # outputs are poisoned first (conftest): an unwritten element is NaN
    assert out.shape == (size,)
    # A placeholder grid (1 block) or n (0) would leave all but the first 256 or every element NaN.
    np.testing.assert_allclose(np.asarray(out), x + y, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("command_buffers", [True, False], ids=["command-buffers", "stream"])
def test_launch_programs_inside_command_buffers_and_out(rng, tmp_path, isolated_disk_cache, command_buffers):
  artifact = tmp_path / "any_size_add.jax"
  artifact.write_bytes(symbolic_export(any_size_add(), ("cuda",)).serialize())
  result = fresh_process.run(POISON_AND_SIZES, artifact, int(rng.integers(1 << 30)), cwd=tmp_path, env={
      "XLA_FLAGS": "" if command_buffers else "--xla_gpu_enable_command_buffer=",
      "JAX_MOSAIC_FFI_POISON_OUTPUTS": "1", "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  print(result)
  errors = np.array(result["errors"])
  assert len(errors) == 36 and (errors < 1e-5).all(), errors  # a NaN (an unwritten element) fails too
  if command_buffers:
    assert result["registration"]["record"], result["registration"]
    # Each size is its own executable: six launches recorded as graph nodes each, their grid from the programs.
    assert result["records"] >= 18
  else:
    assert result["records"] == 0


TRITON_REFUSAL = (
    "mosaic_kernel 'add' at test_symbolic_shapes.py:{line} (<lambda>): {what} depends on a symbolic dimension of "
    "the inputs (in0 float32[n]; in1 float32[n]). Launch values are fixed when the call is lowered, and jax.export "
    "with shape polymorphism only knows those sizes when the exported function is called. Export once per "
    "concrete size, or make {what} independent of the symbolic dimensions: e.g. a fixed grid with a grid-stride "
    "loop, the size read inside the kernel from an input array (pass jnp.asarray(x.shape[0], jnp.int32).reshape(1)) "
    "rather than a scalar. out_shape may use symbolic dimensions")


def test_a_triton_launch_that_depends_on_a_symbolic_size_is_refused(isolated_disk_cache):
  """Triton specializes its compile on scalar values (divisibility by 16, == 1), so they must be known."""
  import triton_required
  triton_required.import_triton()
  import triton_sources as ts
  call = jmf.mosaic_kernel(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 256}),
                           lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x, y: jmf.cdiv(x.shape[0], meta["BLOCK"]),
                           scalars=lambda meta, x, y: (np.int32(x.size),))
  with pytest.raises(jmf.LaunchError) as caught:
    symbolic_export(lambda x, y: call(x, y), ("cuda",))
  site = re.match(r"mosaic_kernel 'add' at test_symbolic_shapes.py:(\d+) \(<lambda>\)", str(caught.value))
  assert site is not None, str(caught.value)
  assert str(caught.value) == TRITON_REFUSAL.format(line=site.group(1), what="scalars")


def test_autotuning_on_symbolic_shapes_is_refused_where_it_would_time(isolated_disk_cache, monkeypatch):
  from jax_mosaic_ffi.transforms import autotune as autotuning
  monkeypatch.setenv(autotuning.CPU_ENV, "1")  # times here as it would on a GPU

  def factory(meta):
    return add_call(grid=4, block=meta["block"], scalars=(np.int32(1000),))
  tuned = jmf.autotune(factory, configs=[{"block": 128}, {"block": 256}], name="test-symbolic")
  with pytest.raises(jmf.AutotuneError) as caught:
    symbolic_export(tuned, ("cuda",))
  assert str(caught.value) == (
      "autotune 'test-symbolic': the inputs ['float32[n]', 'float32[n]'] have symbolic dimensions (jax.export "
      "with shape polymorphism), and configs can only be timed on concrete shapes. Pick the config first "
      "(tuned.best_config(*concrete_avals)) and export the call it makes (tuned.factory(config)), or export per "
      "concrete size")
