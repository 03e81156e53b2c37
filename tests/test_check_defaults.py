"""The checker's defaults catch wrong kernels (call/comparison/numerics.py, transforms/check.py): each dtype's
tolerance has a small absolute floor, an output of another dtype than its reference's fails unless the check casts
on purpose (``cast_reference=True``), and the report counts the elements that passed only by ``atol``.

Each wrong function here passed with the old defaults: bfloat16's and float16's ``atol`` equalled their ``rtol``
(1.6e-2, 2e-3), more than any element of a softmax over 4096 columns or of its gradient, so all zeros matched; and
the reference's outputs were cast to the function's dtypes before the comparison, so a float16 result of a float32
function, or an int8 one that wraps where int32 does not, matched too.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.call.comparison import numerics

import kernel_sources

F32, F16, BF16 = jnp.float32, jnp.float16, jnp.bfloat16
OUTPUTS_ONLY = dict(shapes=None, vmap=False, eager=False, grads=False)
ROWS = (8, 4096)   # a softmax over 4096 columns: every element is below 1.6e-2, most above 1e-5


def softmax(x):
  return jax.nn.softmax(x.astype(F32), axis=-1).astype(x.dtype)


def on_gpu() -> bool:
  return jax.devices()[0].platform == "gpu"


# ------------------------------------------------------------------ the tolerances' absolute floor

def test_half_types_have_a_small_absolute_floor_and_narrow_floats_one_step_at_zero():
  assert numerics.tolerance(F16) == (2e-3, 1e-5)
  assert numerics.tolerance(BF16) == (1.6e-2, 1e-5)
  assert numerics.tolerance(F32) == (1e-5, 1e-5)
  assert numerics.tolerance(jnp.float8_e4m3fn) == (0.125, 2.0 ** -9)
  assert numerics.tolerance(jnp.float8_e5m2) == (0.25, 2.0 ** -16)
  # Two float32 values either side of half a step round to 0 and to that step: still a match.
  step = np.asarray([2.0 ** -9], ml_dtypes.float8_e4m3fn)
  zero = np.zeros(1, ml_dtypes.float8_e4m3fn)
  assert int(numerics.device_summary(jnp.asarray(zero), jnp.asarray(step), *numerics.tolerance(step.dtype))[0]) == 0


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_an_all_zero_softmax_over_4096_columns_fails_for_every_seed(dtype):
  for seed in range(10):
    report = jmf.check(jnp.zeros_like, jnp.zeros(ROWS, dtype), reference=softmax, seed=seed, **OUTPUTS_ONLY)
    (row,) = report.rows
    assert report.status == "failed" and row.mismatches > 0.99 * row.size, (seed, report)


def zero_gradient_softmax():
  @jax.custom_vjp
  def zeroed(x):
    return softmax(x)

  zeroed.defvjp(lambda x: (softmax(x), None), lambda _, g: (jnp.zeros_like(g),))
  return zeroed


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_a_zeroed_backward_rule_fails(dtype):
  report = jmf.check(zero_gradient_softmax(), jnp.zeros(ROWS, dtype), reference=softmax, shapes=None, vmap=False,
                     eager=False, seed=0)
  assert report.status == "failed", report
  (vjp,) = report.failures
  assert vjp.what == "VJP" and vjp.mismatches > 0.8 * vjp.size, report


SOFTMAX_BF16 = r'''
#include <cuda_bf16.h>
#define THREADS 256

''' + kernel_sources.BLOCK_REDUCE + r'''
extern "C" __global__ void softmax_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, int cols) {
  __shared__ float smem[THREADS];
  const __nv_bfloat16* xr = x + (long long)blockIdx.x * cols;
  __nv_bfloat16* yr = y + (long long)blockIdx.x * cols;
  float m = __int_as_float(0xff800000);  // -inf
  for (int j = threadIdx.x; j < cols; j += THREADS) m = fmaxf(m, __bfloat162float(xr[j]));
  m = block_reduce(m, smem, true);
  float s = 0.0f;
  for (int j = threadIdx.x; j < cols; j += THREADS) s += expf(__bfloat162float(xr[j]) - m);
  float inv = 1.0f / block_reduce(s, smem, false);
  for (int j = threadIdx.x; j < cols; j += THREADS) yr[j] = __float2bfloat16(expf(__bfloat162float(xr[j]) - m) * inv);
}

extern "C" __global__ void softmax_bwd_zeroed(const __nv_bfloat16* y, const __nv_bfloat16* dy, __nv_bfloat16* dx,
                                              int cols) {
  const long long row = (long long)blockIdx.x * cols;
  for (int j = threadIdx.x; j < cols; j += THREADS) dx[row + j] = __float2bfloat16(0.0f);  // wrong: no gradient
}
'''


def test_a_zeroed_backward_kernel_of_a_bf16_softmax_fails_and_is_named(isolated_disk_cache):
  rows = lambda x: x.size // x.shape[-1]  # noqa: E731  (one block a row)
  fwd = jmf.mosaic_kernel(jmf.cuda_kernel(SOFTMAX_BF16, "softmax_bf16"), lambda x: x, grid=rows, block=256,
                          scalars=lambda x: (np.int32(x.shape[-1]),), fallback=softmax)
  bwd = jmf.mosaic_kernel(jmf.cuda_kernel(SOFTMAX_BF16, "softmax_bwd_zeroed"), lambda y, dy: y,
                          grid=lambda y, dy: rows(y), block=256, scalars=lambda y, dy: (np.int32(y.shape[-1]),),
                          fallback=lambda y, dy: jnp.zeros_like(dy))   # as wrong as the kernel
  zeroed = jmf.differentiable(fwd, bwd=bwd, residuals=("out0",))
  report = jmf.check(zeroed, jnp.zeros(ROWS, BF16), shapes=None, vmap=False, seed=0)
  # On the CPU the fallbacks stand in (it said "not checked" before, nothing having differed); on a GPU the
  # kernels run (it said "passed").
  assert report.status == "failed", report
  failed = {r.what for r in report.failures}
  assert failed == {"VJP", "derivative rule (VJP)"}, report
  (rule,) = [r for r in report.failures if r.what == "derivative rule (VJP)"]
  assert "softmax_bf16" in rule.kernel, rule.kernel


# ------------------------------------------------------------------ the output's dtype

def third(x):
  return (x / 3).astype(F16)


def test_a_float16_output_of_a_float32_reference_fails_unless_the_check_casts_on_purpose():
  report = jmf.check(third, jnp.zeros(1000), reference=lambda x: x / 3, shapes=None, vmap=False, eager=False)
  (row,) = report.failures
  assert (row.what, row.dtype, row.reference_dtype, row.mismatches) == ("outputs", "float16", "float32", 0)
  assert row.describe().endswith("returns float16 where its reference returns float32; return float32, or pass "
                                 "cast_reference=True to compare with the reference cast to float16"), row.describe()
  assert "FAIL dtype" in str(report)
  (skipped,) = [r for r in report.rows if r.skipped]   # its derivatives would take cotangents of other dtypes
  assert skipped.what == "VJP, JVP" and "cast_reference=True" in skipped.skipped
  cast = jmf.check(third, jnp.zeros(1000), reference=lambda x: x / 3, cast_reference=True, shapes=None, vmap=False,
                   eager=False)
  assert cast.status == "passed", cast
  assert [r.what for r in cast.rows] == ["outputs", "VJP", "JVP"]   # the cast reference differentiated too


def test_an_int8_output_that_wraps_against_an_int32_reference_fails():
  def ints(rng, x):
    return (rng.integers(2, 8, x.shape).astype(np.int32),)   # x * 64 >= 128: int8 wraps

  wraps = lambda x: x.astype(jnp.int8) * 64  # noqa: E731
  report = jmf.check(wraps, jnp.zeros(256, jnp.int32), reference=lambda x: x * 64, inputs=ints, **OUTPUTS_ONLY)
  (row,) = report.failures
  assert (row.dtype, row.reference_dtype) == ("int8", "int32"), report
  with pytest.raises(jmf.ReferenceMismatch, match="returns int8 where its reference returns int32"):
    jmf.check(wraps, jnp.zeros(256, jnp.int32), reference=lambda x: x * 64, inputs=ints, raise_on_mismatch=True,
              **OUTPUTS_ONLY)


# ------------------------------------------------------------------ passed only by atol

def test_the_comparison_counts_the_elements_that_passed_only_by_atol():
  want = np.asarray([1.0, 0.0, 1e-6, 2.0, 0.0], np.float32)
  got = np.asarray([1.0 + 5e-6, 5e-6, 6e-6, 2.0, 3e-5], np.float32)
  # within rtol * 1; only by atol (twice: their want is 0 and 1e-6); equal; a mismatch
  found = numerics.device_summary(jnp.asarray(got), jnp.asarray(want), 1e-5, 1e-5)
  assert len(found) == numerics.SUMMARY_SIZE
  assert (int(found[0]), int(found[-1])) == (1, 2)
  ints = numerics.device_summary(jnp.asarray([1, 2]), jnp.asarray([1, 3]), 0.0, 0.0)
  assert (int(ints[0]), int(ints[-1])) == (1, 0)


def test_the_report_says_how_many_elements_passed_only_by_atol():
  x = np.linspace(-1, 1, 1001, dtype=np.float32)
  near_zero = int(np.sum(np.abs(x) < 0.3))   # each off by 4e-6, over rtol * |x| (3e-6 at most): by atol only

  def nudged(v):
    return jnp.where(jnp.abs(v) < 0.3, v + 4e-6, v)

  report = jmf.check(nudged, jnp.zeros(1001), reference=lambda v: v, inputs=lambda rng, v: (x,), **OUTPUTS_ONLY)
  (row,) = report.rows
  assert report.status == "passed" and row.passed_by_atol == report.passed_by_atol == near_zero, report
  assert report.summary() == f"all 1 comparisons match (seed {report.seed}); {near_zero} elements passed only by atol"
  assert f"{near_zero} of 1001 passed only by atol" in " ".join(str(report).split())
  assert row.describe().endswith(f"matches; {near_zero} passed only by atol")
