"""The shadow mode (jmf.verify, JAX_MOSAIC_FFI_VERIFY): each kernel call compared with its fallback inside the
program, on its first execution or every one; off, the lowered program is the plain one.

On the CPU a kernel cannot run, so a stand-in primitive takes the custom call's place: its CPU lowering computes
the kernel's fallback, wrong at one element, and then asks the shadow mode for the check exactly as the CUDA
lowering does after its custom call (the same `shadow.lower`, the same real kernel and launch spec). On the GPU
(`gpu`) the real lowering runs: the CUDA program is unchanged when off, and a wrong kernel warns, raises, or is
reported, once or every time.
"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import mlir
from jax.extend.core import Primitive
from jax.sharding import Mesh, PartitionSpec as P

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call.comparison import shadow

import fresh_process

gpu = pytest.mark.gpu

TWICE = r'''
extern "C" __global__ void twice(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
'''

TWICE_BUT_ONE = r'''
extern "C" __global__ void twice_but_one(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = i == 3 ? 2.0f * x[i] + 1.0f : 2.0f * x[i];   // wrong at element 3
}
'''


@pytest.fixture(autouse=True)
def _quiet_and_off(monkeypatch):
  monkeypatch.delenv(flags.VERIFY, raising=False)
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*no NVIDIA GPU driver here.*")
    yield


def call(source, name, fallback=lambda x: 2 * x):
  return jmf.mosaic_kernel(jmf.cuda_kernel(source, name), lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256),
                           block=256, scalars=lambda x: (np.int32(x.size),), fallback=fallback)


# ------------------------------------------------------------------ the stand-in (CPU)

_stand_in = Primitive("kernel_stand_in")
_stand_in.multiple_results = True
_SCRATCH = jax.core.ShapedArray((4,), jnp.uint8)
_stand_in.def_abstract_eval(lambda x, scratch=False, **_: [jax.core.ShapedArray(x.shape, x.dtype)] +
                            [_SCRATCH] * scratch)


def _stand_in_lowering(ctx, x, kernel, spec, wrong, scratch=False):
  """What the CUDA lowering emits, on the CPU: the 'kernel' (the fallback, one element off when ``wrong``; with
  ``scratch``, a scratch buffer a front end adds, not zeros), then the shadow mode's check of it, as lowering.py
  asks for it after the custom call."""
  compute = lambda x: [(2 * x).at[3].add(1.0 if wrong else 0.0)] + [jnp.ones(4, jnp.uint8)] * scratch  # noqa: E731
  results = mlir.lower_fun(compute, multiple_results=True)(ctx, x)
  verification = shadow.active()
  if verification is not None:
    shadow.lower(ctx, [x], results, kernel, spec, verification)
  return results


mlir.register_lowering(_stand_in, _stand_in_lowering, platform="cpu")


@pytest.fixture
def kernel_and_spec(isolated_disk_cache):
  (eqn,) = jax.make_jaxpr(call(TWICE, "twice"))(jnp.ones(16)).eqns
  return eqn.params["kernel"], eqn.params["spec"]


def stand_in(kernel_and_spec, wrong=True):
  kernel, spec = kernel_and_spec
  return lambda x: _stand_in.bind(x, kernel=kernel, spec=spec, wrong=wrong)[0]


def run(fn, times=3, x=None):
  x = jnp.arange(16.0) if x is None else x
  f = jax.jit(lambda x: fn(x) + 0)
  return [np.asarray(jax.block_until_ready(f(x))) for _ in range(times)]


def cpu_text(fn):
  return jax.jit(lambda x: fn(x)).trace(jnp.arange(16.0)).lower().as_text()  # a new function: lowered again


def test_first_mode_checks_a_specialization_once_and_warns_naming_the_kernel(kernel_and_spec):
  with jmf.verify("first") as seen, pytest.warns(jmf.ReferenceMismatchWarning) as caught:
    outs = run(stand_in(kernel_and_spec))
  np.testing.assert_array_equal(outs[-1][3], 2 * 3.0 + 1)   # the kernel's own result goes on, unchanged
  assert len(caught) == 1 and caught[0].filename == __file__   # the kernel call's line (kernel_and_spec), not ours
  report = caught[0].message.report
  (row,) = report.rows
  assert row.what == "kernel vs fallback" and row.kernel.startswith("mosaic_kernel 'twice' at test_verify.py:")
  assert (row.mismatches, row.worst.index, row.worst.got, row.worst.want) == (1, (3,), 7.0, 6.0)
  assert len(seen.report.rows) == 1   # three executions, one check


def test_first_mode_lowers_later_programs_plainly_and_gates_earlier_ones(kernel_and_spec):
  fn = stand_in(kernel_and_spec, wrong=False)
  plain = cpu_text(lambda x: fn(x) * 2)
  with jmf.verify("first") as seen:
    gated = cpu_text(lambda x: fn(x) * 2)
    assert gated.count("xla_ffi_python_cpu_callback") == 2 and "stablehlo.case" in gated  # gate, then report
    run(fn, times=2)
    assert seen.report.passed and len(seen.report.rows) == 1
    assert cpu_text(lambda x: fn(x) * 2) == plain   # checked already: nothing is added


def test_a_front_ends_scratch_outputs_are_not_compared(kernel_and_spec):
  kernel, spec = kernel_and_spec
  # As Triton's launch makes it: the user's outputs, then zeros for Triton's scratch buffers.
  with_scratch = fallback_lib.Fallback(lambda x: (2 * x, jnp.zeros(4, jnp.uint8)), compared=1)
  spec = dataclasses.replace(spec, fallback=with_scratch)
  fn = lambda x: _stand_in.bind(x, kernel=kernel, spec=spec, wrong=False, scratch=True)[0]  # noqa: E731
  with jmf.verify("always", on_mismatch="ignore") as seen:
    run(fn, times=1)
  assert [r.output for r in seen.report.rows] == ["out0"] and seen.report.passed


def test_always_mode_checks_every_execution(kernel_and_spec):
  with jmf.verify("always", on_mismatch="ignore") as seen, warnings.catch_warnings():
    warnings.simplefilter("error")
    run(stand_in(kernel_and_spec), times=3)
    text = cpu_text(stand_in(kernel_and_spec))
  assert len(seen.report.rows) == 3 and not seen.report.passed
  assert text.count("xla_ffi_python_cpu_callback") == 1 and "stablehlo.case" not in text


def test_raise_mode_fails_the_execution_with_the_report(kernel_and_spec):
  with jmf.verify("always", on_mismatch="raise"), pytest.raises(Exception) as raised:
    run(stand_in(kernel_and_spec), times=1)
  assert "ReferenceMismatch" in str(raised.value) and "worst at [3]: got 7, want 6" in str(raised.value)


def test_the_environment_turns_it_on_for_the_process_and_verify_off_turns_it_off(kernel_and_spec, monkeypatch):
  fn = stand_in(kernel_and_spec, wrong=False)
  plain = cpu_text(fn)
  monkeypatch.setenv(flags.VERIFY, "always:ignore")
  assert shadow.active() is shadow.environment() and shadow.active().mode == "always"
  assert "xla_ffi_python_cpu_callback" in cpu_text(fn)
  with jmf.verify("off"):
    assert cpu_text(fn) == plain
  with shadow.suspended():   # the autotuner's timed programs
    assert cpu_text(fn) == plain
  monkeypatch.setenv(flags.VERIFY, "sometimes")
  with pytest.raises(ValueError, match="JAX_MOSAIC_FFI_VERIFY='sometimes' is not a setting of the shadow mode: "
                                       "use first or always"):
    cpu_text(fn)
  monkeypatch.setenv(flags.VERIFY, "off")
  assert cpu_text(fn) == plain


def test_a_kernel_that_accumulates_states_its_tolerance(kernel_and_spec):
  for tolerance, failed in (({}, True), ({"atol": 2.0}, False), ({"tolerances": {jnp.float32: (0, 1.5)}}, False)):
    with jmf.verify("always", on_mismatch="ignore", **tolerance) as seen:
      run(stand_in(kernel_and_spec), times=1)   # element 3 off by 1
    (row,) = seen.report.rows
    assert row.failed == failed and seen.report.status == ("failed" if failed else "passed")
  with pytest.raises(ValueError, match="jmf.verify: tolerances= names int32, but integer and bool outputs are "):
    jmf.verify("first", tolerances={jnp.int32: (0, 1)})


def test_a_setting_is_refused_by_name():
  with pytest.raises(ValueError, match="mode must be one of off, first, always"):
    jmf.verify("once")
  with pytest.raises(ValueError, match="on_mismatch must be one of warn, raise, ignore"):
    jmf.verify("first", on_mismatch="log")


def test_a_kernel_without_a_fallback_runs_unchecked_with_one_warning(isolated_disk_cache):
  bare = jmf.mosaic_kernel(jmf.cuda_kernel(TWICE, "twice"), lambda x: x, grid=1, block=256,
                           scalars=lambda x: (np.int32(x.size),))
  (eqn,) = jax.make_jaxpr(bare)(jnp.ones(16)).eqns
  fn = stand_in((eqn.params["kernel"], eqn.params["spec"]))
  with jmf.verify("always") as seen, pytest.warns(jmf.UncheckedKernelWarning,
                                                  match="has no fallback, so it runs unchecked") as caught:
    cpu_text(fn)
  assert seen.report.rows == () and seen.report.status == "not checked"
  assert "no kernel call was compared" in seen.report.summary()
  assert issubclass(jmf.UncheckedKernelWarning, UserWarning)
  assert [w.filename for w in caught] == [__file__]   # the line that called the kernel, not the package's


BAD_SETTING = """
import json
try:
  import jax_mosaic_ffi
  found = "imported"
except ValueError as e:
  found = str(e)
print(json.dumps(found))
"""


def test_a_bad_setting_in_the_environment_is_refused_when_the_package_is_imported():
  found = fresh_process.run(BAD_SETTING, env={flags.VERIFY: "first:log"}).result
  assert found == ("JAX_MOSAIC_FFI_VERIFY='first:log' is not a setting of the shadow mode: use first or always, "
                   "optionally with :warn, :raise, :ignore (first:raise; the default is warn), or off, 0 or unset "
                   "for none; docs/guides/checking.md has what each does")
  assert fresh_process.run(BAD_SETTING, env={flags.VERIFY: "Always:Raise"}).result == "imported"


def test_inside_shard_map_each_device_runs_its_block_and_one_check_reports(kernel_and_spec):
  mesh = Mesh(np.array(jax.devices("cpu")[:8]), ("x",))
  fn = jax.shard_map(stand_in(kernel_and_spec), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  x = jnp.arange(128.0)
  with jmf.verify("first", on_mismatch="ignore") as seen:
    for _ in range(2):
      jax.block_until_ready(jax.jit(fn)(x))
  assert len(seen.report.rows) == 1 and seen.report.rows[0].failed   # the first device's first execution


def test_jmf_check_compares_the_kernel_with_its_fallback_at_the_checks_own_tolerance(kernel_and_spec):
  within = lambda x: 2 * x + jnp.where(jnp.arange(x.size) == 3, 1.0, 0.0)  # noqa: E731  (the stand-in's answer)
  strict, loose = (jmf.check(stand_in(kernel_and_spec), jnp.ones(16), reference=within, shapes=None, vmap=False,
                             eager=False, grads=False, **tolerance) for tolerance in ({}, {"rtol": 0, "atol": 2.0}))
  for report, passed in ((strict, False), (loose, True)):
    (row,) = [r for r in report.rows if r.what.startswith("kernel vs fallback")]   # one element 1 off
    assert (not row.failed, report.passed) == (passed, passed)
    assert (row.rtol, row.atol) == ((1e-5, 1e-5) if not passed else (0.0, 2.0))


def test_autotuning_times_its_configs_without_checks(kernel_and_spec, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU", "1")   # timed on the CPU: the stand-in's checks would run
  fn = stand_in(kernel_and_spec, wrong=False)
  tuned = jmf.autotune(lambda meta: (lambda x: fn(x) * meta["k"]), configs=[{"k": 1.0}, {"k": 2.0}],
                       name="verify-suspended")
  monkeypatch.setenv(flags.VERIFY, "always:ignore")   # the timed programs are built in threads of their own
  seen = shadow.environment()
  before = len(seen.report.rows)
  tuning = jmf.kernel_cache_stats().autotune_tunings
  run(tuned, times=1)
  assert jmf.kernel_cache_stats().autotune_tunings == tuning + 1
  assert len(seen.report.rows) == before + 1   # the user's program only


def test_off_the_cuda_program_is_the_plain_one(isolated_disk_cache, monkeypatch):
  twice = call(TWICE, "twice")
  lower = lambda: jax.jit(lambda x: twice(x) + 1).trace(jnp.ones(1000)).lower(  # noqa: E731
      lowering_platforms=("cuda",)).as_text()
  plain = lower()
  monkeypatch.setenv(flags.VERIFY, "off")
  assert lower() == plain
  with jmf.verify("off"):
    assert lower() == plain
  if not any(d.platform == "gpu" for d in jax.devices()):
    # Lowered for a GPU this process does not have, a check could never report: nothing is added.
    monkeypatch.setenv(flags.VERIFY, "always")
    assert lower() == plain


# ------------------------------------------------------------------ GPU

@gpu
def test_on_the_gpu_the_program_gets_the_check_until_its_specialization_is_checked(isolated_disk_cache):
  twice = call(TWICE, "twice")
  step = lambda x: twice(x) + 1   # noqa: E731  (one call site for every program below)
  lower = lambda: jax.jit(lambda x: step(x)).trace(jnp.ones(1000)).lower().as_text()  # noqa: E731
  plain = lower()
  with jmf.verify("always"):
    checked = lower()
  assert checked != plain and checked.count("xla_ffi_python_gpu_callback") == 1
  with jmf.verify("first") as seen:
    gated = jax.jit(lambda x: step(x))
    assert "stablehlo.case" in gated.trace(jnp.ones(1000)).lower().as_text()
    for _ in range(3):
      y = jax.block_until_ready(gated(jnp.arange(1000.0)))
    np.testing.assert_array_equal(np.asarray(y), 2 * np.arange(1000.0) + 1)
    assert len(seen.report.rows) == 1 and seen.report.passed
    assert lower() == plain   # lowered after the check: the plain program


@gpu
def test_a_wrong_kernel_in_a_jitted_step_warns_once_naming_it(isolated_disk_cache):
  wrong = call(TWICE_BUT_ONE, "twice_but_one")
  step = jax.jit(lambda x: jnp.sum(wrong(x) * 2))
  with jmf.verify("first") as seen, pytest.warns(jmf.ReferenceMismatchWarning) as caught:
    for _ in range(5):
      jax.block_until_ready(step(jnp.arange(1000.0)))
  assert len(caught) == 1 and len(seen.report.rows) == 1
  (row,) = caught[0].message.report.failures
  assert row.kernel.startswith("mosaic_kernel 'twice_but_one' at test_verify.py:") and row.worst.index == (3,)


@gpu
def test_always_reports_every_execution_and_raise_fails_it(isolated_disk_cache):
  wrong = jax.jit(call(TWICE_BUT_ONE, "twice_but_one"))
  with jmf.verify("always", on_mismatch="ignore") as seen:
    for _ in range(3):
      jax.block_until_ready(wrong(jnp.arange(1000.0)))
  assert [r.failed for r in seen.report.rows] == [True] * 3
  again = jax.jit(lambda x: call(TWICE_BUT_ONE, "twice_but_one")(x) * 1)
  with jmf.verify("always", on_mismatch="raise"), pytest.raises(Exception, match="ReferenceMismatch"):
    jax.block_until_ready(again(jnp.arange(1000.0)))


@gpu
def test_vmap_and_the_backward_kernels_are_checked_too(isolated_disk_cache):
  twice = call(TWICE, "twice")
  twice_d = jmf.differentiable(twice, bwd=call(TWICE, "twice"), linear=True)
  with jmf.verify("always") as seen:
    jax.block_until_ready(jax.jit(jax.vmap(twice))(jnp.ones((3, 100))))
    jax.block_until_ready(jax.jit(jax.grad(lambda x: jnp.sum(twice_d(x) ** 2)))(jnp.ones(100)))
  assert seen.report.passed and [r.case for r in seen.report.rows] == ["float32[3, 100]", "float32[100]",
                                                                      "float32[100]"]



PARTITIONED = """
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_mosaic_ffi as jmf
import test_verify as tv
(eqn,) = jax.make_jaxpr(tv.call(tv.TWICE, "twice"))(jnp.ones(16)).eqns
fn = jmf.sharded(tv.stand_in((eqn.params["kernel"], eqn.params["spec"])), jmf.Elementwise())
x = jax.device_put(jnp.arange(128.0), NamedSharding(Mesh(np.array(jax.devices("cpu")[:8]), ("x",)), P("x")))
with jmf.verify("always", on_mismatch="ignore") as seen:
  y = np.asarray(jax.block_until_ready(jax.jit(fn)(x)))
print(json.dumps({"y": y[[3, 19]].tolist(), "rows": len(seen.report.rows)}))
"""


def test_a_kernel_partitioned_across_devices_runs_unchecked(isolated_disk_cache):
  # XLA's partitioner lowers the per-shard function in a module of its own, whose host callbacks it drops: a
  # check there would call a callback that is not there (a crash: hence a process of its own).
  found = fresh_process.run(PARTITIONED).result
  assert found == {"y": [7.0, 2 * 19.0 + 1], "rows": 0}   # each shard's element 3 is the stand-in's mistake


COLLECTIVE = """
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import dataclasses
import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.call import fallback as fallback_lib
import test_verify as tv
(eqn,) = jax.make_jaxpr(tv.call(tv.TWICE, "twice"))(jnp.ones(16)).eqns
# A collective kernel's fallback talks to its peers: here a psum that is 0 (each block minus the blocks' mean).
talks = fallback_lib.Fallback(lambda x: 2 * x + 0 * jax.lax.psum(x, "x"))
spec = dataclasses.replace(eqn.params["spec"], collective=jmf.Collective("x"), fallback=talks)
kernel = lambda x: tv._stand_in.bind(x, kernel=eqn.params["kernel"], spec=spec, wrong=False)[0]
fn = jax.jit(jax.shard_map(kernel, mesh=Mesh(np.array(jax.devices("cpu")[:8]), ("x",)), in_specs=P("x"),
                           out_specs=P("x")))
with jmf.verify("first", on_mismatch="ignore") as seen:
  for _ in range(2):
    jax.block_until_ready(fn(jnp.arange(128.0)))
print(json.dumps({"rows": len(seen.report.rows), "passed": seen.report.passed}))
"""


def test_a_collective_kernels_check_is_run_by_every_device(isolated_disk_cache):
  # Gated, one device alone would enter the fallback's psum and wait for its peers for ever.
  found = fresh_process.run(COLLECTIVE).result
  assert found == {"rows": 16, "passed": True}   # 8 devices, 2 executions: a program lowered before its check
