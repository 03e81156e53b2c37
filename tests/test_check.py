"""jmf.check: a function of kernels against its reference (outputs, jit and eager, vmap and a loop, VJP and JVP, over
shapes and dtypes), and jmf.testing's one-line assertion.

On the CPU the kernels cannot run, so the machinery is checked through functions whose difference is known: two
jax.numpy functions (one an ULP off, one wrong), a batching rule and a jit path that are deliberately wrong, a
hand-written gradient that is wrong, and kernels whose fallbacks run in their place against a reference that
differs. On the GPU (`gpu`), CUDA kernels with their fallbacks pass, and a deliberately wrong gradient kernel, an
off-by-one kernel and a kernel that drops a ragged tail are caught, each named; outputs are poisoned first
(conftest.py), so an element a kernel does not write cannot match.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p
from jax_mosaic_ffi.transforms import check_cases
from jax_mosaic_ffi.transforms.reference import reference

import kernel_sources

gpu = pytest.mark.gpu
F32 = jnp.float32


def rows(report, what):
  return [r for r in report.rows if r.what == what]


def kernels_match(report):
  """Nothing differed: on a GPU the check passed; elsewhere no kernel ran, so it says "not checked"."""
  assert not report.failures, report
  assert report.status == ("passed" if jax.devices()[0].platform == "gpu" else "not checked"), report
  return True


# ------------------------------------------------------------------ two jax.numpy functions

def test_a_function_one_ulp_off_passes_and_shows_its_ulp():
  twice = lambda x: 2 * x
  one_ulp_up = lambda x: jnp.nextafter(2 * x, jnp.inf)
  report = jmf.check(twice, jnp.ones(1000), reference=one_ulp_up, shapes=None)
  assert report.passed, report
  (outputs,) = rows(report, "outputs")
  assert outputs.worst.ulps == 1 and outputs.mismatches == 0 and outputs.size == 1000


def test_a_wrong_function_fails_naming_the_element_and_raises_when_asked():
  def wrong(x):
    return (2 * x).at[123].add(1.0)
  report = jmf.check(wrong, jnp.ones(1000), reference=lambda x: 2 * x, shapes=None)
  assert not report.passed
  (failure,) = report.failures
  assert failure.what == "outputs" and failure.mismatches == 1 and failure.worst.index == (123,)
  assert failure.worst.abs_error == pytest.approx(1.0) and failure.worst.ulps > 1000
  with pytest.raises(jmf.ReferenceMismatch) as raised:
    jmf.check(wrong, jnp.ones(1000), reference=lambda x: 2 * x, shapes=None, raise_on_mismatch=True)
  assert isinstance(raised.value, AssertionError) and not raised.value.report.passed
  assert "worst at [123]" in str(raised.value) and "| FAIL 1/1000 |" in str(raised.value)


def test_the_report_is_a_table_with_one_row_per_comparison():
  report = jmf.check(lambda x: x[::-1], jnp.ones((4, 3)), reference=lambda x: x[::-1] + 1, shapes=None)
  lines = str(report).splitlines()
  table = lines[:lines.index("")]
  assert [c.strip() for c in table[0].split("|")] == ["check", "inputs", "output", "result", "details"]
  assert len({line.count("|") for line in table if "|" in line}) == 1   # every row as wide
  assert len([line for line in table[2:] if line.split("|")[3].strip()]) == len(report.rows)   # a result each
  summary = lines[lines.index("") + 1:]
  assert " ".join(summary) == report.summary() and summary[0].startswith("1 of ")   # wrapped to the table's width
  assert max(len(line) for line in lines) <= 100


def test_pytrees_of_outputs_are_named_by_their_paths():
  fn = lambda x, y: {"sum": x + y, "prod": (x * y,)}
  report = jmf.check(fn, jnp.ones(8), jnp.ones(8), reference=lambda x, y: {"sum": x + y, "prod": (x * y + 1,)},
                     shapes=None, vmap=False, eager=False, grads=False)
  assert [r.output for r in report.rows] == ["out['prod'][0]", "out['sum']"]
  assert [r.failed for r in report.rows] == [True, False]


def test_the_same_seed_draws_the_same_inputs():
  got = [jmf.check(lambda x: x, jnp.ones(64), reference=lambda x: 0 * x, shapes=None, seed=7, vmap=False,
                   eager=False, grads=False).failures[0].worst for _ in range(2)]
  assert got[0] == got[1]


# ------------------------------------------------------------------ cases: shapes and dtypes

def test_edges_change_each_size_everywhere_it_occurs():
  a, b = jax.ShapeDtypeStruct((256, 128), F32), jax.ShapeDtypeStruct((128, 64), F32)
  found = [tuple(x.shape for x in c.avals) for c in check_cases.cases((a, b), "edges", None)]
  assert found[0] == ((256, 128), (128, 64))
  assert ((255, 128), (128, 64)) in found and ((256, 127), (127, 64)) in found and ((256, 128), (128, 63)) in found
  assert ((1, 128), (128, 64)) in found and ((256, 1), (1, 64)) in found
  assert len(found) == 7 and [c.derived for c in check_cases.cases((a, b), "edges", None)] == [False] + [True] * 6
  assert [tuple(x.shape for x in c.avals) for c in check_cases.cases((a, b), None, None)] == [found[0]]
  assert check_cases.cases((jax.ShapeDtypeStruct((3,), F32),), "edges", None)[1].avals[0].shape == (1,)


def test_named_shapes_and_dtypes():
  x, i = jax.ShapeDtypeStruct((8,), F32), jax.ShapeDtypeStruct((8,), jnp.int32)
  found = check_cases.cases((x, i), [((4,), (4,)), ((1,), (1,))], [jnp.float32, jnp.bfloat16])
  assert [[str(a.dtype) for a in c.avals] for c in found] == [["float32", "int32"], ["bfloat16", "int32"]] * 2
  with pytest.raises(ValueError, match="shapes names 1 arrays per case, but the function takes 2"):
    check_cases.cases((x, i), [((4,),)], None)


def test_a_function_wrong_on_ragged_sizes_passes_its_example_and_fails_on_the_edge():
  def wrong_tail(x):  # right for whole blocks of 8, drops a ragged tail
    whole = x.shape[0] // 8 * 8
    return jnp.concatenate([2 * x[:whole], jnp.zeros(x.shape[0] - whole, x.dtype)])
  report = jmf.check(wrong_tail, jnp.ones(1024), reference=lambda x: 2 * x, vmap=False, eager=False, grads=False)
  assert [r.case for r in report.rows] == ["float32[1024]", "float32[1023]", "float32[1]"]
  assert [r.failed for r in report.rows] == [False, True, True]
  assert report.failures[0].worst.index[0] >= 1016


def test_each_dtype_is_held_to_its_own_tolerance():
  # 1 + 2^-9: within bfloat16's tolerance, far outside float32's.
  report = jmf.check(lambda x: x * (1 + 2.0 ** -9), jnp.ones(64), reference=lambda x: x, shapes=None,
                     dtypes=[jnp.float32, jnp.bfloat16], vmap=False, eager=False, grads=False)
  assert [(r.dtype, r.failed) for r in report.rows] == [("float32", True), ("bfloat16", False)]
  loose = jmf.check(lambda x: x * (1 + 2.0 ** -9), jnp.ones(64), reference=lambda x: x, shapes=None, rtol=1e-2,
                    vmap=False, eager=False, grads=False)
  assert loose.passed


def test_inputs_makes_arguments_that_satisfy_the_kernel():
  def gather(table, index):
    return table[index]
  indices = lambda rng, table, index: (rng.standard_normal(table.shape).astype(np.float32),
                                       rng.integers(0, table.shape[0], index.shape).astype(np.int32))
  report = jmf.check(gather, jnp.ones(10), jnp.zeros(4, jnp.int32), reference=lambda t, i: jnp.take(t, i),
                     inputs=indices)
  assert report.passed, report
  assert {r.case for r in rows(report, "outputs")} == {"float32[10], int32[4]", "float32[9], int32[4]",
                                                      "float32[1], int32[4]", "float32[10], int32[3]",
                                                      "float32[10], int32[1]"}


# ------------------------------------------------------------------ vmap, jit, eager

def test_vmap_against_a_loop_catches_a_wrong_batching_rule():
  @jax.custom_batching.custom_vmap
  def scaled(x):
    return 2 * x

  @scaled.def_vmap
  def _rule(axis_size, in_batched, x):  # deliberately wrong: the first element of the batch doubled twice
    return (2 * x).at[0].multiply(2), in_batched[0]

  report = jmf.check(scaled, jnp.ones(16), reference=lambda x: 2 * x, shapes=None, grads=False)
  assert [r.what for r in report.failures] == ["vmap vs loop"]
  assert report.failures[0].worst.index[0] == 0


def test_jit_against_eager_catches_a_function_that_differs_under_jit():
  def traced_differently(x):
    return x + (1.0 if isinstance(x, jax.core.Tracer) else 0.0)
  report = jmf.check(traced_differently, jnp.ones(8), reference=lambda x: x + 1, shapes=None, vmap=False, grads=False)
  assert [r.what for r in report.failures] == ["jit vs eager"]


# ------------------------------------------------------------------ kernels, their fallbacks, derivatives

def scale_call(kernel, factor, **kwargs):
  return jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256), block=256,
                           scalars=lambda x: (np.float32(factor), np.int32(x.size)), **kwargs)


SCALE = r'''
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
'''


@pytest.fixture
def scale_kernel(isolated_disk_cache):
  return jmf.cuda_kernel(SCALE, "scale")


def softmax_reference(x):
  return jax.nn.softmax(x, axis=-1)


def softmax_derivative(y, d):
  return y * (d - jnp.sum(y * d, axis=-1, keepdims=True))


def softmax_calls(kernel_source=kernel_sources.SOFTMAX, bwd_name="softmax_bwd", bwd_fallback=softmax_derivative):
  fwd = jmf.mosaic_kernel(jmf.cuda_kernel(kernel_source, "softmax_fwd"), out_shape=lambda x: x,
                          grid=lambda x: x.size // x.shape[-1], block=256, scalars=lambda x: (np.int32(x.shape[-1]),),
                          fallback=softmax_reference)
  bwd = jmf.mosaic_kernel(jmf.cuda_kernel(kernel_source, bwd_name), out_shape=lambda y, d: y,
                          grid=lambda y, d: y.size // y.shape[-1], block=256,
                          scalars=lambda y, d: (np.int32(y.shape[-1]),), fallback=bwd_fallback)
  return fwd, bwd


def test_the_reference_replaces_every_kernel_by_its_fallback_inside_jit_cond_scan_and_checkpoint(scale_kernel):
  triple = scale_call(scale_kernel, 3.0, fallback=lambda x: 3 * x)

  def fn(x):
    y = jax.jit(triple)(x)
    y = jax.lax.cond(y[0] > 0, triple, lambda v: -v, y)
    y, _ = jax.lax.scan(lambda c, _: (jax.checkpoint(triple)(c), None), y, None, length=2)
    return y

  x = jnp.arange(1.0, 9.0)
  traced = jax.make_jaxpr(reference(fn))(x)
  assert not any(e.primitive is mosaic_kernel_p for e in equations_of(traced))
  np.testing.assert_allclose(np.asarray(jax.jit(reference(fn))(x)), 81 * np.arange(1.0, 9.0), rtol=1e-6)
  assert any(e.primitive is mosaic_kernel_p for e in equations_of(jax.make_jaxpr(fn)(x)))


def equations_of(jaxpr):
  from jax_mosaic_ffi.transforms.check import equations
  return list(equations(jaxpr))


def test_kernels_with_fallbacks_check_against_themselves_on_the_cpu_saying_so(scale_kernel):
  triple = scale_call(scale_kernel, 3.0, fallback=lambda x: 3 * x)
  report = jmf.check(triple, jnp.ones(1000))
  assert kernels_match(report)
  unchecked = rows(report, "kernel vs fallback")
  assert len(unchecked) == 3 and all("ran on cpu, where each kernel's fallback runs in its place" in r.skipped
                                     for r in unchecked)
  assert [r.skipped for r in rows(report, "VJP, JVP")][0].startswith("TypeError: mosaic_kernel 'scale' at ")


def test_a_kernel_compared_with_a_different_reference_fails_under_jit_vmap_and_eagerly(scale_kernel):
  triple = scale_call(scale_kernel, 3.0, fallback=lambda x: 3 * x)
  report = jmf.check(lambda x: triple(x) + 1, jnp.ones(100), reference=lambda x: 3 * x, shapes=None)
  assert [r.what for r in report.failures] == ["outputs"]
  assert report.failures[0].worst.abs_error == pytest.approx(1.0)


def test_a_kernel_without_a_fallback_is_named_when_there_is_nothing_to_check_against(scale_kernel):
  bare = scale_call(scale_kernel, 3.0)
  with pytest.raises(jmf.LaunchError, match=r"mosaic_kernel 'scale' at test_check.py:\d+ .* has no fallback.*"
                                            r"reference=fn"):
    jmf.check(bare, jnp.ones(100), shapes=None)


def test_a_derived_shape_the_function_refuses_is_skipped_saying_why(scale_kernel):
  fixed = jmf.mosaic_kernel(scale_kernel, jax.ShapeDtypeStruct((512,), F32), grid=2, block=256,
                            scalars=(np.float32(2.0), np.int32(512)), fallback=lambda x: 2 * x)
  report = jmf.check(fixed, jnp.ones(512), grads=False)
  assert kernels_match(report)
  skipped = [r for r in report.rows if r.skipped and r.what == "outputs"]
  assert [r.case for r in skipped] == ["float32[511]", "float32[1]"]
  assert all("the function refuses these inputs: LaunchError" in r.skipped for r in skipped)
  with pytest.raises(jmf.LaunchError):  # the examples' own shapes must work
    jmf.check(fixed, jnp.ones(100))


def test_a_wrong_hand_written_gradient_is_caught_and_its_rule_named(scale_kernel):
  triple = scale_call(scale_kernel, 3.0, fallback=lambda x: 3 * x)
  double = scale_call(scale_kernel, 2.0, fallback=lambda x: 2 * x)
  right = jmf.differentiable(double, bwd=lambda g: 2 * g, linear=True)
  wrong = jmf.differentiable(triple, bwd=lambda g: 2 * g, linear=True)   # d(3x) is 3, not 2
  report = jmf.check(lambda x: right(wrong(x)), jnp.ones(256), shapes=None)
  assert [(r.what, r.output) for r in report.failures] == [("VJP", "d in0"), ("derivative rule (VJP)", "d in0")]
  assert report.failures[0].worst.rel_error == pytest.approx(1 / 3, rel=1e-5)
  rules = rows(report, "derivative rule (VJP)")
  assert len(rules) == 2 and [r.failed for r in rules] == [True, False]
  assert rules[0].kernel.startswith("jmf.differentiable(") and "mosaic_kernel 'scale' at test_check.py:" in \
      rules[0].kernel
  assert "JVP" in {r.what for r in report.rows} and not rows(report, "JVP")[0].failed   # linear: the JVP is fwd


def test_a_wrong_jvp_is_caught_and_a_reverse_only_rule_skips_its_jvp(scale_kernel):
  triple = scale_call(scale_kernel, 3.0, fallback=lambda x: 3 * x)
  wrong_jvp = jmf.differentiable(triple, bwd=lambda g: 3 * g, jvp=lambda t: -3 * t)
  report = jmf.check(wrong_jvp, jnp.ones(64), shapes=None)
  assert [r.what for r in report.failures] == ["JVP", "derivative rule (JVP)"]
  reverse_only = jmf.differentiable(triple, bwd=lambda g: 3 * g)
  report = jmf.check(reverse_only, jnp.ones(64), shapes=None)
  assert kernels_match(report) and "no forward-mode derivative" in rows(report, "JVP")[0].skipped


def test_the_softmax_kernels_and_their_gradient_pass_with_integer_arguments_alongside(isolated_disk_cache):
  fwd, bwd = softmax_calls()
  softmax = jmf.differentiable(fwd, bwd=bwd, jvp=bwd, residuals=("out0",))

  def weighted(x, index):  # an integer input (no tangent) and an integer output (compared exactly)
    return softmax(x) * 2.0, jnp.argmax(x, axis=-1) + index

  report = jmf.check(weighted, jnp.ones((4, 300)), jnp.zeros(4, jnp.int32))
  assert kernels_match(report)
  assert {r.output for r in rows(report, "VJP")} == {"d in0"}
  assert {r.output for r in rows(report, "JVP")} == {"d out[0]"}
  assert {r.dtype for r in rows(report, "outputs")} == {"float32", "int32"}


def test_a_gradient_rule_whose_backward_fallback_is_also_wrong_is_still_caught(isolated_disk_cache):
  wrong = lambda y, d: y * d   # forgets the sum: the backward kernel's fallback shares the mistake
  fwd, bwd = softmax_calls(bwd_fallback=wrong)
  softmax = jmf.differentiable(fwd, bwd=bwd, jvp=bwd, residuals=("out0",))
  report = jmf.check(softmax, jnp.ones((4, 300)), shapes=None)
  assert {r.what for r in report.failures} == {"VJP", "JVP", "derivative rule (VJP)", "derivative rule (JVP)"}
  assert all("mosaic_kernel 'softmax_fwd'" in r.kernel for r in report.failures if r.kernel)


# ------------------------------------------------------------------ jmf.testing

def test_the_assertion_returns_the_report_or_fails_with_it():
  report = jmf.testing.assert_matches_reference(lambda x: x * 2, jnp.ones(16), reference=lambda x: x + x)
  assert report.passed
  with pytest.raises(AssertionError, match=r"3 of 5 comparisons differ"):
    jmf.testing.assert_matches_reference(lambda x: x * 2, jnp.ones(16), reference=lambda x: x + 1, shapes=None)


def test_the_assertion_skips_a_kernel_check_without_a_gpu(scale_kernel):
  if jax.devices()[0].platform == "gpu":
    pytest.skip("a GPU is here: the check runs (test_the_assertion_checks_kernels_on_the_gpu)")
  triple = scale_call(scale_kernel, 3.0, fallback=lambda x: 3 * x)
  with pytest.raises(pytest.skip.Exception, match="the kernels' fallbacks would run in their place"):
    jmf.testing.assert_matches_reference(triple, jnp.ones(16))
  assert jmf.testing.assert_matches_reference(triple, jnp.ones(16), skip_without_gpu=False).status == "not checked"


# ------------------------------------------------------------------ GPU: the kernels themselves

OFF_BY_ONE = r'''
extern "C" __global__ void scale_off_by_one(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n - 1) y[i] = a * x[i];   // the last element is never written
}
'''

WHOLE_BLOCKS_ONLY = r'''
extern "C" __global__ void scale_whole_blocks(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i] = a * x[i];   // no bounds check: right only when the grid covers n exactly
}
'''

WRONG_SOFTMAX_BWD = kernel_sources.SOFTMAX + r'''
extern "C" __global__ void softmax_bwd_wrong(const float* y, const float* dy, float* dx, int cols) {
  const long long row = (long long)blockIdx.x * cols;
  for (int j = threadIdx.x; j < cols; j += THREADS) dx[row + j] = y[row + j] * dy[row + j];  // forgets the sum
}
'''


@gpu
def test_the_assertion_checks_kernels_on_the_gpu(scale_kernel):
  triple = scale_call(scale_kernel, 3.0, fallback=lambda x: 3 * x)
  report = jmf.testing.assert_matches_reference(triple, jnp.ones(1000))
  kernel_rows = rows(report, "kernel vs fallback (outputs)")
  assert len(kernel_rows) == 3 and all(r.kernel.startswith("mosaic_kernel 'scale' at test_check.py:") and not r.failed
                                       for r in kernel_rows)


@gpu
def test_an_off_by_one_kernel_is_caught_at_its_last_element(isolated_disk_cache):
  kernel = jmf.cuda_kernel(OFF_BY_ONE, "scale_off_by_one")
  call = scale_call(kernel, 3.0, fallback=lambda x: 3 * x)
  report = jmf.check(call, jnp.ones(1000))
  assert not report.passed
  for failure in report.failures:
    # One element per row (per batch element under vmap), the last: poisoned, never written.
    assert failure.worst.index[-1] == int(failure.shape[-1]) - 1, failure.describe()
    assert failure.mismatches == int(np.prod(failure.shape[:-1])), failure.describe()
  own = [r for r in report.failures if r.what.startswith("kernel vs fallback")]
  assert own and all(r.kernel.startswith("mosaic_kernel 'scale_off_by_one' at test_check.py:") for r in own)
  blamed = [r for r in report.failures if r.what == "outputs"]   # the function's output names the kernel too
  assert blamed and all(r.kernel.startswith("mosaic_kernel 'scale_off_by_one' at ") for r in blamed)
  with pytest.raises(jmf.ReferenceMismatch):
    jmf.testing.assert_matches_reference(call, jnp.ones(1000))


@gpu
def test_a_kernel_right_only_for_whole_blocks_passes_its_example_and_fails_on_the_ragged_edge(isolated_disk_cache):
  kernel = jmf.cuda_kernel(WHOLE_BLOCKS_ONLY, "scale_whole_blocks")
  # grid = n // 256: the ragged tail is never launched, so never written (and never read out of bounds)
  call = jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: max(x.size // 256, 1), block=256,
                           scalars=lambda x: (np.float32(3.0), np.int32(x.size)), fallback=lambda x: 3 * x)
  report = jmf.check(call, jnp.ones(1024), shapes=[((1024,),), ((1023,),)], vmap=False, grads=False)
  failed_cases = {r.case for r in report.failures}
  assert failed_cases == {"float32[1023]"}, report
  assert any(r.what == "kernel vs fallback (outputs)" and r.kernel.startswith("mosaic_kernel 'scale_whole_blocks'")
             for r in report.failures)


@gpu
def test_a_wrong_gradient_kernel_is_caught_and_named(isolated_disk_cache):
  fwd, bwd = softmax_calls(WRONG_SOFTMAX_BWD, "softmax_bwd_wrong")   # its fallback is right: the kernel is not
  softmax = jmf.differentiable(fwd, bwd=bwd, jvp=bwd, residuals=("out0",))
  report = jmf.check(softmax, jnp.ones((8, 300)), shapes=None)
  assert {r.what for r in report.failures} >= {"VJP", "JVP", "kernel vs fallback (VJP)", "kernel vs fallback (JVP)"}
  named = {r.kernel.split(" at ")[0] for r in report.failures if r.what.startswith("kernel vs fallback")}
  assert named == {"mosaic_kernel 'softmax_bwd_wrong'"}, report
  assert not any(r.failed for r in rows(report, "outputs") + rows(report, "kernel vs fallback (outputs)"))


@gpu
def test_the_softmax_kernels_and_their_gradient_pass_on_the_gpu(isolated_disk_cache):
  fwd, bwd = softmax_calls()
  softmax = jmf.differentiable(fwd, bwd=bwd, jvp=bwd, residuals=("out0",))
  report = jmf.check(softmax, jnp.ones((8, 1000)))
  assert report.passed, report
  kernels = {r.kernel.split(" at ")[0] for r in report.rows if r.what.startswith("kernel vs fallback") and r.kernel}
  assert kernels == {"mosaic_kernel 'softmax_fwd'", "mosaic_kernel 'softmax_bwd'"}
  assert {r.what for r in report.rows} >= {"kernel vs fallback (vmap)", "kernel vs fallback (VJP)", "vmap vs loop"}
