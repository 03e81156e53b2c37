"""The public entry points: `mosaic_kernel` (one launch path for every kernel type), the caches' stats.

`mosaic_kernel` takes the options every front end takes (`LaunchOptions`) and the kernel's front end's own
(its options object), picks the front end from `FRONT_ENDS` by the kernel's type (call/front_end.py: the
protocol), autotunes when given configs, and applies sharding once, around whichever call it made.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax.export

from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.call import front_end as front_end_lib
from jax_mosaic_ffi.call.front_end import FrontEnd
from jax_mosaic_ffi.call.launch_options import LaunchOptions
from jax_mosaic_ffi.cuda import front_end as cuda_front_end
from jax_mosaic_ffi.cute import front_end as cute_front_end
from jax_mosaic_ffi.cutile import front_end as cutile_front_end
from jax_mosaic_ffi.gluon import front_end as gluon_front_end
from jax_mosaic_ffi.store import stack as store_stack
from jax_mosaic_ffi.store import stats as store_stats
from jax_mosaic_ffi.toolchain.kernel import Kernel
from jax_mosaic_ffi.transforms import autotune as autotune_lib
from jax_mosaic_ffi.transforms import sharding as sharding_lib
from jax_mosaic_ffi.transforms import untimed
from jax_mosaic_ffi.triton import front_end as triton_front_end

# The front ends, one line each (docs/architecture.md, "The front-end protocol"): a kernel is launched by the one
# whose kernel types hold its type, the nearest in its class's order (a TritonKernel is a Kernel, and Triton's).
FRONT_ENDS: tuple[FrontEnd, ...] = (
    cuda_front_end.FRONT_END,
    triton_front_end.FRONT_END,
    cute_front_end.FRONT_END,
    gluon_front_end.FRONT_END,
    cutile_front_end.FRONT_END,
)
# The shared layers read what the front ends' kernels need beyond the launch (runtime libraries, toolchains) there.
front_end_lib.install(FRONT_ENDS)

# Each front-end keyword of mosaic_kernel, with its default where a front end takes it: a keyword left at it is
# not refused by a front end that does not take it.
_DEFAULTS = {field.name: field.default for front_end in FRONT_ENDS for field in dataclasses.fields(front_end.options)}


def front_end_of(kernel) -> FrontEnd:
  """The front end that launches ``kernel``, by its type: the nearest registered type in its class's order. One of
  no front end's types (a wing's compiled kernel another front end's call makes, a Kernel made by hand) is refused
  by name, never handed to a launcher that would misread it."""
  found = front_end_lib.of(kernel)
  if found is not None:
    return found
  makers = ", ".join(maker for front_end in FRONT_ENDS for maker in front_end.makers)
  kind = f"{type(kernel).__module__}.{type(kernel).__qualname__}"
  if isinstance(kernel, Kernel):
    raise TypeError(f"mosaic_kernel launches the kernels of its front ends ({makers}); a {kind} is a compiled "
                    "kernel of none of them (a CuteKernel is what the CuteFunction of cute_kernel compiles to inside "
                    "a call: pass that CuteFunction). A new kind of kernel needs its front end: one line in "
                    "jax_mosaic_ffi/api.py's FRONT_ENDS (docs/architecture.md, the front-end protocol)")
  raise TypeError(f"mosaic_kernel needs a kernel from {makers}, got a {kind}")


def mosaic_kernel(kernel, out_shape, *, grid: Any = None, block: Any = None, scalars: Any = (),
                  input_output_aliases: Mapping[int, int] | None = None,
                  fallback: Callable | None = None, sharding=None, zero_outputs=(), has_side_effect: bool = False,
                  cost_estimate: Mapping[str, Any] | None = None, configs=None, autotune_key=None,
                  autotune_default=None, autotune_inputs=None, **options) -> Callable[..., Any]:
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

  Each front end takes, besides the options every front end takes, options of its own (``grid``, ``block`` and
  ``scalars``, named in the signature as most calls give them, and the rest through ``**options``): a CUDA
  kernel's are ``grid``, ``block``, ``cluster``, ``smem_bytes``, ``uses_pdl``, ``scalars``, ``param_order``,
  ``collective``, ``batch_grid_axis``, ``scratch_bytes`` and ``zero_scratch``; a Triton kernel's ``grid``,
  ``scalars``, ``uses_pdl`` and ``param_order``; a CuTe DSL launcher has none. Another front end's option is
  refused by name, saying what to do instead.

  Args:
    kernel: from `cuda_kernel`, `ptx_kernel`, `cubin_kernel`, `triton_kernel`, `gluon_kernel` or `cute_kernel`.
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
    autotune_inputs: `autotune`'s ``inputs``: ``inputs(rng, *avals)`` -> the arrays the configs are timed on (valid
      lengths, block tables), in place of random ones.
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
  front_end = front_end_of(kernel)
  # Named in the signature for editors and help(); to the front ends, front-end keywords like the others (left at
  # these defaults, refused by none).
  options = {"grid": grid, "block": block, "scalars": scalars, **options}
  unknown = sorted(options.keys() - _DEFAULTS.keys())
  if unknown:
    raise TypeError(f"mosaic_kernel() got an unexpected keyword argument {unknown[0]!r}")
  made = f"mosaic_kernel '{getattr(kernel, 'name', kernel)}'"
  own = front_end.options_of(options, _DEFAULTS, made)
  launch = LaunchOptions(input_output_aliases=input_output_aliases, fallback=fallback, sharding=sharding,
                         zero_outputs=zero_outputs, has_side_effect=has_side_effect, cost_estimate=cost_estimate)
  if configs is not None or autotune_key is not None or autotune_default is not None or autotune_inputs is not None:
    front_end.check_tunable(kernel, made, configs)
  if autotune_inputs is not None and configs is None:
    raise TypeError(f"{made}: autotune_inputs= makes the arrays configs= are timed on; without configs= nothing is "
                    "timed: drop it, or give configs=[...]")
  if configs is None:
    call = front_end.launcher(kernel, out_shape, launch, own)
    name = made
  else:
    # Each config's call without the sharding, which goes around the tuned call.
    per_config = dataclasses.replace(launch, sharding=None)
    name = f"mosaic_kernel {getattr(kernel, 'name', kernel)!s}"
    factory = lambda meta: front_end.launcher(kernel, out_shape, per_config, own, meta)  # noqa: E731
    if fallback is None:
      call = autotune_lib.Autotuned(factory, configs, key=autotune_key, default=autotune_default, name=name,
                                    inputs=autotune_inputs)
    else:  # where nothing can be timed, only a program lowered for CUDA builds a config
      call = untimed.WithFallback(factory, configs, fallback=fallback, key=autotune_key, default=autotune_default,
                                  name=name, inputs=autotune_inputs)
  return call if sharding is None else sharding_lib.sharded(call, sharding, name=name)


# Each of KernelCacheStats' names for a count of the store's mapping (store/stats.py): (kind, event).
_STORE_NAMES = {
    "memory_hits": ("compile", "memory"), "disk_hits": ("compile", "disk"), "pack_hits": ("compile", "pack"),
    "peer_hits": ("compile", "received"), "peer_published": ("compile", "published"),
    "peer_unshared": ("compile", "unshared"), "peer_timeouts": ("compile", "timeouts"),
    "peer_refused": ("compile", "refused"), "autotune_tunings": ("decision", "tuned"),
    "autotune_disk_hits": ("decision", "from disk"), "autotune_pack_hits": ("decision", "from pack"),
    "autotune_memory_hits": ("decision", "memory"), "autotune_peer_hits": ("decision", "peer"),
    "autotune_skipped": ("decision", "skipped")}


@dataclasses.dataclass(frozen=True)
class KernelCacheStats:
  """What the caches did so far in this process (`kernel_cache_stats` returns one).

  Counts are since the process started; compare two readings around the calls of interest.

  Attributes:
    compiles: compiles run, by compiler ("nvrtc", "triton", "cute": each front end's, one per target arch; cache
      hits count as memory_hits, pack_hits or disk_hits). ``nvrtc_compiles``, ``triton_compiles`` and
      ``cute_compiles`` are its old, deprecated names for one compiler's count.
    store: the store's counts as one mapping, ``{kind: {event: count}}``: per kind of entry ("compile",
      "specialization", "tuning": a timing, "decision"), the tier that served each ("memory", "pack", "disk",
      "peer"), "made", and what else was counted of it (the job's "published", "unshared", "timeouts",
      "silent" (a claimant's heartbeat stopped), "stepped_aside" (a compile started ahead let a peer's claim be),
      "refused"; the key audit's "audits"; autotuning's "tuned", "from pack", "from disk", "skipped"). The names
      below (memory_hits, peer_hits, autotune_tunings, ...) read it.
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
    autotune_tunings: config spaces timed.
    autotune_disk_hits: autotuning winners found on disk instead of timed.
    autotune_memory_hits: autotuning winners found in this process instead of timed.
    autotune_skipped: calls left untuned for want of a GPU.
    tensor_map_encodes: TMA descriptors built (at a call site's first run on a device, then only when the
      buffer a descriptor describes moved).
    pack_hits: compiles served by a kernel pack (`load_pack`, ``JAX_MOSAIC_FFI_PACKS``).
    autotune_pack_hits: autotuning winners found in a kernel pack instead of timed.
    peer_hits: compiles served by another process of the ``jax.distributed`` job, which compiled them (kept in
      this process's memory, never on its disk); the job's processes share their compiles unless
      ``JAX_MOSAIC_FFI_JOB_SHARE=0``.
    peer_published: compiles this process ran and gave to the job's other processes.
    peer_unshared: compiles that could not be shared (over the size bound, not cacheable, failed), run by each
      process that needs them.
    peer_timeouts: waits for the process of the job that claimed a compile that ran past
      ``JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S`` (it died or is slow): compiled here instead.
    peer_refused: values from the job's key-value store that were not a valid entry (damaged, over the bound,
      another entry's, another kernel's): compiled here instead.
    autotune_peer_hits: autotuning decisions taken from the process of the job that timed them on a GPU of the
      same model, nothing timed here.
  """

  compiles: Mapping[str, int]
  store: Mapping[str, Mapping[str, int]]
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
  tensor_map_encodes: int = 0

  # The store's counts under their names of before the mapping (fields, so dataclasses.asdict still holds them).
  memory_hits: int = dataclasses.field(init=False, default=0)
  disk_hits: int = dataclasses.field(init=False, default=0)
  pack_hits: int = dataclasses.field(init=False, default=0)
  peer_hits: int = dataclasses.field(init=False, default=0)
  peer_published: int = dataclasses.field(init=False, default=0)
  peer_unshared: int = dataclasses.field(init=False, default=0)
  peer_timeouts: int = dataclasses.field(init=False, default=0)
  peer_refused: int = dataclasses.field(init=False, default=0)
  autotune_tunings: int = dataclasses.field(init=False, default=0)
  autotune_disk_hits: int = dataclasses.field(init=False, default=0)
  autotune_pack_hits: int = dataclasses.field(init=False, default=0)
  autotune_memory_hits: int = dataclasses.field(init=False, default=0)
  autotune_peer_hits: int = dataclasses.field(init=False, default=0)
  autotune_skipped: int = dataclasses.field(init=False, default=0)

  def __post_init__(self):
    for name, (kind, event) in _STORE_NAMES.items():
      object.__setattr__(self, name, self.store.get(kind, {}).get(event, 0))

  @property
  def nvrtc_compiles(self) -> int:
    """Deprecated: ``compiles["nvrtc"]``."""
    return self.compiles.get("nvrtc", 0)

  @property
  def triton_compiles(self) -> int:
    """Deprecated: ``compiles["triton"]``."""
    return self.compiles.get("triton", 0)

  @property
  def cute_compiles(self) -> int:
    """Deprecated: ``compiles["cute"]``."""
    return self.compiles.get("cute", 0)

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
  counts = store_stats.counts()
  # Every installed front end's compiler, at 0 until it compiles: a count to subtract from another reading.
  compiles = {name: 0 for front_end in FRONT_ENDS for name in front_end.compilers}
  compiles.update(counts.pop("compiles", {}))
  return KernelCacheStats(compiles=compiles, store=counts, **core.cache_stats())


def clear_kernel_cache(*, disk: bool = False) -> None:
  """Empties the in-memory caches (and the on-disk one with ``disk=True``).

  The compile caches (NVRTC, Triton, CuTe DSL), the autotuning timings (loaded tuning files too) and the
  runtime's parsed modules. Modules stay loaded on the GPU while a live executable uses them; they are
  unloaded when the last such executable is destroyed. The counts of `kernel_cache_stats` are kept::

    >>> jmf.clear_kernel_cache()   # the next compile reads the disk cache; disk=True empties that too
  """
  store_stack.clear_memory()
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
