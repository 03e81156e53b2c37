"""jax.export and the persistent compilation cache: nothing compiled twice."""

import hashlib
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core
from jax_mosaic_ffi.base import contract

import fresh_process
from hlo_inspect import custom_calls

ARTIFACT_V1 = pathlib.Path(__file__).parent / "data" / "add_v1.jax_export"
# Contract v2: grid and n follow the symbolic size n (tests/data/make_export_v2.py).
ARTIFACT_V2 = pathlib.Path(__file__).parent / "data" / "add_v2.jax_export"
# A one-device collective under shard_map, contract v1 (tests/data/make_export_collective_v1.py).
ARTIFACT_COLLECTIVE_V1 = pathlib.Path(__file__).parent / "data" / "scaled_sum_collective_v1.jax_export"

SOURCE = r'''
extern "C" __global__ void axpy(const float* x, const float* y, float* out, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}
'''
N = 8192


def make_call():
  kernel = jmf.cuda_kernel(SOURCE, "axpy")
  return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=N // 256, block=256,
                           scalars=(np.float32(2.0), np.int32(N)))


def export(fn):
  spec = jax.ShapeDtypeStruct((N,), jnp.float32)
  return jax.export.export(jax.jit(fn), platforms=["cuda"])(spec, spec)  # as a user writes it


def config_of(exported):
  (call,) = [c for c in custom_calls_of(exported)]
  return call


def custom_calls_of(exported):
  # Lower the deserialized module through jit so hlo_inspect can read it.
  text = exported.mlir_module()
  from jax._src.interpreters import mlir
  from jax._src.lib.mlir import ir
  with mlir.make_ir_context():
    module = ir.Module.parse(text)

    class Lowered:
      def compiler_ir(self, dialect):
        return module

    return custom_calls(Lowered())


def test_export_for_cuda_on_any_machine_round_trips(isolated_disk_cache):
  exported = export(make_call())
  blob = exported.serialize()
  again = jax.export.deserialize(blob)
  assert again.platforms == ("cuda",)
  (cc,) = custom_calls_of(again)
  assert cc["target"] == contract.LAUNCH_TARGET
  assert cc["config"]["kernel_hash"] == hashlib.sha256(cc["config"]["module"]).digest()
  assert cc["config"]["scalar_data"][:4] == np.float32(2.0).tobytes()


def test_export_as_a_user_writes_it_takes_every_target_of_the_contract(isolated_disk_cache):
  # jax.export's own list of stable targets holds all of ours, so no version of the contract needs disabled_checks.
  from jax._src.export import _export
  assert set(contract.ALL_TARGETS) <= _export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE
  exported = export(make_call())
  assert exported.disabled_safety_checks == ()
  # The contract's v2 target (a grid that follows a symbolic size), exported plainly too.
  (m,) = jax.export.symbolic_shape("m")
  call = jmf.mosaic_kernel(jmf.cuda_kernel(SOURCE, "axpy"), lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           block=256, grid=lambda x, y: jmf.cdiv(x.shape[0], 256),
                           scalars=lambda x, y: (np.float32(2.0), jmf.dim_scalar(x.shape[0], np.int32)))
  spec = jax.ShapeDtypeStruct((m,), jnp.float32)
  symbolic = jax.export.export(jax.jit(call), platforms=["cuda"])(spec, spec)
  assert f"stablehlo.custom_call @{contract.LAUNCH_TARGET_V2}(" in symbolic.mlir_module()
  # The keyword earlier versions asked for still works, and changes nothing in the call.
  spec = jax.ShapeDtypeStruct((N,), jnp.float32)
  again = jax.export.export(jax.jit(make_call()), platforms=["cuda"],
                            disabled_checks=jmf.export_disabled_checks())(spec, spec)
  (plain,), (checked,) = custom_calls_of(exported), custom_calls_of(again)
  assert plain["target"] == checked["target"] == contract.LAUNCH_TARGET
  assert plain["config"]["module"] == checked["config"]["module"]


# A jax whose list of stable targets the package cannot find (here: hidden while it is imported), then the user's
# script, run as `python model.py` runs it.
EXPORT_WITH_ANOTHER_JAX = """
    import json, sys
    from jax._src.export import _export
    stable = _export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE
    del _export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE
    import jax_mosaic_ffi as jmf
    _export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE = stable
    from jax_mosaic_ffi.call import export_stability
    print(json.dumps({"problem": export_stability.PROBLEM}), flush=True)
    exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), {"__name__": "__main__"})
"""

MODEL = '''import jax, jax.numpy as jnp
import jax_mosaic_ffi as jmf
kernel = jmf.cuda_kernel('extern "C" __global__ void k(const float* x, float* out) { out[0] = x[0]; }', "k")
copy = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((4,), jnp.float32), grid=1, block=1)
spec = jax.ShapeDtypeStruct((4,), jnp.float32)
exported = jax.export.export(jax.jit(copy), platforms=["cuda"])(spec)
'''


def test_where_jax_cannot_be_told_the_first_thing_said_is_the_fix_at_the_users_line(tmp_path):
  model = tmp_path / "model.py"
  model.write_text(MODEL)
  env = {"JAX_PLATFORMS": "cpu", "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "kernels")}
  r = fresh_process.run(EXPORT_WITH_ANOTHER_JAX, model, cwd=tmp_path, env=env, check=False)
  assert json.loads(r.stdout.splitlines()[0])["problem"] == \
      "jax._src.export._export has no _CUSTOM_CALL_TARGETS_GUARANTEED_STABLE", r.stdout
  assert r.returncode != 0 and "Cannot serialize code with custom calls" in r.stderr, r.stderr[-2000:]
  # Before jax's refusal (which prints the whole call, kernel binary and all): one line, at the export's line.
  before = r.stderr[:r.stderr.index("Traceback")]
  said = [line for line in before.splitlines() if "UserWarning" in line]
  assert len(said) == 1 and len(said[0]) < 500, before
  assert said[0].startswith(f"{model}:6: UserWarning: mosaic_kernel 'k' at model.py:6 (<module>): jax.export "), said
  assert "disabled_checks=jmf.export_disabled_checks()" in said[0], said
  # The fix it names works there.
  model.write_text(MODEL.replace('["cuda"])', '["cuda"], disabled_checks=jmf.export_disabled_checks())'))
  fixed = fresh_process.run(EXPORT_WITH_ANOTHER_JAX, model, cwd=tmp_path, env=env)
  assert "Cannot serialize" not in fixed.stderr, fixed.stderr[-2000:]


def test_the_contract_v1_artifact_still_deserializes():
  exported = jax.export.deserialize(ARTIFACT_V1.read_bytes())
  (cc,) = custom_calls_of(exported)
  assert cc["target"] == "jax_mosaic_ffi_launch_v1"
  config = cc["config"]
  assert config["kernel_hash"] == hashlib.sha256(config["module"]).digest()
  assert config["use_custom_barrier"] is False and config["uses_xla_collective_metadata"] is False
  assert config["grid"] == [16, 1, 1] and config["block"] == [256, 1, 1]
  assert config["param_order"] == [0, 1, 2, -1, -2]


def test_the_contract_v2_artifact_still_deserializes_and_its_launch_follows_the_size():
  exported = jax.export.deserialize(ARTIFACT_V2.read_bytes())
  assert [str(a) for a in exported.in_avals] == ["float32[n]", "float32[n]"]
  (cc,) = [c for c in custom_calls_of(exported) if c["target"] != "shape_assertion"]
  assert cc["target"] == "jax_mosaic_ffi_launch_v2"
  config = dict(cc["config"], launch_programs=[int(v) for v in cc["config"]["launch_programs"]])
  assert config["kernel_hash"] == hashlib.sha256(config["module"]).digest()
  assert config["param_order"] == [0, 1, 2, -1, -2] and config["scalar_sizes"] == [4, 4]
  three = int(np.float32(3.0).view(np.int32))  # the float scalar, as the runtime holds its bits
  for size, blocks in ((1, 1), (1000, 4), (256 * 37, 37)):
    assert _core._testing.evaluate_launch(config, [[size]] * 3) == ([blocks, 1, 1], [three, size])


@pytest.mark.gpu
def test_the_contract_v2_artifact_runs_at_two_sizes(rng):
  exported = jax.export.deserialize(ARTIFACT_V2.read_bytes())
  jmf.register()
  for size in (1000, 256 * 37 + 5):
    a, b = (rng.standard_normal(size).astype(np.float32) for _ in range(2))
    out = exported.call(a, b)  # poisoned first (conftest): an element the launch misses is NaN
    # The GPU fuses a * 3 + b into one FMA: compare to the exactly rounded value.
    np.testing.assert_allclose(np.asarray(out), np.float32(3.0) * a + b, rtol=1e-6, atol=1e-6)


def test_the_collective_v1_artifact_still_deserializes():
  exported = jax.export.deserialize(ARTIFACT_COLLECTIVE_V1.read_bytes())
  (cc,) = custom_calls_of(exported)
  assert cc["target"] == "jax_mosaic_ffi_collective_v1" and exported.nr_devices == 1
  config = cc["config"]
  assert config["kernel_hash"] == hashlib.sha256(config["module"]).digest()
  assert config["uses_xla_collective_metadata"] is True and config["xla_replica_ids"] == b"0"
  assert config["symmetric_memory_parameters"] == b"0,0" and config["skip_device_barrier"] is False
  assert config["param_order"] == [0, 1, -1, -2]


@pytest.mark.gpu
def test_the_collective_v1_artifact_runs(rng):
  exported = jax.export.deserialize(ARTIFACT_COLLECTIVE_V1.read_bytes())
  jmf.register()
  for _ in range(2):  # fresh inputs: a result left from the first call cannot pass
    x = rng.standard_normal(4096).astype(np.float32)
    # 3 * (x summed over its one rank, read through the peer table) + 1000 * rank 0 + 1 peer.
    np.testing.assert_allclose(np.asarray(exported.call(x)), np.float32(3.0) * x + 1.0, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_a_deserialized_export_runs_with_identical_results(rng, isolated_disk_cache):
  call = make_call()
  x, y = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
  direct = np.asarray(jax.jit(call)(x, y))
  again = jax.export.deserialize(export(call).serialize())
  jmf.register()
  np.testing.assert_array_equal(np.asarray(again.call(x, y)), direct)
  np.testing.assert_array_equal(direct, 2.0 * x + y)


@pytest.mark.gpu
def test_the_contract_v1_artifact_runs(rng):
  exported = jax.export.deserialize(ARTIFACT_V1.read_bytes())
  jmf.register()
  a, b = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
  # The GPU fuses a * 3 + b into one FMA: compare to the exactly rounded value.
  np.testing.assert_allclose(np.asarray(exported.call(a, b)), np.float32(3.0) * a + b, rtol=1e-6, atol=1e-6)


FRESH_PROCESS = '''
    import json, sys
    import jax, numpy as np
    import jax_mosaic_ffi as jmf
    mode = sys.argv[1]
    if mode.startswith("deserialize"):
      # A process that never lowers a mosaic_kernel: only deserializes. "deserialize" registers by hand, as
      # earlier versions asked; "deserialize-only" leaves it to the first lowering of any program.
      exported = jax.export.deserialize(open(sys.argv[2], "rb").read())
      if mode == "deserialize":
        jmf.register()
      run = exported.call
    else:
      jax.config.update("jax_compilation_cache_dir", sys.argv[2])
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
      jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
      hits = []
      jax.monitoring.register_event_listener(
          lambda event, **kw: hits.append(event) if "cache_hits" in event else None)
      import test_export
      run = jax.jit(test_export.make_call())
    rng = np.random.default_rng(int(sys.argv[-1]))
    n = 4096 if mode.startswith("deserialize") else 8192
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    out = np.asarray(run(x, y))
    s = jmf.kernel_cache_stats()
    a = np.float32(3.0 if mode.startswith("deserialize") else 2.0)
    print(json.dumps({"ok": bool(np.allclose(out, a * x + y, rtol=1e-6, atol=1e-6)),
                      "nvrtc": s.compiles["nvrtc"], "parses": s.module_parses,
                      "registration": jmf.registration.status(),
                      "cache_hits": len(hits) if not mode.startswith("deserialize") else None}))
'''


def run_fresh(tmp_path, *args, env=None):
  return fresh_process.run(FRESH_PROCESS, *args, 11, cwd=tmp_path, env=env).result


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["deserialize", "deserialize-only"],
                         ids=["register_by_hand", "registered_at_first_lowering"])
def test_a_process_that_only_deserializes_runs_the_artifact(tmp_path, mode):
  info = run_fresh(tmp_path, mode, ARTIFACT_V1)
  assert info["ok"] and info["nvrtc"] == 0 and info["parses"] == 1, info
  assert info["registration"]["done"] and info["registration"]["record"], info


def test_the_first_lowering_of_any_program_registers_the_kernel_targets(tmp_path):
  # On the CPU there is nothing to register: the status says that a lowering asked, and why nothing happened.
  script = """
      import json
      import jax
      from jax._src import dispatch
      import jax_mosaic_ffi as jmf
      before = jmf.registration.status()["message"]
      jax.jit(lambda v: v + 1)(1.0)  # no mosaic_kernel in it: what a deserialized artifact's call does
      print(json.dumps({"before": before, "after": jmf.registration.status()["message"],
                        "event": dispatch.JAXPR_TO_MLIR_MODULE_EVENT == jmf.registration.LOWERED_EVENT}))
  """
  r = fresh_process.run(script, cwd=tmp_path, env={"JAX_PLATFORMS": "cpu"}).result
  assert r == {"before": "not registered yet", "after": "not registered: JAX has no CUDA device here",
               "event": True}, r


def test_a_failed_registration_is_not_retried_and_each_kernel_lowering_raises_its_error_again(tmp_path):
  # This machine's registration cannot fail (and without a GPU it stops at "no CUDA device"), so its step that asks
  # jax for the CUDA devices fails here as a broken CUDA plugin would make it fail, counting its calls.
  script = """
      import json
      import jax, numpy as np
      import jax_mosaic_ffi as jmf
      from jax_mosaic_ffi.call import registration
      calls = []

      def broken():
        calls.append(1)
        raise OSError("the CUDA plugin cannot be read")

      registration._cuda_devices = broken
      x = jax.ShapeDtypeStruct((256,), np.float32)
      call = jmf.mosaic_kernel(jmf.cuda_kernel('extern "C" __global__ void k(float* out) {}', "k"), x, grid=1,
                               block=256)
      errors = []
      for attempt in range(3):
        try:
          if attempt == 1:
            jmf.register()
          else:
            jax.jit(call).trace().lower(lowering_platforms=("cuda",))
          errors.append(None)
        except RuntimeError as e:
          errors.append(str(e))
      other = float(jax.jit(lambda v: v + 1)(1.0))  # any other program lowers, and retries nothing
      print(json.dumps({"errors": errors, "calls": len(calls), "other": other,
                        "status": jmf.registration.status()["message"]}))
  """
  r = fresh_process.run(script, cwd=tmp_path, env={"JAX_PLATFORMS": "cpu",
                                                    "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "kernels")}).result
  first = ("jax_mosaic_ffi could not register its kernel targets with XLA's CUDA plugin: OSError: the CUDA "
           "plugin cannot be read. No mosaic_kernel can run in this process, and registering is not tried again "
           "in it: fix the cause, then start a new process")
  assert r == {"errors": [first] * 3, "calls": 1, "other": 2.0, "status": f"not registered: {first}"}, r


@pytest.mark.gpu
def test_persistent_compilation_cache_second_process_calls_no_nvrtc(tmp_path):
  cache = tmp_path / "xla-cache"
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "kernels"), "JAX_MOSAIC_FFI_POISON_OUTPUTS": "0"}
  first = run_fresh(tmp_path, "persistent", cache, env=env)
  second = run_fresh(tmp_path, "persistent", cache, env=env)
  assert first["ok"] and second["ok"]
  assert first["nvrtc"] == 1 and first["cache_hits"] == 0
  # The executable came from XLA's cache; instantiate ran again and found the
  # code in the module; the kernel came from our disk cache, not NVRTC.
  assert second["cache_hits"] >= 1
  assert second["nvrtc"] == 0
  assert second["parses"] == 1
