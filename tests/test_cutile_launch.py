"""cuTile kernels in JAX on a machine without a GPU: everything up to the launch (the launch record in cuTile's
calling convention, runtime scalars, both index widths, jax.export with symbolic shapes, vmap, gradients, sharding,
the fallback, autotuning configs, jmf.check) and the cuda.tile.jax drop-in (jax_mosaic_ffi.cutile_jax)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import cutile_required  # noqa: F401  (skips without cuda-tile)
import fresh_process
import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.cutile_jax import InputOutput, OutputPlaceholder, cutile_call
from hlo_inspect import UNTUNED_OK, custom_calls, lower

import cuda.tile as ct  # noqa: E402  (after the guard)

S = cutile_required.samples()
pytestmark = UNTUNED_OK


def f32(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def one_call(fn, *avals) -> dict:
  (call,) = custom_calls(lower(fn, *avals))
  return call["config"]


def vector_add(**options):
  return jmf.mosaic_kernel(jmf.cutile_kernel(S.vector_add, TILE=1024, targets=["sm_90"]), lambda a, b: a,
                           grid=lambda a, b: jmf.cdiv(a.shape[0], 1024), fallback=lambda a, b: a + b, **options)


def scalars_of(config) -> list:
  data, sizes = config["scalar_data"], config["scalar_sizes"]
  return [int.from_bytes(data[8 * k:8 * k + s], "little", signed=True) for k, s in enumerate(sizes)]


def test_each_array_is_its_buffer_then_its_extents_and_strides_as_a_tile_kernel(isolated_disk_cache):
  call = one_call(vector_add(), f32(5000), f32(5000))
  # cutile_python_v1: a, a.shape, a.strides, b, ..., c, ...; the extents and strides are launch values (int32).
  assert call["param_order"] == [0, -1, -2, 1, -3, -4, 2, -5, -6]
  assert scalars_of(call) == [5000, 1, 5000, 1, 5000, 1] and call["scalar_sizes"] == [4] * 6
  assert call["grid"] == [5, 1, 1]
  # A tile kernel: a block of one, no dynamic shared memory, no cluster (the cubin's tile metadata has them).
  assert call["block"] == [1, 1, 1] and call["smem_bytes"] == 0 and call["cluster"] == [1, 1, 1]
  assert not call["uses_pdl"]


def test_a_two_dimensional_array_passes_row_major_strides(isolated_disk_cache):
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.softmax, TILE_N=1024, targets=["sm_90"]), lambda x: x,
                        grid=lambda x: x.shape[0])
  call = one_call(f, f32(64, 1000))
  assert scalars_of(call) == [64, 1000, 1000, 1, 64, 1000, 1000, 1]


def test_runtime_scalars_are_launch_values_and_compile_nothing(isolated_disk_cache):
  made = jmf.cutile_kernel(S.layer_norm, TILE_N=1024, targets=["sm_90"])
  before = jmf.kernel_cache_stats().compiles["cutile"]
  configs = []
  for eps in (1e-5, 1e-3):
    f = jmf.mosaic_kernel(made, lambda x, w, b: x, grid=lambda x, w, b: x.shape[0], scalars=(np.float32(eps),))
    configs.append(one_call(f, f32(8, 1000), f32(1000), f32(1000)))
  assert jmf.kernel_cache_stats().compiles["cutile"] - before == 1
  assert configs[0]["module"] == configs[1]["module"] and configs[0]["scalar_data"] != configs[1]["scalar_data"]
  # eps is the kernel's fifth parameter: after x, weight, bias and y (each an address, extents and strides).
  assert configs[0]["param_order"][-1] == -1 and configs[0]["scalar_data"][:4] == np.float32(1e-5).tobytes()


def test_64_bit_indexing_passes_int64_extents_strides_and_scalars(isolated_disk_cache):
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.scale_wide, TILE=1024, targets=["sm_90"]), lambda x: x,
                        grid=lambda x: jmf.cdiv(x.size, 1024), scalars=lambda x: (np.float32(2), np.int64(x.size)))
  call = one_call(f, f32(5000))
  assert call["param_order"] == [0, -3, -4, 1, -5, -6, -1, -2]
  assert call["scalar_sizes"] == [4, 8, 8, 8, 8, 8]


def test_an_extent_past_int32_needs_64_bit_indexing(isolated_disk_cache):
  with pytest.raises(jmf.LaunchError, match="does not fit the int32.*ct.IndexedWithInt64"):
    lower(vector_add(), f32(1 << 31), f32(1 << 31))


def test_export_carries_the_kernel_with_no_disabled_safety_check(isolated_disk_cache):
  exported = jax.export.export(jax.jit(vector_add()), platforms=["cuda"])(f32(4096), f32(4096))
  assert exported.disabled_safety_checks == ()
  back = jax.export.deserialize(exported.serialize())
  assert contract.LAUNCH_TARGET in back.mlir_module()


def test_symbolic_shapes_export_once_for_every_size(isolated_disk_cache):
  (n,) = jax.export.symbolic_shape("n")
  before = jmf.kernel_cache_stats().compiles["cutile"]
  exported = jax.export.export(jax.jit(vector_add()), platforms=["cuda"])(
      jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.float32))
  assert jmf.kernel_cache_stats().compiles["cutile"] - before == 1
  text = exported.mlir_module()
  assert contract.target_name(collective=False, programs=True) in text and "launch_programs" in text
  assert exported.disabled_safety_checks == ()


def test_vmap_launches_per_element_in_one_call(isolated_disk_cache, rng):
  f = vector_add()
  call = one_call(jax.vmap(f), f32(3, 4096), f32(3, 4096))
  assert call["batch_size"] == 3 and call["grid"] == [4, 1, 1]
  x, y = (rng.standard_normal((3, 4096)).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(jax.jit(jax.vmap(f))(x, y), x + y)  # the fallback, off CUDA


def test_vmap_refuses_elements_the_kernel_would_see_misaligned(isolated_disk_cache):
  with pytest.raises(jmf.LaunchError, match="not a multiple of the 256 bytes.*batch_bid"):
    one_call(jax.vmap(vector_add()), f32(3, 1000), f32(3, 1000))


def test_a_kernel_with_a_batch_axis_is_one_launch_over_the_batch(isolated_disk_cache, rng):
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.batched_add, TILE=256, batch_bid=1, targets=["sm_90"]), lambda a, b: a,
                        grid=lambda a, b: jmf.cdiv(a.shape[-1], 256), fallback=lambda a, b: a + b)
  plain = one_call(f, f32(1000), f32(1000))
  assert plain["grid"] == [4, 1, 1] and "batch_size" not in plain
  assert scalars_of(plain)[:4] == [1, 1000, 1000, 1]  # a batch of one: (1, 1000)
  batched = one_call(jax.vmap(jax.vmap(f)), f32(2, 3, 1000), f32(2, 3, 1000))
  assert batched["grid"] == [4, 6, 1] and "batch_size" not in batched
  assert scalars_of(batched)[:4] == [6, 1000, 1000, 1]
  x, y = (rng.standard_normal((2, 3, 1000)).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(jax.jit(jax.vmap(jax.vmap(f)))(x, y), x + y)


def test_gradients_through_differentiable(isolated_disk_cache, rng):
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.scale_wide, TILE=1024, targets=["sm_90"]), lambda x: x,
                        grid=lambda x: jmf.cdiv(x.size, 1024), scalars=lambda x: (np.float32(3), np.int64(x.size)),
                        fallback=lambda x: 3 * x)
  g = jmf.differentiable(f, bwd=f, linear=True)  # d(3x) = 3 dx: the kernel itself, both ways
  x = rng.standard_normal(2000).astype(np.float32)
  np.testing.assert_allclose(jax.grad(lambda v: (g(v) ** 2).sum())(x), 18 * x, rtol=1e-6)
  np.testing.assert_allclose(jax.jvp(g, (x,), (x,))[1], 3 * x, rtol=1e-6)
  assert len(custom_calls(lower(jax.grad(lambda v: (g(v) ** 2).sum()), f32(2000)))) == 2  # fwd and bwd kernels


def test_the_fallback_runs_off_cuda_and_check_compares_it(isolated_disk_cache, rng):
  f = vector_add()
  x, y = (rng.standard_normal(3000).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(jax.jit(f)(x, y), x + y)
  report = jmf.check(f, x, y, reference=lambda a, b: a + b)
  assert report.status == "not checked"  # no GPU: the fallbacks ran in the kernels' place


def test_autotuning_configs_set_constants_and_kernel_options(isolated_disk_cache):
  made = jmf.cutile_kernel(S.vector_add, targets=["sm_90"])
  configs = [{"TILE": 512}, {"TILE": 1024, "occupancy": 2}, {"TILE": 2048, "num_ctas": 2}]
  for config in configs:
    tuned = made.with_meta(config)
    assert tuned.meta == config
    f = jmf.mosaic_kernel(tuned, lambda a, b: a, grid=lambda a, b: jmf.cdiv(a.size, config["TILE"]))
    one_call(f, f32(8192), f32(8192))
  f = jmf.mosaic_kernel(made, lambda a, b: a, grid=lambda meta, a, b: jmf.cdiv(a.size, meta["TILE"]),
                        configs=configs)
  call = one_call(f, f32(8192), f32(8192))  # no GPU: the default config, said so (AutotuneSkipped)
  assert call["grid"] == [16, 1, 1]


DUMP_PARTITIONING = '''
  import glob, json, os, sys
  import jax, jax.numpy as jnp, numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  import jax_mosaic_ffi as jmf
  from cutile_required import samples
  S = samples()
  add = jmf.mosaic_kernel(jmf.cutile_kernel(S.vector_add, TILE=128, targets=["sm_90"]), lambda a, b: a,
                          grid=lambda a, b: jmf.cdiv(a.size, 128), sharding=jmf.Elementwise())
  mesh = Mesh(np.array(jax.devices("cpu")[:8]), ("x",))
  x = jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  lowered = jax.jit(lambda a: add(a, a) * 2).trace(x).lower(lowering_platforms=("cuda",))
  try:
    lowered.compile()  # the CPU compiler partitions, then finds no CPU handler for a CUDA kernel
  except Exception:
    pass
  (dump,) = glob.glob(os.path.join(sys.argv[1], "*after_spmd-partitioning*"))
  print(json.dumps({"partitioned": open(dump).read()}))
'''


def test_sharding_under_jit_launches_each_shard_with_its_own_extents(tmp_path):
  dump = tmp_path / "dump"
  flags = f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"
  result = fresh_process.run(DUMP_PARTITIONING, dump, env={
      "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  (call,) = [line for line in result["partitioned"].splitlines() if contract.LAUNCH_TARGET in line]
  assert re.search(r"= f32\[128\]\{0\} custom-call\(", call)  # each device's 128 elements
  assert "grid = array<i32: 1, 1, 1>" in call and r'scalar_data = "\80\00\00\00' in call  # extent 128


def test_a_sharded_call_runs_its_fallback_per_shard(isolated_disk_cache, rng):
  devices = jax.devices("cpu")
  if len(devices) < 4:
    pytest.skip("needs --xla_force_host_platform_device_count=8 before jax starts")
  mesh = Mesh(np.array(devices[:4]), ("x",))
  f = vector_add(sharding=jmf.Elementwise())
  x, y = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
  put = functools.partial(jax.device_put, device=NamedSharding(mesh, P("x")))
  out = jax.jit(f)(put(x), put(y))
  np.testing.assert_allclose(out, x + y)
  assert out.sharding.spec == P("x")


def test_options_of_other_front_ends_are_refused_saying_what_to_do(isolated_disk_cache):
  made = jmf.cutile_kernel(S.vector_add, TILE=1024)
  for option, hint in (("block", "tile compiler picks the threads"), ("cluster", "num_ctas=2"),
                       ("smem_bytes", "sizes its shared memory")):
    with pytest.raises(jmf.LaunchError, match=f"a cuTile kernel takes no {option}: .*{hint}"):
      jmf.mosaic_kernel(made, lambda a, b: a, grid=4, **{option: 2})


def test_mistakes_are_named(isolated_disk_cache):
  with pytest.raises(jmf.LaunchError, match="no value for the ct.Constant parameter 'TILE'"):
    jmf.mosaic_kernel(jmf.cutile_kernel(S.vector_add), lambda a, b: a, grid=4)
  with pytest.raises(jmf.LaunchError, match="has no parameter 'TILES'; its parameters are a, b, c, TILE"):
    jmf.cutile_kernel(S.vector_add, TILES=4)
  with pytest.raises(jmf.LaunchError, match="'a' is not a ct.Constant"):
    jmf.cutile_kernel(S.vector_add, a=4)
  with pytest.raises(jmf.LaunchError, match="grid= is required"):
    jmf.mosaic_kernel(jmf.cutile_kernel(S.vector_add, TILE=4), lambda a, b: a)
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.vector_add, TILE=1024), lambda a: a, grid=4)
  with pytest.raises(jmf.LaunchError, match=r"takes 3 parameters that are not ct.Constant \(a, b, c\), but the call "
                                            r"passes 2 \(in0, out0\)"):
    lower(f, f32(4096))
  with pytest.raises(jmf.LaunchError, match="ct.ScalarInt64; pass scalar1 as an np.int64"):
    lower(jmf.mosaic_kernel(jmf.cutile_kernel(S.scale_wide, TILE=1024), lambda x: x, grid=4,
                            scalars=(np.float32(2), np.int32(5))), f32(4096))
  with pytest.raises(TypeError, match="a @ct.kernel"):
    jmf.cutile_kernel(lambda x: x)


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


@ct.kernel
def _offset(x, y, shift: float, count, TILE_SIZE: ct.Constant):
  ct.store(y, ct.bid(0), ct.load(x, ct.bid(0), TILE_SIZE) + shift + count)


def _graph(x, c, tile_size):
  """cuda.tile.jax's own example, with `import jax_mosaic_ffi.cutile_jax` for `import cuda.tile.jax`."""
  grid = (ct.cdiv(x.shape[0], tile_size),)
  ph = OutputPlaceholder(x.shape, x.dtype)
  y = cutile_call(grid, _scale, (x, ph, c, tile_size))
  y = cutile_call(grid, _inplace, (InputOutput(y), tile_size))
  ysin, ycos = cutile_call(grid, _sincos, (y, ph, ph, tile_size))
  return ysin + ycos


def test_cutile_call_runs_cuda_tile_jaxs_example(isolated_disk_cache):
  calls = custom_calls(lower(functools.partial(_graph, c=float(np.pi), tile_size=4), f32(10)))
  assert len(calls) == 3
  assert [c["config"]["num_outputs"] for c in calls] == [1, 1, 2]
  assert calls[1]["config"]["param_order"] == [0, -1, -2]  # InputOutput: one buffer, in place


def test_cutile_call_takes_runtime_scalars_as_cuda_tile_jax_types_them(isolated_disk_cache):
  f = lambda x: cutile_call((1,), _offset, (x, OutputPlaceholder(x.shape, x.dtype), 0.5, 7, 16))  # noqa: E731
  call = one_call(f, f32(16))
  assert call["scalar_sizes"][:2] == [4, 4]  # float -> float32, int -> int32
  assert call["scalar_data"][:4] == np.float32(0.5).tobytes() and call["scalar_data"][8:12] == np.int32(7).tobytes()


def test_cutile_call_exports_with_symbolic_shapes_and_no_disabled_check(isolated_disk_cache):
  (n,) = jax.export.symbolic_shape("n")
  exported = jax.export.export(jax.jit(functools.partial(_graph, c=2.0, tile_size=16)), platforms=["cuda"])(
      jax.ShapeDtypeStruct((n,), jnp.float32))
  assert exported.disabled_safety_checks == ()


def test_cutile_call_refuses_what_cuda_tile_jax_refuses(isolated_disk_cache):
  with pytest.raises(TypeError, match="_scale expects 4 arguments, got 3"):
    cutile_call((1,), _scale, (jnp.ones(4), OutputPlaceholder((4,), jnp.float32), 2.0))
  with pytest.raises(TypeError, match="annotated ct.Constant; expected a static scalar"):
    cutile_call((1,), _scale, (jnp.ones(4), OutputPlaceholder((4,), jnp.float32), jnp.ones(4), 4))
  with pytest.raises(TypeError, match="Unexpected type for argument 1"):
    cutile_call((1,), _scale, (jnp.ones(4), "out", 2.0, 4))
  with pytest.raises(OverflowError, match="doesn't fit in int32.*ct.ScalarInt64"):
    cutile_call((1,), _offset, (jnp.ones(16), OutputPlaceholder((16,), jnp.float32), 0.5, 1 << 40, 16))


