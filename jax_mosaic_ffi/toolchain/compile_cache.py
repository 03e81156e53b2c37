"""The in-memory compile cache, shared by every compiler (NVRTC, Triton) and what a compile is decided from
(Triton's specialization of a call): one LRU, one stats object.

A compile is looked up first here, then on disk (`disk_cache`, under the same key), and only then run; its
result goes to both. The key is the compiler's: everything that changes the binary, hashed. A compiler whose
result can go stale while cached (headers read from disk) gives ``fresh``, asked on every memory hit.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Callable, TypeVar

from jax_mosaic_ffi.base import disk_cache

_MEMORY_CACHE_SIZE = 512

_T = TypeVar("_T")


@dataclasses.dataclass
class CompileStats:
  compiles: dict[str, int] = dataclasses.field(default_factory=dict)  # by compiler, one per target arch
  memory_hits: int = 0      # compiles served by this cache
  disk_hits: int = 0        # compiles served by the disk cache


_stats = CompileStats()
_lock = threading.Lock()
_memory: collections.OrderedDict[str, Any] = collections.OrderedDict()


def stats() -> CompileStats:
  with _lock:
    return dataclasses.replace(_stats, compiles=dict(_stats.compiles))


def clear_memory_cache() -> None:
  with _lock:
    _memory.clear()


def count_compiles(compiler: str, n: int) -> None:
  """``n`` compiles run by ``compiler`` (a front end's name for it: "nvrtc", "triton", "cute")."""
  with _lock:
    _stats.compiles[compiler] = _stats.compiles.get(compiler, 0) + n


@dataclasses.dataclass(frozen=True)
class Found:
  value: Any
  source: str  # "memory", "disk" or "compiled"


def cached(entry_key: str, *, compile: Callable[[], tuple[_T, bool]], encode: Callable[[_T], bytes | None],
           decode: Callable[[bytes], _T | None], fresh: Callable[[_T], bool] | None = None,
           counted: bool = True) -> Found:
  """The compile of ``entry_key``: from memory, else from disk (``decode``; None refuses an entry), else
  ``compile()``, which returns (result, cacheable): a result that cannot be checked later for staleness
  is cached nowhere. ``encode`` may return None for a result that can be kept in memory only. Hits of an
  entry that is not a compile (``counted=False``: a specialization) are not counted as compiles served."""
  with _lock:
    value = _memory.get(entry_key)
  if value is not None and (fresh is None or fresh(value)):
    with _lock:
      if entry_key in _memory:
        _memory.move_to_end(entry_key)
      _stats.memory_hits += counted
    return Found(value, "memory")
  # Not in memory, or stale there: the disk entry if it is fresh, else a compile, whose entry replaces it.
  value = disk_cache.load_decoded(entry_key, decode)
  if value is not None:
    with _lock:
      _stats.disk_hits += counted
    source = "disk"
  else:
    value, cacheable = compile()
    if not cacheable:
      return Found(value, "compiled")
    data = encode(value)
    if data is not None:
      disk_cache.store(entry_key, data)
    source = "compiled"
  with _lock:
    _memory[entry_key] = value
    _memory.move_to_end(entry_key)
    while len(_memory) > _MEMORY_CACHE_SIZE:
      _memory.popitem(last=False)
  return Found(value, source)
