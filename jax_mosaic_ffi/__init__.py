"""Hand-written GPU kernels inside `jax.jit`.

    import jax_mosaic_ffi as jmf

    kernel = jmf.cuda_kernel(source, "add")
    add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype),
                            grid=blocks, block=256, scalars=(np.int32(n),))
    y = jax.jit(add)(x, x)

See README.md for the whole API.
"""

from __future__ import annotations

import dataclasses

import jax  # noqa: F401  (jaxlib's extensions load before ours)

from jax_mosaic_ffi import _core
from jax_mosaic_ffi import versions as _versions

# First, so that an unsupported jax gets a message naming the supported range
# rather than an error from deep inside a module that uses it.
_versions.check(_core.BUILT_AGAINST["jaxlib"])

from jax_mosaic_ffi.autodiff import differentiable
from jax_mosaic_ffi import compiler as _compiler
from jax_mosaic_ffi import contract
from jax_mosaic_ffi import disk_cache as _disk_cache
from jax_mosaic_ffi import registration as _registration
from jax_mosaic_ffi.collective import Collective
from jax_mosaic_ffi.compiler import CompileError
from jax_mosaic_ffi import lowering as _lowering  # noqa: F401  (registers the CUDA lowering)
from jax_mosaic_ffi import ops
from jax_mosaic_ffi.kernel import Kernel, cubin_kernel, cuda_kernel, ptx_kernel
from jax_mosaic_ffi.launch_spec import LaunchError, cdiv
from jax_mosaic_ffi.primitive import mosaic_kernel, mosaic_kernel_p
from jax_mosaic_ffi.sharding import BatchDims, Elementwise, ShardingRule, sharded
from jax_mosaic_ffi.tensor_map import TensorMap
from jax_mosaic_ffi import autotuning as _autotune
from jax_mosaic_ffi import triton_lib as _triton
from jax_mosaic_ffi.autotuning import AutotuneError, Autotuned, autotune
from jax_mosaic_ffi.triton_lib import TritonFunction, TritonKernel, TritonUnavailable, triton_kernel

autotune_report = _autotune.report

__version__ = "0.1.0"

register = _registration.register

__all__ = [
    "BatchDims", "Collective", "CompileError", "Elementwise", "Kernel", "KernelCacheStats", "LaunchError",
    "ShardingRule", "TensorMap", "cdiv", "clear_kernel_cache", "cubin_kernel", "cuda_kernel", "differentiable",
    "export_disabled_checks", "kernel_cache_stats", "mosaic_kernel", "mosaic_kernel_p", "ops", "ptx_kernel",
    "register", "sharded", "AutotuneError", "Autotuned", "TritonFunction", "TritonKernel", "TritonUnavailable",
    "autotune", "autotune_report", "triton_kernel",
]


@dataclasses.dataclass(frozen=True)
class KernelCacheStats:
  """What the caches did so far in this process.

  nvrtc_compiles: NVRTC invocations (one per target arch). memory_hits /
  disk_hits: compiles served by the in-memory or on-disk cache.
  module_parses / parse_cache_hits: instantiate stages that parsed a module
  or found it parsed in the runtime's cache (``kernel_builds`` and
  ``kernel_hits`` are their old, deprecated names). cached_kernels: parsed
  modules in that cache now. module_loads: cuModuleLoadData
  calls. loaded_modules: CUmodules alive now, across all devices.
  records_created: kernel launches recorded as CUDA-graph nodes by the record
  stage (command buffers). instantiations / instantiate_seconds: instantiate
  stages run, and the time spent in them. collective_prepares /
  collective_initializes: prepare and initialize stages run by collective
  call sites (XLA runs them on every execution). triton_compiles: Triton
  compiles (one per target arch; cache hits count as memory_hits /
  disk_hits). autotune_tunings: config spaces timed; autotune_disk_hits /
  autotune_memory_hits: winners found on disk / in this process instead;
  autotune_skipped: calls left untuned for want of a GPU. tensor_map_encodes:
  TMA descriptors built (at a call site's first run on a device, then only
  when the buffer a descriptor describes moved).
  """

  nvrtc_compiles: int
  memory_hits: int
  disk_hits: int
  module_parses: int
  parse_cache_hits: int
  cached_kernels: int
  module_loads: int
  loaded_modules: int
  records_created: int
  instantiations: int
  instantiate_seconds: float
  collective_prepares: int
  collective_initializes: int
  triton_compiles: int = 0
  autotune_tunings: int = 0
  autotune_disk_hits: int = 0
  autotune_memory_hits: int = 0
  autotune_skipped: int = 0
  tensor_map_encodes: int = 0

  @property
  def kernel_builds(self) -> int:
    """Deprecated name of `module_parses`."""
    return self.module_parses

  @property
  def kernel_hits(self) -> int:
    """Deprecated name of `parse_cache_hits`."""
    return self.parse_cache_hits


def kernel_cache_stats() -> KernelCacheStats:
  compile_stats = _compiler.stats()
  tune = _autotune.stats()
  return KernelCacheStats(
      nvrtc_compiles=compile_stats.nvrtc_compiles,
      memory_hits=compile_stats.memory_hits,
      disk_hits=compile_stats.disk_hits,
      **_core.cache_stats(),
      triton_compiles=_triton.compiles(),
      autotune_tunings=tune.tunings,
      autotune_disk_hits=tune.disk_hits,
      autotune_memory_hits=tune.memory_hits,
      autotune_skipped=tune.skipped,
  )


def clear_kernel_cache(*, disk: bool = False) -> None:
  """Empties the in-memory caches (and the on-disk one with ``disk=True``).

  Modules stay loaded on the GPU while a live executable uses them; they are
  unloaded when the last such executable is destroyed.
  """
  _compiler.clear_memory_cache()
  _triton.clear_memory_cache()
  _autotune.clear_memory_cache()
  _core.clear_kernel_cache()
  if disk:
    _disk_cache.clear()


def export_disabled_checks() -> list:
  """The ``disabled_checks`` to pass to ``jax.export.export``.

  Our custom-call targets are not on JAX's list of stable custom calls;
  their stability is ours to keep (docs/contract.md)::

      exported = jax.export.export(jax.jit(f), platforms=["cuda"],
                                   disabled_checks=jmf.export_disabled_checks())(x)
  """
  import jax.export
  return [jax.export.DisabledSafetyCheck.custom_call(name) for name in contract.ALL_TARGETS]
