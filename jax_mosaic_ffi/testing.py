"""Checking kernels in a test suite, in one line: ``jmf.testing.assert_matches_reference(fn, *example_args)``.

    import jax_mosaic_ffi as jmf

    def test_softmax_matches_its_reference():
      jmf.testing.assert_matches_reference(softmax, jnp.zeros((128, 1000), jnp.bfloat16))

It runs `jax_mosaic_ffi.check` (outputs, jit against eager, vmap against a loop, VJP and JVP, over the examples'
shapes and their edges) and fails the test with the report's table when a comparison differs. Without a GPU a
kernel's fallback runs in its place, so there is nothing of the kernel to check (the report's status is
``"not checked"``): the test is skipped (pytest), as the package's own GPU tests are, unless the function calls no
kernel.
"""

from __future__ import annotations

from typing import Callable

import jax

from jax_mosaic_ffi.base.errors import ReferenceMismatch
from jax_mosaic_ffi.base.gpu_info import gpu_unavailable_reason
from jax_mosaic_ffi.call.comparison.check_report import CheckReport
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p
from jax_mosaic_ffi.transforms.check import check, equations

__all__ = ["assert_matches_reference"]


def assert_matches_reference(fn: Callable, *example_args, skip_without_gpu: bool = True, **check_args) -> CheckReport:
  """Fails (`ReferenceMismatch`, an ``AssertionError``) unless ``fn`` matches its reference in every comparison of
  `check`; returns the `CheckReport` otherwise. ``check_args`` are `check`'s (``reference=``, ``shapes=``,
  ``dtypes=``, ``rtol=``...)::

    >>> jmf.testing.assert_matches_reference(lambda x: x * 2, jnp.ones(16), reference=lambda x: x + x).status
    'passed'

  Where no kernel of ``fn`` would run (jax has no CUDA device, or ``JAX_MOSAIC_FFI_REFERENCE=1``: the kernels'
  fallbacks stand in for them), nothing of the kernels is checked: with ``skip_without_gpu`` (the default) the
  test is skipped under pytest, saying why; without it, the report is returned with the status ``"not checked"``
  (a comparison that differs still fails).
  """
  __tracebackhide__ = True  # pytest shows the caller's line
  if skip_without_gpu and _calls_kernels(fn, example_args):
    reason = _no_gpu()
    if reason is not None:  # known before anything runs: skipped without compiling the check's programs
      _skip(f"{reason}; the kernels' fallbacks would run in their place")
  report = check(fn, *example_args, **check_args)
  if report.failures:
    raise ReferenceMismatch(report)
  if skip_without_gpu and report.status == "not checked":
    _skip(report.not_checked)
  return report


def _skip(reason: str) -> None:
  import pytest  # noqa: PLC0415  (only where a test suite runs it: the package does not need pytest)
  pytest.skip(f"jmf.testing.assert_matches_reference: not checked: {reason}")


def _calls_kernels(fn, example_args) -> bool:
  avals = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), example_args)
  return any(e.primitive is mosaic_kernel_p for e in equations(jax.make_jaxpr(fn)(*avals)))


def _no_gpu() -> str | None:
  try:
    count, error = len(jax.devices("cuda")), None
  except RuntimeError as e:
    count, error = 0, str(e)
  return gpu_unavailable_reason(count, 1, error)
