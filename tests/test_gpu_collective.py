"""Collective kernels on real GPUs: one-device cliques here, many-GPU runs when lent."""

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_mosaic_ffi as jmf

import conftest

sys.path.insert(0, conftest.EXAMPLES)
import collectives  # noqa: E402

pytestmark = pytest.mark.gpu


def gpu_mesh(shape, names):
  devices = jax.devices("cuda")
  count = int(np.prod(shape))
  if len(devices) < count:
    pytest.skip(f"needs {count} GPUs")
  return Mesh(np.array(devices[:count]).reshape(shape), names)


def sharded_all_reduce(mesh, axis):
  return jax.jit(jax.shard_map(functools.partial(collectives.all_reduce, axis_name=axis), mesh=mesh,
                               in_specs=P(mesh.axis_names), out_specs=P(mesh.axis_names)))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_one_device_clique_all_reduce(rng, isolated_disk_cache, dtype):
  mesh = gpu_mesh((1,), ("x",))
  x = (rng.standard_normal(100_000) * 100).astype(dtype)
  out = sharded_all_reduce(mesh, "x")(x)
  np.testing.assert_array_equal(np.asarray(out), x)


def test_one_device_clique_under_pmap(rng, isolated_disk_cache):
  x = rng.standard_normal((1, 4096)).astype(np.float32)
  f = jax.pmap(functools.partial(collectives.all_reduce, axis_name="i"), axis_name="i",
               devices=jax.devices("cuda")[:1])
  np.testing.assert_array_equal(np.asarray(f(x)), x)


def test_one_device_all_gather(rng, isolated_disk_cache):
  mesh = gpu_mesh((1,), ("x",))
  x = rng.standard_normal(3000).astype(np.float32)
  f = jax.jit(jax.shard_map(functools.partial(collectives.all_gather, axis_name="x", axis_size=1), mesh=mesh,
                            in_specs=P("x"), out_specs=P(None, "x")))
  np.testing.assert_array_equal(np.asarray(f(x)), x[None])


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


def test_collective_kernel_inside_a_command_buffer(rng, isolated_disk_cache):
  mesh = gpu_mesh((1,), ("x",))
  kernel = collectives._kernel("all_reduce_f32")

  def chain(v):
    for _ in range(6):  # enough consecutive custom calls for XLA to form a command buffer
      call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(v.shape, v.dtype), grid=8, block=256,
                               scalars=(np.int64(v.size),), collective=jmf.Collective("x"))
      v = call(v) * 1.0
    return v

  f = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  x = rng.standard_normal(8192).astype(np.float32)
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(f(x)), x)


def test_skip_device_barrier(rng, isolated_disk_cache):
  mesh = gpu_mesh((1,), ("x",))
  kernel = collectives._kernel("all_reduce_f32")

  def fn(v):
    return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(v.shape, v.dtype), grid=4, block=256,
                             scalars=(np.int64(v.size),),
                             collective=jmf.Collective("x", skip_device_barrier=True))(v)

  x = rng.standard_normal(4096).astype(np.float32)
  f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  np.testing.assert_array_equal(np.asarray(f(x)), x)


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
  ours = jax.jit(jax.shard_map(functools.partial(collectives.all_gather, axis_name="x", axis_size=count),
                               mesh=mesh, in_specs=P("x"), out_specs=P(None, "x")))
  reference = jax.jit(jax.shard_map(lambda v: jax.lax.all_gather(v, "x"), mesh=mesh, in_specs=P("x"),
                                    out_specs=P(None, "x")))
  np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(reference(x)))


MANY_ITERATIONS = textwrap.dedent('''
    import functools, json, sys
    sys.path.insert(0, sys.argv[1])
    import jax, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import collectives
    count = jax.device_count()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    reduce = jax.jit(jax.shard_map(functools.partial(collectives.all_reduce, axis_name="x"), mesh=mesh,
                                   in_specs=P("x"), out_specs=P("x")))
    rng = np.random.default_rng(int(sys.argv[2]))
    wrong = 0
    for i in range(1000):
      x = rng.integers(-1000, 1000, size=count * 4096).astype(np.int32)
      expected = np.tile(x.reshape(count, -1).sum(0), count)
      wrong += int((np.asarray(reduce(x)) != expected).sum())
    print(json.dumps({"wrong": wrong}))
''')


@pytest.mark.multi_gpu
@pytest.mark.parametrize("xla_flags", ["", "--xla_gpu_enable_command_buffer="])
def test_a_thousand_iterations_without_a_hang_or_a_wrong_value(tmp_path, xla_flags):
  env = dict(os.environ, XLA_FLAGS=xla_flags, NCCL_NVLS_ENABLE="0")
  result = subprocess.run([sys.executable, "-c", MANY_ITERATIONS, conftest.EXAMPLES, "7"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '"wrong": 0' in result.stdout


PEER_SKIPS = textwrap.dedent('''
    import functools, sys
    sys.path.insert(0, sys.argv[1])
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import collectives
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))

    def fn(v):
      # Device 1 never calls the kernel: device 0 must time out, not hang.
      return jax.lax.cond(jax.lax.axis_index("x") == 0,
                          lambda u: collectives.all_reduce(u, axis_name="x"), lambda u: u, v)

    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    try:
      jax.block_until_ready(f(np.ones(2 * 1024, np.float32)))
      print("NO ERROR")
    except Exception as e:
      print("ERROR:", e)
''')


@pytest.mark.multi_gpu
def test_a_peer_that_never_arrives_ends_in_a_timeout(tmp_path):
  env = dict(os.environ, JAX_MOSAIC_FFI_PEER_TIMEOUT_S="3", NCCL_NVLS_ENABLE="0")
  result = subprocess.run([sys.executable, "-c", PEER_SKIPS, conftest.EXAMPLES], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
  assert "never arrived" in result.stdout, result.stdout + result.stderr[-3000:]
