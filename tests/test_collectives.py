"""Collective kernels: cliques lowered over host-device meshes (no GPU), and runs on GPUs.

One-device cliques run on any GPU; the many-GPU tests wait for a machine
with several GPUs.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core
from jax_mosaic_ffi.base import contract

import fresh_process
import kernel_sources
from hlo_inspect import custom_calls

def cpu_mesh(shape, names):
  devices = jax.devices("cpu")
  if len(devices) < int(np.prod(shape)):
    pytest.skip("needs --xla_force_host_platform_device_count=8 before jax starts")
  return Mesh(np.array(devices[:int(np.prod(shape))]).reshape(shape), names)


def lower_sharded(fn, mesh, spec, x):
  f = jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec)
  return jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))


def ids(mesh):
  return np.vectorize(lambda d: d.id)(mesh.devices)


def test_one_dimensional_mesh(isolated_disk_cache):
  mesh = cpu_mesh((8,), ("x",))
  x = jax.ShapeDtypeStruct((8 * 256,), jnp.float32)
  (cc,) = custom_calls(lower_sharded(functools.partial(jmf.ops.all_reduce, axis_name="x"), mesh, P("x"), x))
  config = cc["config"]
  assert cc["target"] == contract.COLLECTIVE_TARGET
  assert config["uses_xla_collective_metadata"] is True
  assert config["xla_replica_ids"].decode() == ",".join(str(i) for i in ids(mesh))
  assert config["symmetric_memory_parameters"] == b"0,0"
  assert config["skip_device_barrier"] is False
  assert config["param_order"] == [0, 1, -1]


@pytest.mark.parametrize("axis, expected", [
    ("b", lambda m: [list(row) for row in m]),        # cliques along b: the rows
    ("a", lambda m: [list(col) for col in m.T]),      # along a: the columns
    (("a", "b"), lambda m: [list(m.reshape(-1))]),    # both: one clique
])
def test_two_dimensional_mesh_gives_one_clique_per_group(isolated_disk_cache, axis, expected):
  mesh = cpu_mesh((2, 4), ("a", "b"))
  x = jax.ShapeDtypeStruct((8 * 256,), jnp.float32)
  fn = functools.partial(jmf.ops.all_reduce, axis_name=axis)
  (cc,) = custom_calls(lower_sharded(fn, mesh, P(("a", "b")), x))
  groups = [[int(d) for d in g.split(",")] for g in cc["config"]["xla_replica_ids"].decode().split(";")]
  assert groups == [[int(d) for d in g] for g in expected(ids(mesh))]


def test_symmetric_flags_and_skip_barrier(isolated_disk_cache):
  mesh = cpu_mesh((4,), ("x",))
  kernel = jmf.ops.collectives.kernel("all_reduce_f32")

  def fn(v):
    call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(v.shape, v.dtype), grid=1, block=256,
                             scalars=(np.int64(v.size),),
                             collective=jmf.Collective("x", symmetric=(True, False), skip_device_barrier=True))
    return call(v)

  (cc,) = custom_calls(lower_sharded(fn, mesh, P("x"), jax.ShapeDtypeStruct((1024,), jnp.float32)))
  assert cc["config"]["symmetric_memory_parameters"] == b"1,0"
  assert cc["config"]["skip_device_barrier"] is True


def test_a_plain_kernel_under_shard_map_is_unchanged(isolated_disk_cache):
  mesh = cpu_mesh((8,), ("x",))
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")

  def fn(v):
    return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(v.shape, v.dtype), grid=1, block=256,
                             scalars=(np.int32(v.size),))(v, v)

  (cc,) = custom_calls(lower_sharded(fn, mesh, P("x"), jax.ShapeDtypeStruct((2048,), jnp.float32)))
  assert cc["target"] == contract.LAUNCH_TARGET
  assert cc["config"]["uses_xla_collective_metadata"] is False
  assert not {"xla_replica_ids", "symmetric_memory_parameters", "skip_device_barrier"} & set(cc["config"])
  assert cc["config"]["param_order"] == [0, 1, 2, -1]  # no metadata pointer


def test_the_metadata_pointer_is_checked_against_the_kernel_signature(isolated_disk_cache):
  mesh = cpu_mesh((2,), ("x",))
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")  # has no metadata parameter

  def fn(v):
    return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(v.shape, v.dtype), grid=1, block=256,
                             scalars=(np.int32(v.size),), collective=jmf.Collective("x"))(v, v)

  with pytest.raises(jmf.LaunchError, match="collective metadata"):
    lower_sharded(fn, mesh, P("x"), jax.ShapeDtypeStruct((512,), jnp.float32))


def test_outside_shard_map_a_collective_kernel_names_the_problem(isolated_disk_cache):
  kernel = jmf.ops.collectives.kernel("all_reduce_f32")
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((256,), jnp.float32), grid=1, block=256,
                           scalars=(np.int64(256),), collective=jmf.Collective("x"))
  with pytest.raises(jmf.LaunchError, match="inside shard_map"):
    jax.jit(call).trace(jax.ShapeDtypeStruct((256,), jnp.float32)).lower(lowering_platforms=("cuda",))


def test_an_unknown_axis_is_named(isolated_disk_cache):
  mesh = cpu_mesh((2,), ("x",))
  with pytest.raises(ValueError, match=r"collective axis 'y' is not an axis of the mesh \('x',\)"):
    lower_sharded(functools.partial(jmf.ops.all_reduce, axis_name="y"), mesh, P("x"),
                  jax.ShapeDtypeStruct((512,), jnp.float32))


def test_rendezvous_trades_deposits_between_ranks():
  results = _core._testing.rendezvous_probe(participants=4, arriving=4, timeout_s=fresh_process.INNER_GUARD_S)
  assert results == ["100 101 102 103 "] * 4


def test_a_peer_that_never_arrives_times_out_with_its_rank_named():
  (result,) = _core._testing.rendezvous_probe(participants=2, arriving=1, timeout_s=0.2)
  assert "rank 0 of 2 waited 0.2 s for peer rank(s) 1" in result
  assert "JAX_MOSAIC_FFI_PEER_TIMEOUT_S" in result


# ---------------------------------------------------------------- on GPUs

def gpu_mesh(shape, names):
  devices = jax.devices("cuda")
  count = int(np.prod(shape))
  if len(devices) < count:
    pytest.skip(f"needs {count} GPUs")
  return Mesh(np.array(devices[:count]).reshape(shape), names)


def sharded_all_reduce(mesh, axis):
  return jax.jit(jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name=axis), mesh=mesh,
                               in_specs=P(mesh.axis_names), out_specs=P(mesh.axis_names)))


# A collective kernel whose output differs from its input in every way the
# runtime can get wrong: out = scale * (x summed over the ranks, read through
# the peer table, not the x parameter) + 1000 * rank + num_peers. Then the exit
# barrier, after which block 0 (the only block, so the last to arrive) reports
# the generation this rank's barrier reached: one more on every call.
SCALED_SUM = r'''
#include <jax_mosaic_ffi/collective.cuh>
extern "C" __global__ void scaled_sum(const float* x, float* out, unsigned long long* generation, float scale,
                                      long long n, const jmf::CollectiveMetadata* meta) {
  const int peers = jmf::num_peers(meta);
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < peers; ++r) acc += jmf::peer_ptr<const float>(meta, 0, r)[i];
    out[i] = scale * acc + 1000.0f * jmf::rank(meta) + peers;
  }
  jmf::exit_barrier(meta);
  if (threadIdx.x == 0) {
    const int r = jmf::rank(meta);
    generation[0] = jmf::load_acquire_sys(jmf::barrier_areas(meta)[r] + jmf::kKernelRow + r);
  }
}
'''


def scaled_sum(v, axis_name="x", scale=3.0, **collective):
  call = jmf.mosaic_kernel(jmf.cuda_kernel(SCALED_SUM, "scaled_sum"),
                           (jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct((1,), jnp.uint64)),
                           grid=1, block=256, scalars=(np.float32(scale), np.int64(v.size)),
                           collective=jmf.Collective(axis_name, **collective))
  return call(v)


def check_generations(generations):
  """One barrier generation per call, counting up from wherever the area was."""
  generations = [int(np.asarray(g).reshape(-1)[0]) for g in generations]
  assert generations[0] >= 1 and generations == list(range(generations[0], generations[0] + len(generations)))


@pytest.mark.gpu
@pytest.mark.parametrize("skip_device_barrier", [False, True])
def test_one_device_clique_sees_its_rank_peers_and_barrier(rng, isolated_disk_cache, skip_device_barrier):
  mesh = gpu_mesh((1,), ("x",))
  with jax.enable_x64(True):
    f = jax.jit(jax.shard_map(functools.partial(scaled_sum, skip_device_barrier=skip_device_barrier), mesh=mesh,
                              in_specs=P("x"), out_specs=(P("x"), P())))
    generations = []
    for _ in range(3):  # fresh inputs each time
      x = rng.standard_normal(5000).astype(np.float32)
      out, generation = f(x)
      np.testing.assert_allclose(np.asarray(out), 3.0 * x + 1.0, rtol=1e-6, atol=1e-6)
      generations.append(generation)
  check_generations(generations)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_one_device_clique_all_reduce(rng, isolated_disk_cache, dtype):
  # The shipped kernel on one rank is a copy; scaled around it, a result left
  # from an earlier call or an unwritten (poisoned) element still shows.
  mesh = gpu_mesh((1,), ("x",))
  f = jax.jit(jax.shard_map(lambda v: 2 * jmf.ops.all_reduce(v + 1, axis_name="x") - 3, mesh=mesh,
                            in_specs=P("x"), out_specs=P("x")))
  for _ in range(2):
    x = (rng.standard_normal(100_000) * 100).astype(dtype)
    np.testing.assert_array_equal(np.asarray(f(x)), 2 * (x + 1) - 3)


@pytest.mark.gpu
def test_one_device_clique_under_pmap(rng, isolated_disk_cache):
  f = jax.pmap(functools.partial(scaled_sum, axis_name="i", scale=-2.0), axis_name="i",
               devices=jax.devices("cuda")[:1])
  with jax.enable_x64(True):
    generations = []
    for _ in range(2):
      x = rng.standard_normal((1, 4096)).astype(np.float32)
      out, generation = f(x)
      np.testing.assert_allclose(np.asarray(out), -2.0 * x + 1.0, rtol=1e-6, atol=1e-6)
      generations.append(generation)
  check_generations(generations)


@pytest.mark.gpu
def test_one_device_all_gather(rng, isolated_disk_cache):
  mesh = gpu_mesh((1,), ("x",))
  f = jax.jit(jax.shard_map(lambda v: jmf.ops.all_gather(v * 2, axis_name="x", axis_size=1) + 1, mesh=mesh,
                            in_specs=P("x"), out_specs=P(None, "x")))
  for _ in range(2):
    x = rng.standard_normal(3000).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(f(x)), x[None] * 2 + 1)


METADATA = r'''
#include <jax_mosaic_ffi/collective.cuh>
// Writes what the kernel sees: rank, peers, and checks on the peer table.
extern "C" __global__ void show_metadata(const float* a, const int* b, long long* out,
                                         const jmf::CollectiveMetadata* meta) {
  if (threadIdx.x != 0) return;
  const int n = jmf::num_peers(meta);
  const int r = jmf::rank(meta);
  out[0] = r;
  out[1] = n;
  out[2] = (const char*)meta->param_to_peers - (const char*)meta;   // 32: right after the header
  out[3] = (const char*)meta->param_to_multimem - (const char*)meta->param_to_peers;  // P * N * 8
  out[4] = jmf::peer_ptr<const float>(meta, 0, r) == a;            // my own input, as the table has it
  out[5] = jmf::peer_ptr<const int>(meta, 1, r) == b;
  out[6] = jmf::peer_ptr<long long>(meta, 2, r) == out;             // outputs are in the table too
  out[7] = meta->param_to_multimem[0] == nullptr && meta->param_to_multimem[2] == nullptr;
  out[8] = jmf::barrier_areas(meta)[r] != nullptr;
}
'''


@pytest.mark.gpu
def test_metadata_seen_by_the_kernel(rng, isolated_disk_cache):
  mesh = gpu_mesh((1,), ("x",))
  kernel = jmf.cuda_kernel(METADATA, "show_metadata")

  def fn(a, b):
    call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((16,), jnp.int64), grid=1, block=32,
                             collective=jmf.Collective("x"))
    return call(a, b)

  with jax.enable_x64(True):
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
    out = np.asarray(f(rng.standard_normal(512).astype(np.float32), np.arange(256, dtype=np.int32)))
  rank, peers, to_peers, table_bytes, own_a, own_b, own_out, multimem_null, area = out[:9]
  assert (rank, peers) == (0, 1)
  assert to_peers == 32
  assert table_bytes == 3 * 1 * 8
  assert own_a == own_b == own_out == 1
  assert multimem_null == 1 and area == 1


@pytest.mark.gpu
@pytest.mark.parametrize("command_buffers", [True, False], ids=["command-buffers", "stream"])
def test_collective_kernels_chained_in_and_out_of_a_command_buffer(rng, tmp_path, command_buffers):
  result = fresh_process.run(CHAINED_SCALED_SUMS, cwd=tmp_path, env={
      "XLA_FLAGS": "" if command_buffers else "--xla_gpu_enable_command_buffer=",
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache"), "JAX_ENABLE_X64": "1"}).result
  assert result["right"] == [True] * 3
  # One generation per barrier: a call moves the last kernel's area on by 1
  # (an area per call site) or 6 (one shared by the chain), the same each time.
  steps = result["generation_steps"]
  assert steps[0] == steps[1] and steps[0] in (1, 6), steps


CHAINED_SCALED_SUMS = '''
    import functools, json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import test_collectives as t
    mesh = Mesh(np.array(jax.devices("cuda")[:1]), ("x",))

    def chain(v):
      generation = None
      for _ in range(6):  # enough consecutive custom calls for XLA to form a command buffer
        v, generation = t.scaled_sum(v, scale=2.0)
      return v, generation

    f = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))
    rng = np.random.default_rng()
    right, generations = [], []
    for _ in range(3):
      x = rng.standard_normal(8192).astype(np.float32)
      expected = x
      for _ in range(6):
        expected = 2.0 * expected + 1.0
      out, generation = f(x)
      right.append(bool(np.allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-4)))
      generations.append(int(np.asarray(generation)[0]))
    print(json.dumps({"right": right, "generation_steps": np.diff(generations).tolist()}))
'''


# ---------------------------------------------------------------- many GPUs

@pytest.mark.multi_gpu
@pytest.mark.parametrize("shape, names, axis", [
    ((2,), ("x",), "x"),
    ((4,), ("x",), "x"),
    ((8,), ("x",), "x"),
    ((2, 2), ("a", "b"), "b"),
    ((2, 2), ("a", "b"), "a"),
    ((2, 4), ("a", "b"), ("a", "b")),
])
def test_all_reduce_equals_psum(rng, isolated_disk_cache, shape, names, axis):
  mesh = gpu_mesh(shape, names)
  n = int(np.prod(shape))
  x = rng.standard_normal(n * 65536).astype(np.float32)
  x = jax.device_put(x, NamedSharding(mesh, P(names)))
  ours = sharded_all_reduce(mesh, axis)
  reference = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, axis), mesh=mesh, in_specs=P(names),
                                    out_specs=P(names)))
  np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(reference(x)), rtol=1e-6, atol=1e-5)


@pytest.mark.multi_gpu
@pytest.mark.parametrize("count", [2, 4, 8])
def test_all_gather_equals_lax_all_gather(rng, isolated_disk_cache, count):
  mesh = gpu_mesh((count,), ("x",))
  x = jax.device_put(rng.standard_normal(count * 4096).astype(np.float32), NamedSharding(mesh, P("x")))
  ours = jax.jit(jax.shard_map(functools.partial(jmf.ops.all_gather, axis_name="x", axis_size=count),
                               mesh=mesh, in_specs=P("x"), out_specs=P(None, "x")))
  reference = jax.jit(jax.shard_map(lambda v: jax.lax.all_gather(v, "x"), mesh=mesh, in_specs=P("x"),
                                    out_specs=P(None, "x")))
  np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(reference(x)))


MANY_ITERATIONS = '''
    import functools, json, sys
    import jax, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import jax_mosaic_ffi as jmf
    count = jax.device_count()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    reduce = jax.jit(jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x"), mesh=mesh,
                                   in_specs=P("x"), out_specs=P("x")))
    rng = np.random.default_rng(int(sys.argv[1]))
    wrong = 0
    for i in range(1000):
      x = rng.integers(-1000, 1000, size=count * 4096).astype(np.int32)
      expected = np.tile(x.reshape(count, -1).sum(0), count)
      wrong += int((np.asarray(reduce(x)) != expected).sum())
    print(json.dumps({"wrong": wrong}))
'''


@pytest.mark.multi_gpu
@pytest.mark.parametrize("xla_flags", ["", "--xla_gpu_enable_command_buffer="])
def test_a_thousand_iterations_without_a_hang_or_a_wrong_value(tmp_path, xla_flags):
  result = fresh_process.run(MANY_ITERATIONS, 7, cwd=tmp_path,
                             env={"XLA_FLAGS": xla_flags, "NCCL_NVLS_ENABLE": "0"}).result
  assert result["wrong"] == 0


PEER_SKIPS = '''
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import jax_mosaic_ffi as jmf
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))

    def fn(v):
      # Device 1 never calls the kernel: device 0 must time out, not hang. (An all-reduce's result is the same on
      # every rank; cond's branches must agree that it varies over x, as the other branch's does.)
      return jax.lax.cond(jax.lax.axis_index("x") == 0,
                          lambda u: jax.lax.pcast(jmf.ops.all_reduce(u, axis_name="x"), "x", to="varying"),
                          lambda u: u, v)

    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    try:
      jax.block_until_ready(f(np.ones(2 * 1024, np.float32)))
      print(json.dumps({"error": None}))
    except Exception as e:
      print(json.dumps({"error": str(e)}))
'''


@pytest.mark.multi_gpu
def test_a_peer_that_never_arrives_ends_in_a_timeout(tmp_path):
  result = fresh_process.run(PEER_SKIPS, cwd=tmp_path,
                             env={"JAX_MOSAIC_FFI_PEER_TIMEOUT_S": "3", "NCCL_NVLS_ENABLE": "0"}).result
  assert "never arrived" in (result["error"] or "")


def _export_all_reduce(mesh):
  f = jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  return jax.export.export(jax.jit(f), platforms=["cuda"])(jax.ShapeDtypeStruct((mesh.size * 256,), jnp.float32))


def test_an_exported_collective_names_devices_0_to_n_in_mesh_order(isolated_disk_cache):
  exported = _export_all_reduce(cpu_mesh((4,), ("x",)))
  assert 'xla_replica_ids = "0,1,2,3"' in exported.mlir_module()
  assert contract.COLLECTIVE_TARGET in exported.mlir_module()


@pytest.mark.parametrize("order", [[4, 5, 6, 7], [1, 0, 3, 2]], ids=["other_devices", "permuted"])
def test_exporting_a_collective_over_another_device_order_is_refused_at_the_call(isolated_disk_cache, order):
  cpu_mesh((8,), ("x",))  # skips without eight host devices
  devices = {d.id: d for d in jax.devices("cpu")}
  mesh = Mesh(np.array([devices[i] for i in order]), ("x",))
  # Its cliques would name these ids: called on devices 0..3 (jax's default), the ranks would follow this order.
  with pytest.raises(jmf.LaunchError, match=(
      r"mosaic_kernel 'all_reduce_f32' at .*: jax.export of a collective kernel needs a mesh of devices 0..3 in "
      r"row-major order .*this mesh's devices are " + re.escape(str(order)))):
    _export_all_reduce(mesh)
