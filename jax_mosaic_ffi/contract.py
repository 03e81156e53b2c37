"""Names and versions fixed by the custom-call contract (docs/contract.md).

Exported programs carry these names, so a released name never changes
meaning: a change to the attributes is a new contract version, with new
target names, and the runtime keeps serving every older one.
"""

import os

CONTRACT_VERSION = 1

# One target for plain kernels, one for collective ones: a plain kernel then
# pays for no prepare or initialize stage at all (see docs/architecture.md).
LAUNCH_TARGET = "jax_mosaic_ffi_launch_v1"
COLLECTIVE_TARGET = "jax_mosaic_ffi_collective_v1"
# The same launch with module loading in a prepare stage, as the anchor does
# it; kept for A/B measurements (benchmarks/launch_overhead.py).
STAGED_LAUNCH_TARGET = "jax_mosaic_ffi_staged_launch_v1"

ALL_TARGETS = (LAUNCH_TARGET, COLLECTIVE_TARGET, STAGED_LAUNCH_TARGET)

# Set to 1 to lower plain kernels to the staged target instead.
STAGED_ENV = "JAX_MOSAIC_FFI_STAGED_LAUNCH"


def target_name(*, collective: bool) -> str:
  if collective:
    return COLLECTIVE_TARGET
  if os.environ.get(STAGED_ENV, "") not in ("", "0"):
    return STAGED_LAUNCH_TARGET
  return LAUNCH_TARGET
