"""The contract's one validator against hostile attributes, and crafted artifacts on a GPU.

`_core.validate_launch` is the code XLA's instantiate stage runs on every
custom call, exposed through nanobind: here it meets the values an edited
StableHLO or jax.export artifact can carry. On the GPU, crafted custom calls
reach the real runtime in a child process, which must survive with an error
naming the call site.
"""

import hashlib

import numpy as np
import pytest

from jax_mosaic_ffi import _core

import fresh_process

INT32_MAX = 2**31 - 1
INT32_MIN = -2**31
LIMITS = _core.LIMITS


def attributes(**changes):
  """A valid launch of add(a, b, out, n), with `changes` applied (None deletes)."""
  base = {
      "kernel_hash": hashlib.sha256(b"module").digest(),
      "kernel_name": "add",
      "call_site": "model.py:12 (f)",
      "use_custom_barrier": False,
      "uses_xla_collective_metadata": False,
      "grid": [4, 1, 1], "block": [256, 1, 1], "cluster": [1, 1, 1],
      "smem_bytes": 0, "uses_pdl": False,
      "num_inputs": 2, "num_outputs": 1,
      "param_order": [0, 1, 2, -1],
      "scalar_sizes": [4], "scalar_data": np.int64(1024).tobytes(),
  }
  for name, value in changes.items():
    if value is None:
      base.pop(name, None)
    else:
      base[name] = value
  return base


def collective(**changes):
  return attributes(**{"uses_xla_collective_metadata": True, "xla_replica_ids": "0,1", **changes})


def test_a_valid_launch_gives_the_kernel_signature():
  assert _core.validate_launch(attributes(), False) == {"param_sizes": [8, 8, 8, 4], "num_buffers": 3,
                                                        "batch_size": 1, "host_launch": False}
  assert _core.validate_launch(collective(), True)["param_sizes"] == [8, 8, 8, 4, 8]
  assert _core.validate_launch(attributes(cost_estimate_json='{"flops": 1}' + " " * 4084), False)["num_buffers"] == 3


@pytest.mark.parametrize("changes, message", [
    # A stack overflow once: 1 operand, 699 results, param_order = [699].
    (dict(num_inputs=1, num_outputs=699, param_order=[699], scalar_sizes=None, scalar_data=None),
     "num_outputs = 699 is out of range"),
    (dict(num_outputs=None, param_order=[699]), "num_inputs = 2 is more than the 0 buffers"),
    (dict(param_order=list(range(300))), "param_order has 300 entries"),
    # Signed overflow once: INT32_MAX + 1 and num_inputs + INT32_MAX.
    (dict(param_order=[INT32_MAX]), f"names buffer {INT32_MAX}, but the call has 3"),
    (dict(param_order=[INT32_MIN]), f"names scalar {INT32_MAX}, which is missing"),
    (dict(poison_outputs=[INT32_MAX]), f"poison_outputs names output {INT32_MAX}"),
    (dict(poison_outputs=[-1]), "poison_outputs names output -1"),
    (dict(poison_outputs=[0, 0]), "names each once"),
    # A cluster product that wrapped to 0 in 32 bits once.
    (dict(cluster=[65536, 65536, 1], grid=[65536, 65535, 1]), r"cluster\[0\] = 65536 is out of range"),
    (dict(cluster=[4, 4, 2], grid=[8, 8, 2]), "a cluster of 32 blocks is more than"),
    (dict(grid=[4, 1, 1], cluster=[3, 1, 1]), r"grid\[0\] = 4 is not a multiple of cluster\[0\] = 3"),
    (dict(grid=[0, 1, 1]), r"grid\[0\] = 0 is out of range"),
    (dict(grid=[1, 70000, 1]), r"grid\[1\] = 70000 is out of range"),
    (dict(grid=[1, 1]), "grid must hold 3 values"),
    (dict(block=[32, 32, 2]), "2048 threads"),
    (dict(smem_bytes=-1), "smem_bytes = -1 is negative"),
    (dict(smem_bytes=2**31), "smem_bytes = 2147483648 is out of range"),
    (dict(smem_bytes=2**70), "smem_bytes = 9223372036854775807 is out of range"),
    (dict(num_inputs=-1), "num_inputs = -1 is out of range"),
    (dict(num_inputs=257), "num_inputs = 257 is out of range"),
    (dict(scalar_sizes=[9], scalar_data=bytes(8)), "scalars are 1 to 8 bytes"),
    (dict(scalar_sizes=[4, 4]), "scalar_data holds 8 bytes for 2 scalars"),
    (dict(param_order=[0, 1, 2, -1, -1]), "named twice"),
    (dict(kernel_hash=b"short"), "kernel_hash is 5 bytes"),
    (dict(use_custom_barrier=True), "use_custom_barrier=true is not supported"),
    (dict(uses_xla_collective_metadata=True), "does not match the custom call target"),
    # Wrong types, which once threw through the FFI boundary.
    (dict(kernel_name=7), "attribute 'kernel_name' has the wrong type"),
    (dict(call_site=[1, 2]), "attribute 'call_site' has the wrong type"),
    (dict(grid="12"), "attribute 'grid' has the wrong type"),
    (dict(smem_bytes=1.5), "attribute 'smem_bytes' has the wrong type"),
    (dict(uses_pdl=1), "attribute 'uses_pdl' has the wrong type"),
    (dict(kernel_hash=bytes(2000)), "attribute 'kernel_hash' has the wrong type or size"),
    # For profilers only, and bounded all the same.
    (dict(cost_estimate_json=[1, 2]), "attribute 'cost_estimate_json' has the wrong type"),
    (dict(cost_estimate_json="0" * 4097), "attribute 'cost_estimate_json' has the wrong type or size"),
    (dict(param_order=None), "no 'param_order' attribute"),
    # vmap's batch: bounded, one stride per buffer, outputs never shared.
    (dict(batch_size=0), "batch_size = 0 is out of range"),
    (dict(batch_size=2**20, batch_strides=[4, 4, 4]), "batch_size = 1048576 is out of range"),
    (dict(batch_size=4, batch_strides=[4, 4]), "batch_strides has 2 entries for 3 buffers"),
    (dict(batch_size=4, batch_strides=[4, 4, 0]), r"batch_strides\[2\] = 0 is out of range 1"),
    (dict(batch_size=4, batch_strides=[-4, 4, 4]), r"batch_strides\[0\] = -4 is out of range"),
    (dict(batch_size=4, batch_strides=[2**62, 4, 4]), r"batch_strides\[0\] = 4611686018427387904"),
    (dict(batch_strides=[4, 4, 4]), "without a batch_size above 1"),
    (dict(grid=None), "no 'grid' attribute"),
])
def test_hostile_launch_attributes_are_refused_by_name(changes, message):
  with pytest.raises(ValueError, match=message):
    _core.validate_launch(attributes(**changes), False)


@pytest.mark.parametrize("changes, message", [
    # A rendezvous sized at gigabytes once.
    (dict(param_order=[100000000]), "names buffer 100000000"),
    (dict(xla_replica_ids="0,0"), "names device 0 twice"),
    (dict(xla_replica_ids="0,64"), "device id of 64 or more"),
    (dict(xla_replica_ids="0,99999999999999999999"), "device id of"),
    (dict(xla_replica_ids="0,,1"), "an empty entry"),
    (dict(xla_replica_ids="0;1;"), "an empty entry"),
    (dict(xla_replica_ids="0,-1"), "only digits"),
    (dict(xla_replica_ids="0\x001"), "only digits"),
    (dict(xla_replica_ids=""), "must list the devices"),
    (dict(xla_replica_ids=None), "must list the devices"),
    (dict(symmetric_memory_parameters="1,0"), "has 2 flags for 3 buffers"),
    (dict(symmetric_memory_parameters="1,0,2"), "must be 0/1 flags"),
    (dict(skip_device_barrier="yes"), "attribute 'skip_device_barrier' has the wrong type"),
])
def test_hostile_collective_attributes_are_refused_by_name(changes, message):
  with pytest.raises(ValueError, match=message):
    _core.validate_launch(collective(**changes), True)


def test_messages_stay_valid_text_whatever_the_attributes_hold():
  ids = b"0,\xff" + ("ä" * 300).encode()  # a byte that is not text, then a cut inside a character
  with pytest.raises(ValueError, match=r"xla_replica_ids '0,\?(ä){254}\?\.\.\.' is malformed"):
    _core.validate_launch(collective(xla_replica_ids=ids), True)


def test_a_clique_of_every_device_is_accepted_and_one_more_is_not():
  ids = ",".join(str(i) for i in range(LIMITS["max_peers"]))
  _core.validate_launch(collective(xla_replica_ids=ids), True)
  with pytest.raises(ValueError):
    _core.validate_launch(collective(xla_replica_ids=ids + f",{LIMITS['max_peers']}"), True)


def test_v1_artifacts_without_num_outputs_count_buffers_from_param_order():
  checked = _core.validate_launch(attributes(num_outputs=None), False)
  assert checked["num_buffers"] == 3


def test_random_attribute_values_never_crash_the_validator(rng):
  """A quick property check; tests/test_fuzz.py runs the C++ fuzzer under sanitizers."""
  edges = [0, 1, -1, 2, 3, 255, 256, 257, 1024, 1025, 65535, 65536, INT32_MAX, INT32_MIN, 2**40, -2**63]
  names = ["grid", "block", "cluster", "param_order", "scalar_sizes", "poison_outputs"]
  accepted = 0
  for _ in range(3000):
    changes = {}
    for name in rng.choice(names, size=rng.integers(1, 4), replace=False):
      changes[str(name)] = [int(rng.choice(edges)) for _ in range(rng.integers(0, 5))]
    if rng.random() < 0.3:
      changes["num_outputs"] = int(rng.choice(edges))
    if rng.random() < 0.3:
      changes["smem_bytes"] = int(rng.choice(edges))
    try:
      checked = _core.validate_launch(attributes(**changes), False)
    except ValueError:
      continue
    accepted += 1
    assert checked["num_buffers"] <= LIMITS["max_buffers"]
    assert len(checked["param_sizes"]) <= LIMITS["max_params"]
  print(f"{accepted} of 3000 random launches were valid")


# ------------------------------------------------------------ on the GPU

CRAFTED = '''
    import dataclasses, json
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    from jax_mosaic_ffi.call import launch_spec
    from jax_mosaic_ffi.call.primitive import mosaic_kernel_p

    source = r"""
    extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = a[i] + b[i];
    }
    """
    kernel = jmf.cuda_kernel(source, "add")
    n = 1024
    x = jnp.arange(n, dtype=jnp.float32)
    one = jax.core.ShapedArray((n,), jnp.float32)
    good = launch_spec.LaunchSpec(grid=(4, 1, 1), block=(256, 1, 1), cluster=(1, 1, 1), smem_bytes=0,
                                  uses_pdl=False, num_inputs=2, num_outputs=1, param_order=(0, 1, 2, -1),
                                  scalar_data=np.int64(n).tobytes(), scalar_sizes=(4,), aliases=(),
                                  collective=None, call_site="crafted.py:1 (attack)")

    def crafted(out_avals, **changes):
      # Binding the primitive directly skips the trace-time checks: the custom
      # call carries these attributes just as an edited artifact would.
      spec = dataclasses.replace(good, **changes)
      def f(*args):
        return mosaic_kernel_p.bind(*args[:spec.num_inputs], kernel=kernel, out_avals=out_avals, spec=spec)
      return jax.jit(f)

    cases = {
        "699 results": crafted((one,) * 699, num_inputs=1, num_outputs=699, param_order=(699,),
                               scalar_data=b"", scalar_sizes=()),
        "param_order INT32_MAX": crafted((one,), param_order=(2**31 - 1,)),
        "negative scalar": crafted((one,), param_order=(-2**31,)),
        "cluster overflow": crafted((one,), cluster=(65536, 65536, 1), grid=(65536, 65536, 1)),
        "huge smem": crafted((one,), smem_bytes=2**31 - 1),
    }
    errors = {}
    for name, f in cases.items():
      try:
        jax.block_until_ready(f(x, x))
        errors[name] = None
      except Exception as e:
        errors[name] = str(e)

    # Launch programs (contract v2): run at the first execution, with checked arithmetic; and refused by the
    # v1 target, which an older runtime would have run with the placeholder grid.
    program_cases = {
        "programs grid 0": crafted((one,), launch_programs=(0, 0, 2, 0, 0)),
        "programs overflow": crafted((one,), launch_programs=(0, 0, 6, 1, 0, 0, 0, 2**62, 3)),
        "programs scalar width": crafted((one,), launch_programs=(1, 0, 6, 1, 0, 0, 0, 2**40, 3)),
    }
    for name, f in program_cases.items():
      try:
        jax.block_until_ready(f(x, x))
        errors[name] = None
      except Exception as e:
        errors[name] = str(e)
    from jax_mosaic_ffi.base import contract
    lowered_as_v2 = contract.target_name
    contract.target_name = lambda **_: contract.LAUNCH_TARGET
    try:
      jax.block_until_ready(crafted((one,), launch_programs=(0, 0, 3, 1, 0, 0))(x, x))
      errors["programs on v1"] = None
    except Exception as e:
      errors["programs on v1"] = str(e)
    finally:
      contract.target_name = lowered_as_v2

    # The same through a serialized jax.export artifact, as a user would load one.
    exported = jax.export.export(cases["param_order INT32_MAX"], platforms=["cuda"],
                                 disabled_checks=jmf.export_disabled_checks())(x, x)
    artifact = jax.export.deserialize(exported.serialize())
    try:
      jax.block_until_ready(artifact.call(x, x))
      errors["artifact"] = None
    except Exception as e:
      errors["artifact"] = str(e)

    # The process is still fine.
    add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=4, block=256,
                            scalars=(np.int32(n),))
    still_works = bool((np.asarray(jax.jit(add)(x, x)) == 2 * np.arange(n, dtype=np.float32)).all())
    print(json.dumps({"errors": errors, "still_works": still_works}))
'''


@pytest.mark.gpu
def test_crafted_custom_calls_get_an_error_naming_the_call_site(tmp_path):
  result = fresh_process.run(CRAFTED, cwd=tmp_path, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  print(result)
  assert result["still_works"]
  for name, error in result["errors"].items():
    assert error is not None, f"{name} was accepted"
    assert "mosaic_kernel 'add' at crafted.py:1 (attack)" in error, (name, error)
  assert "num_outputs = 699 is out of range" in result["errors"]["699 results"]
  assert "names buffer 2147483647" in result["errors"]["artifact"]
  assert "grid[0] is 0 for these shapes; it must be 1..2147483647" in result["errors"]["programs grid 0"]
  assert ("grid[0] = in0.shape[0] * 4611686018427387904 overflows int64 (1024 * 4611686018427387904)"
          in result["errors"]["programs overflow"])
  assert ("scalars[0] = in0.shape[0] * 1099511627776 is 1125899906842624 for these shapes, which does not fit its "
          "int32" in result["errors"]["programs scalar width"])
  assert ("launch_programs needs a contract v2 target (jax_mosaic_ffi_launch_v2); this call's target is of "
          "contract v1" in result["errors"]["programs on v1"])
