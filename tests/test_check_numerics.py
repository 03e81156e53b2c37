"""How jmf.check and the shadow mode compare an output with its reference (call/comparison/numerics.py), and the
report's status and table (call/comparison/check_report.py): each element held to its own tolerance, non-finite
values by position and component, integers and bools exactly, and a check that ran no kernel never reported as
passed.

Each comparison is made here with a function a defect of the comparison would let through: one huge element with
the rest of the output zeroed, NaN in the other component of a complex number, an infinity of the wrong sign, an
integer off by one, a flipped bool, and a kernel that never ran (its fallback stood in for it, on this machine
without a GPU).
"""

import math
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.call.comparison import check_report
from jax_mosaic_ffi.call.comparison import numerics

F32, C64 = jnp.float32, jnp.complex64
NAN, INF = math.nan, math.inf
OUTPUTS_ONLY = dict(shapes=None, vmap=False, eager=False, grads=False)


def summary(got, want, dtype=np.float32, tolerance=None):
  got, want = np.asarray(got, dtype), np.asarray(want, dtype)
  return numerics.device_summary(jnp.asarray(got), jnp.asarray(want), *(tolerance or numerics.tolerance(dtype)))


def mismatches(got, want, dtype=np.float32, tolerance=None) -> int:
  return int(summary(got, want, dtype, tolerance)[0])


def on_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


# ------------------------------------------------------------------ tolerances

def test_each_dtype_has_its_tolerance_and_integers_are_exact():
  assert numerics.tolerance(jnp.float32) == (1e-5, 1e-5)
  assert numerics.tolerance(jnp.bfloat16) == (1.6e-2, 1e-5)   # a small absolute floor (test_check_defaults.py)
  assert numerics.tolerance(jnp.float16) == (2e-3, 1e-5)
  assert numerics.tolerance(jnp.float8_e4m3fn) == (0.125, 2.0 ** -9)
  assert numerics.tolerance(jnp.float8_e5m2) == (0.25, 2.0 ** -16)
  assert numerics.tolerance(jnp.int32) == numerics.tolerance(jnp.bool_) == (0.0, 0.0)
  assert numerics.tolerance(jnp.bfloat16, {jnp.bfloat16: (0.1, 0.2)}) == (0.1, 0.2)
  assert numerics.tolerance(jnp.int32, {jnp.int32: (0.1, 1)}) == (0.0, 0.0)   # exact, whatever is asked


def test_the_comparison_counts_mismatches_and_finds_the_worst_element():
  want = np.arange(1, 101, dtype=np.float32)
  got = want.copy()
  got[17] += 1.0        # far outside the tolerance
  got[40] *= 1 + 3e-6   # inside it
  count, worst, g, w, excess, _ = summary(got, want)
  assert (int(count), int(worst), float(g), float(w)) == (1, 17, 19.0, 18.0) and excess > 1


def test_each_element_is_held_to_its_own_tolerance_not_the_arrays_largest():
  # |got - want| <= atol + rtol * |want|, want of that element: a large neighbour lends nothing.
  assert mismatches([1000.0, 1e-3 + 5e-3], [1000.0, 1e-3]) == 1
  assert mismatches([1000.0, 1e-3 + 5e-6], [1000.0, 1e-3]) == 0     # within atol + rtol * 1e-3
  assert mismatches([1000.0 + 5e-3], [1000.0]) == 0                  # rtol * 1000
  assert mismatches([0.0, 2e-5], [0.0, 0.0]) == 1
  assert mismatches([1.0, 1e-3 + 5e-3], [1.0, 1e-3], tolerance=(0.0, 1e-2)) == 0   # a stated atol
  assert mismatches([2.0], [1.0], tolerance=(0.0, 0.0)) == 1 and mismatches([1.0], [1.0], tolerance=(0.0, 0.0)) == 0


def test_one_huge_element_does_not_hide_the_rest_of_the_output_zeroed():
  def zeroed(x):   # right at the huge element, zero everywhere else
    return jnp.zeros_like(x).at[0].set(1e6)

  report = jmf.check(zeroed, jnp.ones(1000), reference=lambda x: (2 * x).at[0].set(1e6), **OUTPUTS_ONLY)
  (row,) = report.failures
  assert row.mismatches >= 990 and report.status == "failed", report


@pytest.mark.parametrize("got, want, bad", [
    (NAN, NAN, 0), (INF, INF, 0), (-INF, -INF, 0), (0.0, -0.0, 0),
    (NAN, 1.0, 1), (1.0, NAN, 1), (INF, -INF, 1), (-INF, INF, 1), (INF, 1e30, 1), (NAN, INF, 1)])
def test_nan_matches_nan_and_an_infinity_only_itself(got, want, bad):
  assert mismatches([1.0, got], [1.0, want]) == bad


@pytest.mark.parametrize("got, want, bad", [
    (complex(NAN, 1), complex(NAN, 1), 0), (complex(INF, NAN), complex(INF, NAN), 0),
    (complex(INF, 1), complex(INF, 1 + 1e-6), 0),            # the finite part within its tolerance
    (complex(NAN, 1), complex(1, NAN), 1),                   # NaN in the other component
    (complex(NAN, NAN), complex(1, NAN), 1),
    (complex(INF, NAN), complex(-INF, NAN), 1),              # an infinity's sign, NaN beside it
    (complex(1, INF), complex(1, -INF), 1),
    (complex(INF, 1), complex(INF, 2), 1)])                   # the same infinity, the finite part wrong
def test_complex_values_compare_each_components_nan_and_infinity_by_position(got, want, bad):
  assert mismatches([1 + 1j, got], [1 + 1j, want], np.complex64) == bad


def test_a_complex_output_with_nan_in_the_other_component_fails():
  def constant(value):
    return lambda x: x.astype(C64) * 0 + jnp.asarray(value, C64)   # NaN * 0 stays NaN, in its component

  report = jmf.check(constant(complex(NAN, 1)), jnp.ones(8), reference=constant(complex(1, NAN)), **OUTPUTS_ONLY)
  assert [r.mismatches for r in report.failures] == [8], report
  assert report.failures[0].worst.abs_error == INF


def test_an_infinity_of_the_wrong_sign_fails_also_beside_a_nan():
  def constant(value, dtype):
    return lambda x: x.astype(dtype) * 0 + jnp.asarray(value, dtype)

  for dtype, (got, want) in [(F32, (INF, -INF)), (C64, (complex(INF, NAN), complex(-INF, NAN)))]:
    report = jmf.check(constant(got, dtype), jnp.ones(8), reference=constant(want, dtype), **OUTPUTS_ONLY)
    assert [r.mismatches for r in report.failures] == [8], (dtype, report)


def test_integers_and_bools_compare_exactly():
  assert mismatches([1, 2, 3], [1, 2, 3], np.int32) == 0
  count, worst, g, w, _, _ = summary([1, 7, 3, 4], [1, 2, 3, 5], np.int32)
  assert (int(count), int(worst), int(g), int(w)) == (2, 1, 7, 2)  # the largest difference
  assert mismatches([2**30 + 1], [2**30], np.int32) == 1   # equal as float32s, not as integers
  assert mismatches([True, False], [True, True], np.bool_) == 1


def test_an_integer_output_off_by_one_and_a_flipped_bool_fail_whatever_tolerance_is_given():
  def counts(x):
    return jnp.argmax(x) + 1, x > 0

  def reference(x):
    return jnp.argmax(x), x >= 0     # off by one; a bool flipped where x is 0

  ints = lambda rng, x: (rng.integers(-2, 3, x.shape).astype(np.int32),)  # noqa: E731  (zeros among them)
  report = jmf.check(counts, jnp.zeros(64, jnp.int32), reference=reference, inputs=ints, rtol=1.0, atol=1.0,
                     **OUTPUTS_ONLY)
  assert [(r.output, r.dtype, r.rtol, r.atol) for r in report.failures] == [
      ("out[0]", "int32", 0.0, 0.0), ("out[1]", "bool", 0.0, 0.0)], report
  assert report.failures[0].worst.abs_error == 1.0
  with pytest.raises(ValueError, match="tolerances= names int32, but integer and bool outputs are compared exactly"):
    jmf.check(counts, jnp.zeros(64, jnp.int32), reference=reference, tolerances={jnp.int32: (0, 1)})


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                   ml_dtypes.float8_e5m2])
def test_ulps_count_representable_values_between(dtype):
  one = np.asarray(1.0, dtype)
  up = np.nextafter(np.float32(1.0), np.float32(2.0)) if dtype == np.float32 else None
  if up is None:  # the next value of a narrow type: one more in its bit pattern
    bits = np.dtype(f"uint{8 * np.dtype(dtype).itemsize}")
    up = (one.view(bits) + 1).view(dtype)
  assert numerics.ulps(one, np.asarray(up, dtype), dtype) == 1
  assert numerics.ulps(one, one, dtype) == 0
  assert numerics.ulps(np.asarray(0.0, dtype), np.asarray(-0.0, dtype), dtype) == 0
  smallest = (np.asarray(1, f"uint{8 * np.dtype(dtype).itemsize}")).view(dtype)
  assert numerics.ulps(smallest, -smallest, dtype) == 2  # across zero
  assert numerics.ulps(np.asarray(np.nan, dtype), one, dtype) is None


# ------------------------------------------------------------------ nothing ran: not checked

WRONG_TRIPLE = r'''
extern "C" __global__ void triple(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];   // wrong: its fallback (and its name) say 3x
}
'''


@pytest.fixture
def wrong_triple(isolated_disk_cache):
  return jmf.mosaic_kernel(jmf.cuda_kernel(WRONG_TRIPLE, "triple"), lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256),
                           block=256, scalars=lambda x: (np.int32(x.size),), fallback=lambda x: 3 * x)


def test_a_wrong_kernel_that_never_ran_is_not_checked_rather_than_passed(wrong_triple):
  report = jmf.check(wrong_triple, jnp.ones(1000))
  assert not report.passed, report
  if on_gpu():
    assert report.status == "failed" and report.failures
    return
  assert report.status == "not checked" and not report.failures
  assert report.not_checked.startswith("no kernel ran: the program ran on cpu, where each kernel's fallback runs")
  assert "mosaic_kernel 'triple' at test_check_numerics.py:" in report.not_checked
  assert report.summary().startswith("not checked: no kernel ran: ") and "comparisons of what ran instead match" \
      in report.summary()
  assert "not checked: no kernel ran" in str(report) and "all " not in str(report).splitlines()[-1]
  # A reference that differs still fails: the fallback (or the reference) is wrong, whatever ran.
  assert jmf.check(wrong_triple, jnp.ones(1000), reference=lambda x: 3 * x + 1, shapes=None).status == "failed"


def test_the_shadow_mode_says_no_kernel_ran_rather_than_that_nothing_differed(wrong_triple):
  with jmf.verify("always") as seen:
    jax.block_until_ready(jax.jit(wrong_triple)(jnp.ones(1000)))
  if on_gpu():
    assert seen.report.status == "failed"
    return
  assert (seen.report.status, seen.report.passed, seen.report.rows) == ("not checked", False, ())
  assert seen.report.summary().startswith("not checked: no kernel ran: the program ran on cpu")
  with jmf.verify("always") as idle:   # nothing lowered under it
    pass
  assert idle.report.status == "not checked" and "no kernel call was lowered" in idle.report.summary()


def test_the_reference_mode_on_the_gpu_is_not_checked_either(wrong_triple, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_REFERENCE", "1")   # the CUDA lowering takes the fallback too
  with jmf.verify("always") as seen:
    jax.jit(wrong_triple).trace(jnp.ones(1000)).lower(lowering_platforms=("cuda",))
  assert seen.report.status == "not checked"
  assert seen.report.not_checked.startswith("no kernel ran: JAX_MOSAIC_FFI_REFERENCE=1 runs each kernel's fallback")


def test_the_assertion_skips_when_no_kernel_ran_even_with_a_reference(wrong_triple):
  if on_gpu():
    pytest.skip("a GPU is here: the kernel runs")
  with pytest.raises(pytest.skip.Exception, match="not checked: .*the kernels' fallbacks would run in their place"):
    jmf.testing.assert_matches_reference(wrong_triple, jnp.ones(16), reference=lambda x: 3 * x)
  report = jmf.testing.assert_matches_reference(wrong_triple, jnp.ones(16), skip_without_gpu=False)
  assert report.status == "not checked"


def test_a_function_without_kernels_passes():
  report = jmf.check(lambda x: x * 2, jnp.ones(8), reference=lambda x: x + x, shapes=None)
  assert (report.status, report.passed, report.not_checked) == ("passed", True, None)


# ------------------------------------------------------------------ the table

def test_the_table_fits_100_columns_and_says_a_skips_reason_in_full():
  why = ("the function refuses these inputs: LaunchError: mosaic_kernel 'tiles' at model.py:12 (forward): the grid "
         "covers 1024 elements but the output has 1023; pass a grid of cdiv(n, 256) blocks and guard the tail")
  worst = numerics.Worst((123, 4), 1.0571234567, -0.0579538123, 1.115077, 19.24, 35260940)
  rows = [
      check_report.Comparison("kernel vs fallback (outputs)", "float32[192, 160], float32[160, 128]", "out0",
                              "mosaic_kernel 'tiled_matmul' at test_check_corpus.py:40 (tiled_matmul)", "float32",
                              (192, 128), 1e-5, 3e-4, mismatches=7, size=192 * 128, worst=worst),
      check_report.skipped("outputs", "float32[191, 160], float32[160, 128]", "", None, why),
      check_report.Comparison("jit vs eager", "float32[192, 160], float32[160, 128]", "out", None, "float32",
                              (192, 128), 1e-5, 1e-5, size=192 * 128,
                              worst=numerics.Worst((0, 0), 1.0, 1.0, 0.0, 0.0, 0)),
  ]
  text = str(check_report.CheckReport(tuple(rows), seed=7))
  lines = text.splitlines()
  assert max(len(line) for line in lines) <= 100, text
  assert [c.strip() for c in lines[0].split("|")] == ["check", "inputs", "output", "result", "details"]
  assert len({line.count("|") for line in lines[:lines.index("")] if not line.startswith("-")}) == 1, text
  joined = " ".join(line.split("|")[-1].strip() for line in lines[:lines.index("")])
  assert why in joined, text                                       # wrapped, not cut
  assert "float32[192, 160]," in text and "float32[191," not in text.replace("float32[191, 160]", "")  # whole avals
  assert "FAIL 7/24576" in text and "worst at [123, 4]: got 1.057123, want -0.05795381" in joined
  assert re.search(r"\| ok +\| equal", text)
