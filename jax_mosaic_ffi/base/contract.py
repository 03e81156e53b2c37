"""Names and versions fixed by the custom-call contract (docs/contract.md).

Exported programs carry these names, so a released name never changes
meaning: a change to the attributes is a new contract version, with new
target names, and the runtime keeps serving every older one. The contract's
limits and its validator live in the C++ runtime (csrc/contract/contract.h), its one
owner; Python asks it through `_core.validate_launch` and `_core.LIMITS`.
"""

CONTRACT_VERSION = 1

# One target for plain kernels, one for collective ones: a plain kernel then
# pays for no prepare or initialize stage at all (see docs/architecture.md).
LAUNCH_TARGET = "jax_mosaic_ffi_launch_v1"
COLLECTIVE_TARGET = "jax_mosaic_ffi_collective_v1"
# Kernels that use NVSHMEM: the plain launch, with prepare and initialize stages that start NVSHMEM and
# allocate the symmetric buffers outside any stream capture.
NVSHMEM_TARGET = "jax_mosaic_ffi_nvshmem_v1"

ALL_TARGETS = (LAUNCH_TARGET, COLLECTIVE_TARGET, NVSHMEM_TARGET)


def target_name(*, collective: bool, nvshmem: bool = False) -> str:
  if nvshmem:
    return NVSHMEM_TARGET
  return COLLECTIVE_TARGET if collective else LAUNCH_TARGET
