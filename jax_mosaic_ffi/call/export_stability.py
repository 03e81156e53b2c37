"""Our custom-call targets on jax.export's list of stable targets, so that a plain
``jax.export.export(jax.jit(f), platforms=["cuda"])(x)`` takes a ``mosaic_kernel``.

jax.export refuses to serialize a custom call whose target is not on its list of targets with compatibility
guarantees, and its message then prints the whole call, kernel binary included. The list holds JAX's own kernel
calls (Pallas's ``tpu_custom_call`` and ``mosaic_gpu_v2``, whose kernels travel inside the call as ours do).
Ours qualify by the contract (docs/contract.md): every target is versioned, a released target never changes
meaning, and every later runtime serves every earlier version (tests/test_export.py runs an artifact of
version 1). `jmf.export_disabled_checks()` stays for code that passes it, and for a JAX this module cannot
change.

The list is private to JAX (``jax._src.export._export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE``, a set that
``_check_module`` copies at each export, in jax 0.11 and 0.12): this module is the one place that touches it.
Where a JAX has no such set, nothing is changed and an export's lowering warns first, at the user's line, with
the fix, before JAX's own refusal.
"""

from __future__ import annotations

import jax

from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.base import source_location


# JAX's set of the custom-call targets it knows as stable.
_STABLE = "_CUSTOM_CALL_TARGETS_GUARANTEED_STABLE"


def _declare_stable() -> str | None:
  """Adds our targets to JAX's set of stable custom-call targets; why it could not, or None."""
  try:
    from jax._src.export import _export  # noqa: PLC0415  (JAX's private module, tried once, here only)
  except ImportError as e:
    return f"jax._src.export._export is gone ({e})"
  stable = getattr(_export, _STABLE, None)
  if stable is None:
    return f"jax._src.export._export has no {_STABLE}"
  if not isinstance(stable, set):
    return f"jax._src.export._export.{_STABLE} is now a {type(stable).__name__}, not a set"
  stable.update(contract.ALL_TARGETS)
  return None


# Why our targets are not on JAX's list (None: they are). Set once, at import.
PROBLEM = _declare_stable()


def warn_if_refused(where: str) -> None:
  """At a lowering for ``jax.export``: where this JAX could not be told that our targets are stable, warns
  at the user's line with the fix, before JAX's refusal (which prints the whole call). ``where`` names the call."""
  if PROBLEM is not None:
    source_location.warn(
        f"{where}: jax.export refuses custom calls it does not know as stable: pass "
        f"disabled_checks=jmf.export_disabled_checks() to jax.export.export (jax {jax.__version__} could not "
        f"be told that jax_mosaic_ffi's targets are stable: {PROBLEM})", UserWarning)
