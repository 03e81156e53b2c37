"""Autotuning, for CUDA C++ and Triton kernels alike: `autotune`.

    def matmul(meta):   # one config's kernel call
      kernel = jmf.cuda_kernel(SOURCE, "matmul", options=[f"-DTILE={meta['TILE']}"])
      return jmf.mosaic_kernel(kernel, ..., grid=lambda a, b: ..., block=(meta["TILE"], meta["TILE"]))

    tuned = jmf.autotune(matmul, configs=[{"TILE": 8}, {"TILE": 16}, {"TILE": 32}])
    c = jax.jit(tuned)(a, b)

(`mosaic_kernel(..., configs=[...])`, in api.py, does the same for one kernel, Triton's
constexprs, num_warps and num_stages included.)

When: the first time a call is traced for some avals. How: every config is
built and compiled (in threads: NVRTC runs in child processes), then each
is timed on random inputs of the call's shapes on the default device, after
a warm-up, as the median of several rounds of back-to-back calls. The
winner is kept per (name, configs, shapes and dtypes or ``key``, the
kernels of every config, device name, driver, NVRTC and Triton) in memory
and in the disk cache, so a second process times nothing (its compiles are
compile-cache hits) and an edited kernel in any config is tuned again; a
`jax.export` artifact holds the winner's binary alone.

A config that fails to compile, lower or launch is skipped and reported;
only all of them failing raises `AutotuneError`. Without a GPU nothing is
timed: the ``default`` config (the first, unless given) is used, with a
warning, and nothing is stored. ``JAX_MOSAIC_FFI_AUTOTUNE_LOG=1`` prints
each table; `report()` returns them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import AutotuneError
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p
from jax_mosaic_ffi.toolchain.nvrtc import compiler

LOG_ENV = flags.AUTOTUNE_LOG
# For testing the machinery on a machine without a GPU: time the configs on
# the CPU too (their jax.numpy fallbacks run there).
CPU_ENV = flags.AUTOTUNE_ON_CPU
_FORMAT = "autotune-1"


class AutotuneSkipped(UserWarning):
  """Autotuning did not time anything here (no GPU): a default config is used."""


@dataclasses.dataclass
class Stats:
  tunings: int = 0        # configs spaces timed in this process
  configs_timed: int = 0
  disk_hits: int = 0      # winners read from the disk cache
  memory_hits: int = 0    # winners found in this process
  skipped: int = 0        # no GPU: the default config, untimed


_stats = Stats()
_lock = threading.Lock()
_winners: dict[str, int] = {}
_reports: list[dict] = []


def stats() -> Stats:
  with _lock:
    return dataclasses.replace(_stats)


def clear_memory_cache() -> None:
  with _lock:
    _winners.clear()


def report() -> list[dict]:
  """Every autotuning decision of this process, oldest first: {"name", "shapes",
  "source" ("tuned", "disk", "untuned"), "winner", "config", "table"}; each table
  row is {"config", "us" (median per call, or None), "error"}."""
  with _lock:
    return [dict(r) for r in _reports]


def _plain_config(config) -> str:
  return json.dumps(config, sort_keys=True, default=repr)


def _toolkits() -> list[str]:
  parts = [compiler.nvrtc_identity()]
  try:
    import triton  # noqa: PLC0415  (optional: Triton may not be installed)
    parts.append(f"triton {triton.__version__}")
  except ImportError:
    parts.append("no triton")
  return parts


def _kernel_hashes(jaxpr) -> list[str]:
  """The module hashes of the mosaic_kernel calls in a jaxpr, sub-jaxprs included."""
  found = []

  def walk(j):
    for eqn in j.eqns:
      if eqn.primitive is mosaic_kernel_p:
        found.append(eqn.params["kernel"].hash.hex())
      for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else (value,):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner)
  walk(jaxpr.jaxpr)
  return found


def _random_inputs(avals, device):
  rng = np.random.default_rng(0)
  arrays = []
  for aval in avals:
    dtype = np.dtype(aval.dtype)
    if dtype.kind == "f" or dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
      data = rng.standard_normal(aval.shape, dtype=np.float32).astype(dtype)
    elif dtype.kind in "iu":
      data = rng.integers(0, 4, aval.shape).astype(dtype)
    elif dtype.kind == "b":
      data = rng.integers(0, 2, aval.shape).astype(bool)
    else:
      data = np.zeros(aval.shape, dtype)
    arrays.append(jax.device_put(data, device))
  return arrays


def _time(executable, inputs, *, warmup: int = 2, rounds: int = 7, round_s: float = 2e-3) -> float:
  """Median seconds per call: rounds of back-to-back calls, each round long enough to hide dispatch."""
  for _ in range(warmup):
    jax.block_until_ready(executable(*inputs))
  start = time.perf_counter()
  jax.block_until_ready(executable(*inputs))
  once = max(time.perf_counter() - start, 1e-6)
  reps = int(min(max(round_s / once, 1), 200))
  samples = []
  for _ in range(rounds):
    start = time.perf_counter()
    out = None
    for _ in range(reps):
      out = executable(*inputs)
    jax.block_until_ready(out)
    samples.append((time.perf_counter() - start) / reps)
  return statistics.median(samples)


def _error_text(e: BaseException) -> str:
  text = f"{type(e).__name__}: {e}".strip()
  return text.splitlines()[0][:300] if text else type(e).__name__


def _log(entry: dict) -> None:
  if os.environ.get(LOG_ENV, "").strip().lower() in ("", "0", "off", "false"):
    return
  lines = [f"jax_mosaic_ffi autotune '{entry['name']}' {entry['shapes']}: {entry['source']}, "
           f"winner config {entry['winner']} {entry['config']}"]
  for k, row in enumerate(entry["table"]):
    mark = "*" if k == entry["winner"] else " "
    time_text = f"{row['us']:10.2f} us" if row.get("us") is not None else "    failed   "
    lines.append(f" {mark} {k:3d} {time_text}  {row['config']}" + (f"  ({row['error']})" if row.get("error") else ""))
  print("\n".join(lines), file=sys.stderr, flush=True)


class Autotuned:
  """A call that picks the fastest of ``configs`` for each set of input avals."""

  def __init__(self, factory: Callable[[dict], Callable], configs: Sequence[Mapping[str, Any]], *,
               key: Callable | None = None, default: int | Mapping | None = None, name: str | None = None,
               warmup: int = 2, rounds: int = 7):
    if not callable(factory):
      raise TypeError(f"jmf.autotune needs a function of a config that returns the kernel call, got {factory!r}")
    configs = list(configs)
    if not configs or not all(isinstance(c, Mapping) for c in configs):
      raise ValueError("jmf.autotune needs configs=[{...}, ...]: at least one config, each a dict")
    if key is not None and not callable(key):
      raise TypeError("autotune key must be a callable of the input avals returning something hashable")
    self.factory, self.configs, self.key = factory, [dict(c) for c in configs], key
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
    """The config chosen for inputs of these avals (tuning now if needed)."""
    return dict(self.configs[self.choose(*avals)])

  def choose(self, *avals) -> int:
    avals = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals)
    scope = self._scope(avals)
    if scope in self._chosen:
      return self._chosen[scope]
    # Its own thread: what it runs and compiles must not be staged into an enclosing trace.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      index = pool.submit(self._decide, avals, scope).result()
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
    with _lock:
      _reports.append(entry)
    self.last_report = entry
    _log(entry)

  def _decide(self, avals, scope) -> int:
    shapes = [f"{a.dtype}{list(a.shape)}" for a in avals]
    device = jax.devices()[0]
    if device.platform not in ("gpu", "cuda") and os.environ.get(CPU_ENV) != "1":
      with _lock:
        _stats.skipped += 1
      self._record({"name": self.name, "shapes": shapes, "source": "untuned", "winner": self.default,
                    "config": self.configs[self.default], "table": []})
      return self.default
    entry_key = self._disk_key(avals, scope, device)
    with _lock:
      if entry_key in _winners:
        _stats.memory_hits += 1
        return _winners[entry_key]
    stored = self._load(entry_key)
    if stored is not None:
      index, table = stored
      with _lock:
        _stats.disk_hits += 1
        _winners[entry_key] = index
      self._record({"name": self.name, "shapes": shapes, "source": "disk", "winner": index,
                    "config": self.configs[index], "table": table})
      return index
    index, table = self._tune(avals, device)
    with _lock:
      _stats.tunings += 1
      _winners[entry_key] = index
    disk_cache.store(entry_key, json.dumps({"index": index, "config": _plain_config(self.configs[index]),
                                            "table": table}).encode())
    self._record({"name": self.name, "shapes": shapes, "source": "tuned", "winner": index,
                  "config": self.configs[index], "table": table})
    return index

  def _identity(self, index: int, avals) -> str:
    """Config `index`'s kernels (their module hashes), or how it fails to build."""
    try:
      return " ".join(_kernel_hashes(jax.make_jaxpr(self._call_for(index))(*avals)))
    except Exception as e:
      return f"fails: {type(e).__name__}"

  def _disk_key(self, avals, scope, device) -> str:
    # Every config's kernels, not one config's: an edit to any of them may change the winner.
    workers = max(1, min(len(self.configs), os.cpu_count() or 1, 8))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      identity = list(pool.map(lambda k: f"config {k}: {self._identity(k, avals)}", range(len(self.configs))))
    return disk_cache.key(
        _FORMAT, f"format{module_format.FORMAT_VERSION}", self.name,
        json.dumps([_plain_config(c) for c in self.configs]), repr(scope),
        *identity, getattr(device, "device_kind", device.platform), gpu_info.driver_version(), *_toolkits())

  def _load(self, entry_key: str):
    return disk_cache.load_decoded(entry_key, self._decode)

  def _decode(self, data: bytes):
    stored = json.loads(data)
    index = stored["index"]
    if not (isinstance(index, int) and 0 <= index < len(self.configs)) or \
        stored["config"] != _plain_config(self.configs[index]):
      return None
    table = stored.get("table", [])
    if not isinstance(table, list) or len(table) != len(self.configs):
      raise ValueError("bad table")
    return index, table

  def _tune(self, avals, device):
    def build(index):
      return jax.jit(self._call_for(index)).lower(*avals).compile()

    workers = max(1, min(len(self.configs), os.cpu_count() or 1, 8))
    executables, table = {}, []
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      futures = [pool.submit(build, k) for k in range(len(self.configs))]
      for k, future in enumerate(futures):
        try:
          executables[k] = future.result()
          table.append({"config": _plain_config(self.configs[k]), "us": None, "error": None})
        except Exception as e:
          table.append({"config": _plain_config(self.configs[k]), "us": None, "error": f"compile: {_error_text(e)}"})
    inputs = _random_inputs(avals, device)
    for k, executable in executables.items():
      try:
        table[k]["us"] = _time(executable, inputs, warmup=self.warmup, rounds=self.rounds) * 1e6
        with _lock:
          _stats.configs_timed += 1
      except Exception as e:
        table[k]["error"] = f"launch: {_error_text(e)}"
    timed = [k for k, row in enumerate(table) if row["us"] is not None]
    if not timed:
      rows = "\n".join(f"  {k}: {row['config']}: {row['error']}" for k, row in enumerate(table))
      raise AutotuneError(f"autotune '{self.name}': no config could be compiled and run for "
                          f"{[f'{a.dtype}{list(a.shape)}' for a in avals]}:\n{rows}")
    return min(timed, key=lambda k: table[k]["us"]), table


def autotune(factory: Callable[[dict], Callable] | None = None, *, configs: Sequence[Mapping[str, Any]],
             key: Callable | None = None, default: int | Mapping | None = None, name: str | None = None,
             warmup: int = 2, rounds: int = 7):
  """Picks the fastest config of a kernel call per input shapes (module doc).

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
  """
  if factory is None:
    return lambda f: Autotuned(f, configs, key=key, default=default, name=name, warmup=warmup, rounds=rounds)
  return Autotuned(factory, configs, key=key, default=default, name=name, warmup=warmup, rounds=rounds)
