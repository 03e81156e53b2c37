"""Collective kernels lowered under shard_map over host-device meshes (no GPU)."""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core, contract

import conftest
import kernel_sources
from hlo_inspect import custom_calls

sys.path.insert(0, conftest.EXAMPLES)
import collectives  # noqa: E402


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
  (cc,) = custom_calls(lower_sharded(functools.partial(collectives.all_reduce, axis_name="x"), mesh, P("x"), x))
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
  fn = functools.partial(collectives.all_reduce, axis_name=axis)
  (cc,) = custom_calls(lower_sharded(fn, mesh, P(("a", "b")), x))
  groups = [[int(d) for d in g.split(",")] for g in cc["config"]["xla_replica_ids"].decode().split(";")]
  assert groups == [[int(d) for d in g] for g in expected(ids(mesh))]


def test_symmetric_flags_and_skip_barrier(isolated_disk_cache):
  mesh = cpu_mesh((4,), ("x",))
  kernel = collectives._kernel("all_reduce_f32")

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
  kernel = collectives._kernel("all_reduce_f32")
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((256,), jnp.float32), grid=1, block=256,
                           scalars=(np.int64(256),), collective=jmf.Collective("x"))
  with pytest.raises(jmf.LaunchError, match="inside shard_map"):
    jax.jit(call).trace(jax.ShapeDtypeStruct((256,), jnp.float32)).lower(lowering_platforms=("cuda",))


def test_an_unknown_axis_is_named(isolated_disk_cache):
  mesh = cpu_mesh((2,), ("x",))
  with pytest.raises(Exception, match="'y'"):
    lower_sharded(functools.partial(collectives.all_reduce, axis_name="y"), mesh, P("x"),
                  jax.ShapeDtypeStruct((512,), jnp.float32))


def test_rendezvous_trades_deposits_between_ranks():
  results = _core._testing.rendezvous_probe(participants=4, arriving=4, timeout_s=10.0)
  assert results == ["100 101 102 103 "] * 4


def test_a_peer_that_never_arrives_times_out_with_its_rank_named():
  (result,) = _core._testing.rendezvous_probe(participants=2, arriving=1, timeout_s=0.2)
  assert "rank 0 of 2 waited 0.2 s for peer rank(s) 1" in result
  assert "JAX_MOSAIC_FFI_PEER_TIMEOUT_S" in result
