"""Autotuning, for CUDA C++ and Triton kernels alike: `autotune`.

    def matmul(meta):   # one config's kernel call
      kernel = jmf.cuda_kernel(SOURCE, "matmul", options=[f"-DTILE={meta['TILE']}"])
      return jmf.mosaic_kernel(kernel, ..., grid=lambda a, b: ..., block=(meta["TILE"], meta["TILE"]))

    tuned = jmf.autotune(matmul, configs=[{"TILE": 8}, {"TILE": 16}, {"TILE": 32}])
    c = jax.jit(tuned)(a, b)

(`mosaic_kernel(..., configs=[...])`, in api.py, does the same for one kernel, Triton's
constexprs, num_warps and num_stages included.)

When: the first time a call is traced for some avals. How: every config is built (in threads: NVRTC runs in
child processes); each config that has no stored timing is compiled and timed on random inputs of the call's
shapes on the default device, after a warm-up, on the GPU's own clock (gpu_clock.py: not JAX's dispatch, not XLA's
re-recording of a graph) around a program that makes the call enough times for about 2 ms, as the median of
several rounds, the configs taking turns round by round; the winner is the fastest among the stored timings of the
current list. Timings are kept per config (tuning_records.py: keyed by the config, its kernels and launch values,
the call signature, the device, driver, jax_mosaic_ffi and toolchain releases) in memory, in kernel packs and in
the disk cache, so adding a config times that config alone, an edited kernel re-times only the configs that use
it, and a second process times nothing (its compiles are compile-cache hits). `save_tuning` / `load_tuning` carry
timings to another machine of the same GPU, packs to any (tuning_packs.py). In a jax.distributed job one process
per GPU model decides and the others take its decision (tuning_share.py). A `jax.export` artifact holds the
winner's binary alone.

Calls whose integer inputs are data (lengths, block tables) give ``inputs=`` the arrays to be timed on
(timing_inputs.py).

A single config is taken as it is (nothing is timed). A config that fails to
compile, lower or launch is skipped and reported; only failures that will
happen again (a compile error, more resources than the GPU has) are stored
with the timings, the others are timed again next time
(tuning_failures.py). Only all of them failing raises `AutotuneError`, and
a table with no config timed is never final: configs whose failures were
stored are timed again before that. Without a GPU nothing is
timed: the ``default`` config (the first, unless given) is used, with a
warning, and nothing is stored. ``JAX_MOSAIC_FFI_AUTOTUNE_LOG=1`` prints
each table; `autotune_report.report()` (``jmf.autotune_report``) returns them.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import dataclasses
import json
import os
from typing import Any, Callable, Mapping, Sequence

import jax
from jax.export import is_symbolic_dim

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import AutotuneError, NotInPacks
from jax_mosaic_ffi.transforms import timing as timing_lib
from jax_mosaic_ffi.transforms import timing_inputs
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.transforms import autotune_report
from jax_mosaic_ffi.transforms import launch_identity
from jax_mosaic_ffi.store import tuning_failures
from jax_mosaic_ffi.transforms import tuning_packs
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store import stats as store_stats
from jax_mosaic_ffi.store import tuning_records
from jax_mosaic_ffi.store import tuning_share
from jax_mosaic_ffi.transforms import tuning_environment

LOG_ENV = flags.AUTOTUNE_LOG
# For testing the machinery on a machine without a GPU: time the configs on
# the CPU too (their jax.numpy fallbacks run there).
CPU_ENV = flags.AUTOTUNE_ON_CPU
_FORMAT = "autotune-3"  # 3: a launch's identity is LaunchSpec.identity()


class AutotuneSkipped(UserWarning):
  """Autotuning did not time anything here (no GPU): a default config is used."""


@dataclasses.dataclass
class Stats:
  tunings: int = 0        # decisions that timed at least one config in this process
  configs_timed: int = 0
  disk_hits: int = 0      # decisions made from timings on disk or from a tuning file, nothing timed
  pack_hits: int = 0      # decisions made from timings a kernel pack holds, nothing timed
  memory_hits: int = 0    # winners found in this process
  peer_hits: int = 0      # decisions taken from the process of the job that timed them (tuning_share.py)
  skipped: int = 0        # no GPU: the default config, untimed


# Each field's event in the store's counts (store/stats.py): (kind, event).
_EVENTS = {"tunings": ("decision", "tuned"), "configs_timed": ("tuning", "timed"),
           "disk_hits": ("decision", "from disk"), "pack_hits": ("decision", "from pack"),
           "memory_hits": ("decision", "memory"), "peer_hits": ("decision", "peer"), "skipped": ("decision", "skipped")}


def stats() -> Stats:
  counts = store_stats.counts()
  return Stats(**{field: counts.get(kind, {}).get(event, 0) for field, (kind, event) in _EVENTS.items()})


def clear_memory_cache() -> None:
  stack.clear_memory((tuning_share.CODEC.kind, tuning_records.CODEC.kind))


def _plain_config(config) -> str:
  return json.dumps(config, sort_keys=True, default=repr)


class Autotuned:
  """A call that picks the fastest of ``configs`` for each set of input avals; `autotune` makes one.

  Call it like the kernel call it wraps (inside ``jax.jit`` or outside). The first call for some input
  shapes builds and times the configs (on a GPU); later calls reuse the winner.

  Attributes:
    factory: the function of one config that returns the kernel call: ``factory(best_config)`` is the
      winner's call, e.g. to export it.
    configs: the configs, as dicts, in order.
    name: names the call in reports and in the timings' cache key.
    last_report: the last decision's report (as `autotune_report` gives them), or None before any.
  """

  def __init__(self, factory: Callable[[dict], Callable], configs: Sequence[Mapping[str, Any]], *,
               key: Callable | None = None, default: int | Mapping | None = None, name: str | None = None,
               inputs: Callable | None = None, warmup: int = 2, rounds: int = 7):
    if not callable(factory):
      raise TypeError(f"jmf.autotune needs a function of a config that returns the kernel call, got {factory!r}")
    configs = list(configs)
    if not configs or not all(isinstance(c, Mapping) for c in configs):
      raise ValueError("jmf.autotune needs configs=[{...}, ...]: at least one config, each a dict")
    if key is not None and not callable(key):
      raise TypeError("autotune key must be a callable of the input avals returning something hashable")
    if inputs is not None and not callable(inputs):
      raise TypeError(f"autotune inputs must be a function inputs(rng, *avals) returning the arrays to time the "
                      f"configs on, got {inputs!r}")
    self.factory, self.configs, self.key, self.inputs = factory, [dict(c) for c in configs], key, inputs
    self.name = name or f"{getattr(factory, '__module__', '')}.{getattr(factory, '__qualname__', repr(factory))}"
    if default is None:
      self.default = 0
    elif isinstance(default, Mapping):
      if dict(default) not in self.configs:
        raise ValueError(f"autotune '{self.name}': default {dict(default)} is not one of the configs")
      self.default = self.configs.index(dict(default))
    elif isinstance(default, int) and 0 <= default < len(self.configs):
      self.default = default
    else:
      raise ValueError(f"autotune '{self.name}': default must be a config or its index, got {default!r}")
    self.warmup, self.rounds = warmup, rounds
    self._calls: dict[int, Callable] = {}
    self._chosen: dict[Any, int] = {}
    self.last_report: dict | None = None

  def _call_for(self, index: int) -> Callable:
    if index not in self._calls:
      call = self.factory(dict(self.configs[index]))
      if not callable(call):
        raise TypeError(f"autotune '{self.name}': the factory returned {call!r} for config {self.configs[index]}; "
                        "it must return the kernel call (a function of the input arrays)")
      self._calls[index] = call
    return self._calls[index]

  def __call__(self, *args):
    avals = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (jax.typeof(x) for x in args))
    return self._call_for(self.choose(*avals))(*args)

  def best_config(self, *avals) -> dict:
    """The config chosen for inputs of these avals (tuning now if needed): ``tuned.best_config(*avals)``."""
    return dict(self.configs[self.choose(*avals)])

  def choose(self, *avals) -> int:
    avals = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals)
    scope = self._scope(avals)
    if scope in self._chosen:
      return self._chosen[scope]
    # Its own thread: what it runs and compiles must not be staged into an enclosing trace. It names the caller's line.
    with source_location.pinned(source_location.current()):
      context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      index = pool.submit(context.run, self._decide, avals, scope).result()
    if self.last_report and self.last_report["source"] == "untuned":
      source_location.warn(f"jax_mosaic_ffi.autotune '{self.name}': no GPU here, so nothing is timed; using "
                           f"config {index} {self.configs[index]}", AutotuneSkipped)
    self._chosen[scope] = index
    return index

  def _scope(self, avals):
    if self.key is not None:
      return ("key", self.key(*avals))
    return tuple((tuple(a.shape), str(a.dtype)) for a in avals)

  def _record(self, entry: dict) -> None:
    autotune_report.record(entry)
    self.last_report = entry

  def _decide(self, avals, scope) -> int:
    shapes = [f"{a.dtype}{list(a.shape)}" for a in avals]
    if len(self.configs) == 1:  # nothing to choose: nothing compiled, timed or stored for the choice
      self._record({"name": self.name, "shapes": shapes, "source": "only config", "winner": 0,
                    "config": self.configs[0], "table": [], "timed": []})
      return 0
    device = jax.local_devices()[0]  # in a job of several processes, jax.devices()[0] may be another process's
    if device.platform not in ("gpu", "cuda") and os.environ.get(CPU_ENV) != "1":
      if tuning_packs.recording():  # every config built and its timing key noted, for a pack
        keys, launches = self._keys(avals, scope)
        tuning_packs.record(self.name, shapes, keys, [_plain_config(c) for c in self.configs], launches, self.default)
      store_stats.count("decision", "skipped")
      self._record({"name": self.name, "shapes": shapes, "source": "untuned", "winner": self.default,
                    "config": self.configs[self.default], "table": [], "timed": []})
      return self.default
    if any(is_symbolic_dim(d) for a in avals for d in a.shape):
      raise AutotuneError(
          f"autotune '{self.name}': the inputs {shapes} have symbolic dimensions (jax.export with shape "
          "polymorphism), and configs can only be timed on concrete shapes. Pick the config first "
          "(tuned.best_config(*concrete_avals)) and export the call it makes (tuned.factory(config)), "
          "or export per concrete size")
    env = tuning_environment.environment(device)
    keys, launches = self._keys(avals, scope)
    decision = disk_cache.key(_FORMAT, repr(env), repr(keys))
    here: dict = {}  # what deciding here found, where it ran

    def make() -> tuple[int, list]:
      index, table, here["timed"], here["source"] = self._decide_here(env, keys, launches, avals, device, shapes)
      return index, table
    # In memory, else (in a job of several processes) one per GPU model decides and every one of the model takes its
    # decision, else decided here.
    found = tuning_share.decide(decision, [_plain_config(c) for c in self.configs], make, env, keys)
    index, table = found.value
    if found.source == "memory":
      return index
    missing, source = here.get("timed", []), "peer" if found.source == "peer" else here["source"]
    if missing:
      store_stats.count("decision", "tuned")
    elif source == "peer" and here:  # decided here, then took the decision a peer published first
      store_stats.count("decision", "peer")
    elif source == "pack":
      store_stats.count("decision", "from pack")
    elif source in ("disk", "file"):
      store_stats.count("decision", "from disk")
    self._record({"name": self.name, "shapes": shapes, "source": source, "winner": index,
                  "config": self.configs[index], "table": table, "timed": missing})
    return index

  def _decide_here(self, env, keys, launches, avals, device, shapes) -> tuple[int, list, list, str]:
    """(the winner, the table, the configs timed now, where the timings came from), from the stored timings and
    this process's timing of the others."""
    table, sources, missing, stored_failures = [], set(), [], []
    for k, key in enumerate(keys):
      row = {"config": _plain_config(self.configs[k]), "us": None, "error": None}
      if key is None:
        row["error"] = launches[k]  # how it fails to build: nothing to time or store
      else:
        stored = tuning_records.lookup(env, key)
        # A failure that may not repeat (a record of an older version, a tuning file) is timed again.
        if stored is None or (stored[0].us is None and not tuning_failures.lasting(stored[0].error)):
          missing.append(k)
        else:
          timing, source = stored
          row["us"], row["error"] = timing.us, timing.error
          sources.add(source)
          if timing.us is None:
            stored_failures.append(k)
      table.append(row)
    if missing and packs.strict():  # timing in the middle of serving: the packs should have held these timings
      raise tuning_packs.missing(self.name, shapes, env, [table[k]["config"] for k in missing])
    if missing:
      self._tune_into(table, env, keys, avals, device, missing)
    if stored_failures and not any(row["us"] is not None for row in table):
      # No timing at all is never final: failures read from storage are tried again before giving up.
      self._tune_into(table, env, keys, avals, device, stored_failures)
      missing = sorted(missing + stored_failures)
    timed = [k for k, row in enumerate(table) if row["us"] is not None]
    if not timed:
      rows = "\n".join(f"  {k}: {row['config']}: {row['error']}" for k, row in enumerate(table))
      raise AutotuneError(f"autotune '{self.name}': no config could be compiled and run for {shapes}:\n{rows}")
    index = min(timed, key=lambda k: table[k]["us"])
    source = ("tuned" if missing else next((s for s in ("pack", "file", "disk") if s in sources), "memory"))
    return index, table, missing, source

  def _tune_into(self, table, env, keys, avals, device, indices: list[int]) -> None:
    """Times configs `indices` into `table`; keeps each timing, and each failure that will repeat."""
    for k, timing in self._tune(avals, device, indices).items():
      table[k]["us"], table[k]["error"] = timing.us, timing.error
      if timing.us is not None or tuning_failures.lasting(timing.error):
        tuning_records.store(env, keys[k], timing)

  def _keys(self, avals, scope) -> tuple[list, list]:
    """Each config's timing key (None for one that fails to build), and what each launches or how it fails."""
    signature = tuning_records.bounded_text(tuning_records.exact_text(scope) + timing_inputs.tag(self.inputs))
    workers = max(1, min(len(self.configs), os.cpu_count() or 1, 8))
    # Each process of a job starts at its own place in the list: the job's processes claim and compile different
    # configs at once (job_share.py) instead of all waiting for the one that claimed the first.
    order = tuning_share.rotation(len(self.configs))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      built = dict(zip(order, pool.map(lambda k: self._launches(k, avals), order)))
    launches = [built[k] for k in range(len(self.configs))]
    # A config by its JSON text (tuning files show it): a value that prints alike (a long array) is still told
    # apart, as the timing is keyed by the kernels' hashes and the launch values the config makes too.
    return [tuning_records.TimingKey(self.name, _plain_config(c), found, signature) if isinstance(found, tuple)
            else None for c, found in zip(self.configs, launches)], launches

  def _launches(self, index: int, avals) -> tuple[str, ...] | str:
    """What config `index` launches (its kernels and their launch values), or how it fails to build."""
    try:
      return tuple(launch_identity.of_jaxpr(jax.make_jaxpr(self._call_for(index))(*avals)))
    except NotInPacks:  # the strict mode's error is the program's, not one config's failure
      raise
    except Exception as e:
      return f"compile: {tuning_failures.error_text(e)}"

  def _tune(self, avals, device, indices: list[int]) -> dict[int, tuning_records.Timing]:
    """Times the configs `indices`; a config that fails to build or run gets its error instead."""
    make_inputs = timing_inputs.maker(self.inputs, self.name)
    timings = timing_lib.time_configs(self._call_for, avals, device, indices, warmup=self.warmup, rounds=self.rounds,
                                      make_inputs=make_inputs)
    store_stats.count("tuning", "timed", sum(timing.us is not None for timing in timings.values()))
    return timings


def autotune(factory: Callable[[dict], Callable] | None = None, *, configs: Sequence[Mapping[str, Any]],
             key: Callable | None = None, default: int | Mapping | None = None, name: str | None = None,
             inputs: Callable | None = None, warmup: int = 2, rounds: int = 7):
  """Picks the fastest config of a kernel call per input shapes, timed on the GPU and kept on disk.

  The first time the call is traced for some input avals, every config is built (compiles in parallel) and
  timed on random inputs of those shapes, on the GPU's own clock; the fastest is used from then on. Each
  config's timing is kept in memory and in the disk cache (keyed by the config, its kernels' code and launch
  values, the shapes, the device, driver and versions), so adding a config times that config alone and a
  second process times nothing; `save_tuning` / `load_tuning` carry timings to another machine. A config
  that fails is skipped and reported (`AutotuneError` when all do). Without a GPU nothing is timed: the
  ``default`` config is used, with an ``AutotuneSkipped`` warning. ``JAX_MOSAIC_FFI_AUTOTUNE_LOG=1`` prints
  each decision's table; `autotune_report` returns them (:doc:`autotuning </guides/autotuning>`)::

    >>> source = '''
    ... extern "C" __global__ void double_items(const float* x, float* y, int n) {
    ...   int first = (blockIdx.x * blockDim.x + threadIdx.x) * ITEMS;
    ...   for (int k = 0; k < ITEMS; ++k) if (first + k < n) y[first + k] = 2.0f * x[first + k];
    ... }'''
    >>> @jmf.autotune(configs=[dict(BLOCK=128, ITEMS=1), dict(BLOCK=256, ITEMS=4)])
    ... def double_items(meta):     # the call for one config
    ...   kernel = jmf.cuda_kernel(source, "double_items", options=[f"-DITEMS={meta['ITEMS']}"])
    ...   return jmf.mosaic_kernel(kernel, lambda x: x, block=meta["BLOCK"],
    ...                            grid=lambda x: jmf.cdiv(x.size, meta["BLOCK"] * meta["ITEMS"]),
    ...                            scalars=lambda x: (np.int32(x.size),), fallback=lambda x: 2 * x)
    >>> jax.jit(double_items)(jnp.ones(4096))[:2].tolist()    # on a GPU: both configs timed first
    [2.0, 2.0]

  ``mosaic_kernel(..., configs=[...])`` does the same for one kernel, without a factory.

  Args:
    factory: a function of one config (a dict) returning the kernel call for
      it (what `mosaic_kernel` returns). Usable as a decorator.
    configs: the dicts to try: template arguments or ``-D`` values (CUDA
      C++), constexprs, ``num_warps``, ``num_stages`` (Triton), and whatever
      the grid, block and shared memory are computed from.
    key: a function of the input avals whose value scopes the winner instead
      of the exact shapes and dtypes (e.g. a size bucket).
    default: the config (or its index) used where nothing can be timed.
    name: names the call in reports and in the winner's cache key (default:
      the factory's qualified name).
    inputs: ``inputs(rng, *avals)`` -> the arrays to time the configs on, one
      per aval, of its shape and dtype (``rng``: a numpy Generator, seeded
      alike in every process), for calls whose integer inputs are data
      (lengths, block tables, indices) that random values would make
      meaningless (as `check`'s ``inputs=``); default: normal floats,
      integers in [0, 4).

  Returns:
    An `Autotuned` call (or, without ``factory``, a decorator that makes one).
  """
  if factory is None:
    return lambda f: Autotuned(f, configs, key=key, default=default, name=name, inputs=inputs, warmup=warmup,
                               rounds=rounds)
  return Autotuned(factory, configs, key=key, default=default, name=name, inputs=inputs, warmup=warmup,
                   rounds=rounds)
