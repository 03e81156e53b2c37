"""The public entry points: `mosaic_kernel` (one launch path for every kernel type), the caches' stats.

`mosaic_kernel` builds one `LaunchOptions` from its arguments, picks the path by the kernel's type (a
compiled `Kernel`, a Triton kernel, or a config space to autotune) and applies sharding once, around
whichever path it took.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax.export

from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call import primitive
from jax_mosaic_ffi.call.collective import Collective
from jax_mosaic_ffi.call.launch_options import CheckedLaunch, LaunchOptions
from jax_mosaic_ffi.cute import launch as cute_launch
from jax_mosaic_ffi.cute.kernel import CuteFunction
from jax_mosaic_ffi.toolchain import compile_cache
from jax_mosaic_ffi.toolchain.kernel import Kernel
from jax_mosaic_ffi.transforms import autotune as autotune_lib
from jax_mosaic_ffi.transforms import sharding as sharding_lib
from jax_mosaic_ffi.transforms import untimed
from jax_mosaic_ffi.triton import decorated as triton_decorated
from jax_mosaic_ffi.triton import launch as triton_launch
from jax_mosaic_ffi.triton import tensor_descriptor
from jax_mosaic_ffi.triton.compile import TritonKernel
from jax_mosaic_ffi.triton.kernel import TritonFunction


def mosaic_kernel(kernel: Kernel, out_shape, *, grid=None, block=None, cluster=None, smem_bytes=0,
                  uses_pdl: bool | None = None, scalars=(),
                  input_output_aliases: Mapping[int, int] | None = None,
                  param_order: Sequence[str] | None = None,
                  collective: Collective | None = None,
                  batch_grid_axis: str | None = None, fallback: Callable | None = None,
                  sharding=None, scratch_bytes=0, zero_scratch: bool = False, zero_outputs=(),
                  configs=None, autotune_key=None, autotune_default=None, has_side_effect: bool = False,
                  cost_estimate: Mapping[str, Any] | None = None) -> Callable[..., Any]:
  """Returns a function that launches ``kernel`` on its input arrays, inside ``jax.jit`` or outside.

  The kernel's parameters are, in order: one pointer per input, one pointer
  per output, then each scalar by value (and, for a collective kernel, the
  collective metadata pointer last). ``param_order=("out0", "in0",
  "scalar0", ...)`` names another order; an input and the output it aliases
  are one buffer, so either name passes it once. When the call is traced,
  each parameter's declared C++ type is checked against the array or scalar
  passed there. :doc:`CUDA C++, PTX and cubin kernels </guides/cuda_kernels>`
  explains each option at length.

  ``out_shape``, ``grid``, ``block``, ``smem_bytes`` and ``scalars`` may also
  be callables of the input avals (``grid=lambda x, y: jmf.cdiv(x.size, 256)``),
  evaluated when the call is traced, so one wrapper serves every shape.
  Under `jax.export` with symbolic shapes, ``out_shape``, ``grid`` and
  integer ``scalars`` (``jmf.dim_scalar(x.shape[0], np.int32)``) may follow
  the symbolic sizes: the runtime computes them when the shapes are known;
  ``block`` and ``smem_bytes`` stay constants (:doc:`JAX transformations </guides/transformations>`).

  Example (without a GPU, the fallback runs)::

    >>> kernel = jmf.cuda_kernel(
    ...     'extern "C" __global__ void scale(const float* x, float* y, float a, int n) {'
    ...     '  int i = blockIdx.x * blockDim.x + threadIdx.x;'
    ...     '  if (i < n) y[i] = a * x[i];'
    ...     '}', "scale")
    >>> scale = jmf.mosaic_kernel(kernel, lambda x: x, block=256,
    ...                           grid=lambda x: jmf.cdiv(x.size, 256),
    ...                           scalars=lambda x: (np.float32(3.0), np.int32(x.size)),
    ...                           fallback=lambda x: 3.0 * x)
    >>> jax.jit(scale)(jnp.ones(1000))[:3].tolist()
    [3.0, 3.0, 3.0]

  Args:
    kernel: from `cuda_kernel`, `ptx_kernel`, `cubin_kernel`, `triton_kernel` or `cute_kernel`.
    out_shape: a `jax.ShapeDtypeStruct`, or a sequence of them (a tuple of outputs then comes back).
    grid: the grid, an int or up to 3 ints. A Triton kernel's callables get ``(meta, *avals)``; a CuTe
      DSL launcher picks its own launch (no grid, block, shared memory or scalars).
    block: the block, an int or up to 3 ints. A Triton kernel takes its block, shared memory and cluster
      from Triton's metadata.
    cluster: thread-block clusters, up to 3 ints (sm_90 and newer).
    smem_bytes: dynamic shared memory per block (above 48 KiB is fine: the runtime raises the limit).
    uses_pdl: launch with programmatic dependent launch (PDL) allowed. By
      default, kernels that are safe for it (`Kernel.pdl_safe`: compiled or
      wrapped by jax_mosaic_ffi for sm_90+) use it; False opts out. True on
      a kernel that reads memory before ``griddepcontrol.wait`` is a race.
    scalars: numpy scalars (any int or float width, or bool), passed by value; a Python number is refused
      (its width is ambiguous).
    input_output_aliases: ``{input_index: output_index}`` for in-place updates; donate the input
      (``jax.jit(f, donate_argnums=...)``) and nothing is copied.
    param_order: an explicit parameter order, by names ``inN``, ``outN``, ``scalarN`` and ``"scratch"``. It
      may hold `TensorMap` declarations (the kernel gets a TMA descriptor, ``CUtensorMap``, of that input or
      output, built by the runtime) and, for Triton, `TensorDescriptor` ones.
    collective: a `Collective` for kernels that talk to their peers
      (:doc:`collectives </guides/collectives>`).
    batch_grid_axis: ``"x"``, ``"y"`` or ``"z"`` for a kernel written to take a vmap batch on that grid axis
      in one launch (:doc:`vmap </guides/transformations>`). By default a vmapped call launches the kernel
      once per batch element, unchanged.
    fallback: a jax.numpy function of the same inputs returning the same outputs, run instead of the
      kernel wherever the call is lowered for something other than CUDA (a CPU).
    sharding: how the call may be partitioned under ``jit``: `Elementwise()`, `BatchDims(...)`,
      `ShardingRule(...)`, or a callable of the input avals returning one.
    scratch_bytes: a scratch buffer of this many bytes for the kernel (split-K
      partials, grid-wide counters): an extra output XLA allocates and the
      call does not return, passed after the outputs or where ``param_order``
      names ``"scratch"``. Its contents are undefined unless ``zero_scratch``.
    zero_scratch: zero the scratch buffer before every launch.
    zero_outputs: output indices (or True for every unaliased one) the runtime zeroes before every launch,
      for kernels that accumulate into them (atomics, split-K); an aliased output cannot be zeroed.
    configs: ``[{...}, ...]`` autotunes the call (:doc:`autotuning </guides/autotuning>`): each config's
      values reach the callables as ``meta`` (and a Triton kernel's constexprs, ``num_warps`` and
      ``num_stages``, a CuTe DSL launcher's constexprs). A kernel under ``@triton.autotune`` /
      ``@triton.heuristics`` brings its own. Without a GPU, a call that has a ``fallback`` builds no config: the
      fallback runs, and only a program lowered for CUDA builds the default config.
    autotune_key: `autotune`'s ``key``: a function of the input avals that scopes the winner.
    autotune_default: `autotune`'s ``default``: the config (or its index) used where nothing is timed.
    has_side_effect: keep the call when its results are unused (a kernel that prints, or writes what XLA
      does not see).
    cost_estimate: ``{"flops": ..., "bytes_accessed": ...}``, carried with the custom call as
      ``cost_estimate_json``, for profilers, as jax-triton writes it.

  Returns:
    A function of the input arrays returning the output array (or a tuple of them).

  Raises:
    LaunchError: an option out of range or a parameter that does not match, naming the call site, the
      kernel and what to change (at this call for fixed values, when the call is traced for callables).
  """
  options = LaunchOptions(
      grid=grid, block=block, cluster=cluster, smem_bytes=smem_bytes, uses_pdl=uses_pdl, scalars=scalars,
      input_output_aliases=input_output_aliases, param_order=param_order, collective=collective,
      batch_grid_axis=batch_grid_axis, fallback=fallback, sharding=sharding, scratch_bytes=scratch_bytes,
      zero_scratch=zero_scratch, zero_outputs=zero_outputs, has_side_effect=has_side_effect,
      cost_estimate=cost_estimate)
  if isinstance(kernel, TritonFunction) and kernel.decorators:  # @triton.autotune / @triton.heuristics
    if configs is not None or autotune_key is not None or autotune_default is not None:
      raise ValueError(f"mosaic_kernel '{kernel.name}': the kernel's @triton.autotune/@triton.heuristics choose its "
                       "configs; configs=, autotune_key= and autotune_default= are for an undecorated kernel")
    call = triton_decorated.launcher(kernel, out_shape, dataclasses.replace(options, sharding=None))
    name = f"mosaic_kernel '{kernel.name}'"
  elif configs is not None:
    call = _tuned(kernel, out_shape, configs, autotune_key, autotune_default, options)
    name = _tuned_name(kernel)
  else:
    call = _launcher(kernel, out_shape, options)
    name = f"mosaic_kernel '{kernel.name}'"
  return call if sharding is None else sharding_lib.sharded(call, sharding, name=name)


def _launcher(kernel, out_shape, options: LaunchOptions, meta: Mapping[str, Any] | None = None) -> Callable[..., Any]:
  """The call of one kernel, by its type; without the sharding, which `mosaic_kernel` applies. ``meta``: an
  autotuning config's values, which a CUDA kernel's launch callables get first."""
  if isinstance(kernel, CuteFunction):  # compiled per specialization; its host function launches
    return cute_launch.launcher(kernel, out_shape, options)
  if options.grid is None:
    raise LaunchError(f"mosaic_kernel '{getattr(kernel, 'name', kernel)}': grid= is required (only a CuTe DSL "
                      "launcher picks its own)")
  if isinstance(kernel, (TritonKernel, TritonFunction)):  # launch options from Triton's compiled metadata
    return triton_launch.launcher(kernel, out_shape, options)
  where = who(kernel, source_location.current()) if isinstance(kernel, Kernel) else ""
  if any(isinstance(e, tensor_descriptor.TensorDescriptor) for e in options.param_order or ()):
    raise LaunchError(f"{where}: jmf.TensorDescriptor is a Triton kernel's parameter; a CUDA kernel takes a TMA "
                      "descriptor as jmf.TensorMap(operand, box=...)")
  if options.block is None and isinstance(kernel, Kernel):
    raise LaunchError(f"{where}: block (threads per block) is required")
  launch = CheckedLaunch.create(kernel, out_shape, options, where, meta)
  fallback = fallback_lib.create(options.fallback, where)
  if options.sharding is not None:
    sharding_lib.check_per_shard(launch, where)
  return primitive.kernel_call(launch, fallback)


def _tuned_name(kernel) -> str:
  return f"mosaic_kernel {getattr(kernel, 'name', kernel)!s}"


def _tuned(kernel, out_shape, configs, key, default, options: LaunchOptions) -> autotune_lib.Autotuned:
  """`mosaic_kernel(kernel, ..., configs=[...])`: an `Autotuned` over the configs, each config's call
  made by `_launcher` (the sharding goes around the tuned call, not each config's)."""
  if isinstance(kernel, TritonKernel):
    raise ValueError(f"mosaic_kernel '{kernel.name}': configs= needs the kernel uncompiled; make it with "
                     "jmf.triton_kernel(fn) without signature=, so each config compiles its own")
  per_config = dataclasses.replace(options, sharding=None)

  def factory(meta):
    if isinstance(kernel, (CuteFunction, TritonFunction)):  # a config is constexprs (and options) of the kernel
      return _launcher(kernel.with_meta(meta), out_shape, per_config)
    return _launcher(kernel, out_shape, per_config, meta)

  if options.fallback is not None:  # where nothing can be timed, only a program lowered for CUDA builds a config
    return untimed.WithFallback(factory, configs, fallback=options.fallback, key=key, default=default,
                                name=_tuned_name(kernel))
  return autotune_lib.Autotuned(factory, configs, key=key, default=default, name=_tuned_name(kernel))


@dataclasses.dataclass(frozen=True)
class KernelCacheStats:
  """What the caches did so far in this process (`kernel_cache_stats` returns one).

  Counts are since the process started; compare two readings around the calls of interest.

  Attributes:
    nvrtc_compiles: NVRTC invocations (one per target arch).
    memory_hits: compiles served by the in-memory cache.
    disk_hits: compiles served by the on-disk cache.
    module_parses: instantiate stages that parsed a module (``kernel_builds``: its old, deprecated name).
    parse_cache_hits: instantiate stages that found the module parsed in the runtime's cache
      (``kernel_hits``: its old, deprecated name).
    cached_kernels: parsed modules in that cache now.
    module_loads: ``cuModuleLoadData`` calls.
    loaded_modules: CUmodules alive now, across all devices.
    records_created: kernel launches recorded as CUDA-graph nodes by the record stage (command buffers).
    instantiations: instantiate stages run.
    instantiate_seconds: the time spent in them.
    collective_prepares: prepare stages run by collective call sites (XLA runs them on every execution).
    collective_initializes: initialize stages run by collective call sites.
    triton_compiles: Triton compiles (one per target arch; cache hits count as memory_hits / disk_hits).
    cute_compiles: CuTe DSL compiles (``cute.compile``, one per target arch); a CuTe DSL object's runtime
      module counts as a module_load.
    autotune_tunings: config spaces timed.
    autotune_disk_hits: autotuning winners found on disk instead of timed.
    autotune_memory_hits: autotuning winners found in this process instead of timed.
    autotune_skipped: calls left untuned for want of a GPU.
    tensor_map_encodes: TMA descriptors built (at a call site's first run on a device, then only when the
      buffer a descriptor describes moved).
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
  cute_compiles: int = 0
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
  """What the caches did so far in this process: compiles, hits, parsed and loaded modules, graph nodes.

  Counts since the process started (`clear_kernel_cache` empties the caches,
  not the counts), so compare two readings around the calls of interest::

    >>> source = 'extern "C" __global__ void noop(float* y) {}'
    >>> before = jmf.kernel_cache_stats()
    >>> kernels = [jmf.cuda_kernel(source, "noop") for _ in range(3)]
    >>> jmf.kernel_cache_stats().memory_hits - before.memory_hits   # compiled (or read from disk) once
    2

  Returns:
    A `KernelCacheStats`; its docstring says what each field counts.
  """
  compile_stats = compile_cache.stats()
  tune = autotune_lib.stats()
  return KernelCacheStats(
      nvrtc_compiles=compile_stats.nvrtc_compiles,
      memory_hits=compile_stats.memory_hits,
      disk_hits=compile_stats.disk_hits,
      **core.cache_stats(),
      triton_compiles=compile_stats.triton_compiles,
      cute_compiles=compile_stats.cute_compiles,
      autotune_tunings=tune.tunings,
      autotune_disk_hits=tune.disk_hits,
      autotune_memory_hits=tune.memory_hits,
      autotune_skipped=tune.skipped,
  )


def clear_kernel_cache(*, disk: bool = False) -> None:
  """Empties the in-memory caches (and the on-disk one with ``disk=True``).

  The compile caches (NVRTC, Triton, CuTe DSL), the autotuning timings (loaded tuning files too) and the
  runtime's parsed modules. Modules stay loaded on the GPU while a live executable uses them; they are
  unloaded when the last such executable is destroyed. The counts of `kernel_cache_stats` are kept::

    >>> jmf.clear_kernel_cache()   # the next compile reads the disk cache; disk=True empties that too
  """
  compile_cache.clear_memory_cache()
  autotune_lib.clear_memory_cache()
  core.clear_kernel_cache()
  if disk:
    disk_cache.clear()


def export_disabled_checks() -> list:
  """The ``disabled_checks`` that let ``jax.export.export`` take our custom calls.

  Not needed with a supported jax: importing the package puts our targets on jax.export's list of stable
  custom calls (their stability is ours to keep: :doc:`the contract </contract>`), so the plain call works::

      exported = jax.export.export(jax.jit(f), platforms=["cuda"])(x)

  Passing these as well changes nothing there; a jax that cannot be told says so when the export lowers a
  kernel, naming this function::

      exported = jax.export.export(jax.jit(f), platforms=["cuda"],
                                   disabled_checks=jmf.export_disabled_checks())(x)
  """
  return [jax.export.DisabledSafetyCheck.custom_call(name) for name in contract.ALL_TARGETS]
