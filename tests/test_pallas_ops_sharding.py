"""The Pallas ops' backward kernels split as their forward ones under jit (issue 78): mha's delta, dK/dV and dQ by
batch and heads, the norms' backward by groups of rows (their dw and db summed across devices by XLA); on 8 CPU
devices, gradients under jit and eagerly against the references, where the gradients live, and, in a fresh
process, XLA's partitioned program of the CUDA lowering: every kernel on per-shard shapes, nothing gathered."""

import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from triton_required import import_triton

import_triton()

from jax_mosaic_ffi.base import contract  # noqa: E402

import fresh_process  # noqa: E402
import pallas_ops_cases as cases  # noqa: E402

NAMES = ["mha-causal-segments", "mha", "layer_norm", "rms_norm"]
BATCH = 8


def _mesh():
  if jax.device_count() < BATCH:
    pytest.skip("needs --xla_force_host_platform_device_count=8 before jax starts")
  return jax.make_mesh((BATCH,), ("x",), axis_types=(AxisType.Auto,))


def _batched(name, rng):
  """The case's inputs with a batch of 8 (split on the mesh) and which of them are split: weights are not."""
  inputs = cases.CASES[name].make(rng, jnp.float32)
  if name.endswith("norm"):
    return [jnp.tile(inputs[0], (3, 1, 1))[:BATCH], *inputs[1:]], [True, False, False]
  return [jnp.concatenate([x] * (-(-BATCH // x.shape[0])))[:BATCH] for x in inputs], [True] * len(inputs)


def _placed(inputs, split, mesh):
  return [jax.device_put(x, NamedSharding(mesh, P("x") if s else P())) for x, s in zip(inputs, split)]


@pytest.mark.parametrize("eager", [False, True], ids=["jit", "eager"])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_through_the_sharded_backward_are_the_references(name, eager, rng):
  case = cases.CASES[name]
  inputs, split = _batched(name, rng)
  grad = jax.grad(cases.loss(case.op), argnums=case.grads)
  got = (grad if eager else jax.jit(grad))(*_placed(inputs, split, _mesh()))
  want = jax.grad(cases.loss(case.reference), argnums=case.grads)(*inputs)
  for i, g, w in zip(case.grads, got, want):
    cases.assert_close(g, w, jnp.float32, f"{name} d/d input {i}", scale=5)
    if split[i]:  # a batch-split input's gradient stays split
      assert g.sharding.spec[0] == "x", (i, g.sharding)


PARTITION = '''
    import glob, json, sys
    import jax, jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import pallas_ops_cases as cases
    import test_pallas_ops_sharding as t
    import numpy as np
    name = sys.argv[2]
    case = cases.CASES[name]
    inputs, split = t._batched(name, np.random.default_rng(0))
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    avals = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P("x") if s else P()))
             for x, s in zip(inputs, split)]
    grad = jax.grad(lambda *a: jnp.sum(jnp.sin(case.op(*a))), argnums=case.grads)
    lowered = jax.jit(grad).trace(*avals).lower(lowering_platforms=("cuda",))
    try:
      lowered.compile()  # the CPU compiler partitions, then finds no CPU handler for a CUDA kernel
    except Exception:
      pass
    (dump,) = glob.glob(sys.argv[1] + "/*after_spmd-partitioning*")
    print(json.dumps({"partitioned": open(dump).read()}))
'''

# Each op's kernels in its gradient's program, and the first dimension of each of their results per device: batch
# 8 on 8 devices is 1 (the norms' forward sees rows, 37 of a device's 296; their backward groups of rows, 1 of 8).
KERNELS = {"mha-causal-segments": ["mha_forward_segments", "mha_delta", "mha_dkdv_segments", "mha_dq_segments"],
           "layer_norm": ["norm_forward", "norm_backward"]}
ROWS = {"mha_forward_segments": 1, "mha_delta": 1, "mha_dkdv_segments": 1, "mha_dq_segments": 1,
        "norm_forward": 37, "norm_backward": 1}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_backward_kernels_are_partitioned_to_per_shard_shapes(name, tmp_path):
  dump = tmp_path / "dump"
  flags = f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"
  result = fresh_process.run(PARTITION, dump, name, env={
      "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  partitioned = result["partitioned"]
  launches = [line for line in partitioned.splitlines() if contract.LAUNCH_TARGET in line]
  found = {}
  for line in launches:
    kernel = re.search(r'kernel_name = "([a-z_]+)"', line).group(1)
    firsts = {int(d) for d in re.findall(r"[fbs](?:32|16|8)\[(\d+)", line.split("custom-call(")[0])}
    found[kernel] = firsts
  assert sorted(found) == sorted(KERNELS[name]), launches
  for kernel, firsts in found.items():
    assert firsts == {ROWS[kernel]}, (kernel, firsts)
  assert "all-gather" not in partitioned and "all-to-all" not in partitioned
