"""Names and versions fixed by the custom-call contract (docs/contract.md).

Exported programs carry these names, so a released name never changes
meaning: a change to the attributes is a new contract version, with new
target names, and the runtime keeps serving every older one. The contract's
limits and its validator live in the C++ runtime (csrc/contract/contract.h), its one
owner; Python asks it through `_core.validate_launch` and `_core.LIMITS`.
"""

# The newest version this package writes; calls that need nothing of v2 are still written as v1, which
# every release of the runtime reads.
CONTRACT_VERSION = 2

# One target for plain kernels, one for collective ones: a plain kernel then
# pays for no prepare or initialize stage at all (see docs/architecture.md).
LAUNCH_TARGET = "jax_mosaic_ffi_launch_v1"
COLLECTIVE_TARGET = "jax_mosaic_ffi_collective_v1"
# Kernels that use NVSHMEM: the plain launch, with prepare and initialize stages that start NVSHMEM and
# allocate the symmetric buffers outside any stream capture.
NVSHMEM_TARGET = "jax_mosaic_ffi_nvshmem_v1"
# Contract v2: v1 plus `launch_programs` (a grid and scalars computed from symbolic shapes). Its own name,
# so that a runtime that predates it refuses the call (no such target) instead of ignoring the attribute
# and launching the placeholders.
LAUNCH_TARGET_V2 = "jax_mosaic_ffi_launch_v2"

# CuTe DSL kernels: a module of CuTe DSL objects whose host function launches, given `host_args` (the
# object's arguments). The nograph target is the same call kept out of CUDA graphs (allow_cuda_graph=False).
CUTE_TARGET = "jax_mosaic_ffi_cute_v1"
CUTE_NOGRAPH_TARGET = "jax_mosaic_ffi_cute_nograph_v1"

ALL_TARGETS = (LAUNCH_TARGET, COLLECTIVE_TARGET, NVSHMEM_TARGET, LAUNCH_TARGET_V2, CUTE_TARGET, CUTE_NOGRAPH_TARGET)


def target_name(*, collective: bool, nvshmem: bool = False, programs: bool = False) -> str:
  """The target of a kernel launched with its parameters (a launch extension names its own target)."""
  if nvshmem:
    return NVSHMEM_TARGET  # NVSHMEM calls with programs are refused before lowering (launch_options.py)
  if programs:
    return LAUNCH_TARGET_V2  # collective calls with programs are refused before lowering (launch_options.py)
  return COLLECTIVE_TARGET if collective else LAUNCH_TARGET
