"""The in-memory compile cache, shared by every compiler (NVRTC, Triton) and what a compile is decided from
(Triton's specialization of a call): one LRU, one stats object.

A compile is looked up first here, then on disk (`disk_cache`, under the same key), and only then run; its
result goes to both. The key is the compiler's: everything that changes the binary, hashed. A compiler whose
result can go stale while cached (headers read from disk) gives ``fresh``, asked on every memory hit. A compile
gives its `key_audit.Witness` (its IR, made on demand), which ``JAX_MOSAIC_FFI_KEY_AUDIT=1`` checks every hit
against.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Callable, TypeVar

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.toolchain import key_audit

_MEMORY_CACHE_SIZE = 512

_T = TypeVar("_T")


@dataclasses.dataclass
class CompileStats:
  compiles: dict[str, int] = dataclasses.field(default_factory=dict)  # by compiler, one per target arch
  memory_hits: int = 0      # compiles served by this cache
  disk_hits: int = 0        # compiles served by the disk cache
  audits: int = 0           # compiles served and proven against the compiler's IR (JAX_MOSAIC_FFI_KEY_AUDIT=1)


_stats = CompileStats()
_lock = threading.Lock()
_memory: collections.OrderedDict[str, Any] = collections.OrderedDict()


def stats() -> CompileStats:
  with _lock:
    return dataclasses.replace(_stats, compiles=dict(_stats.compiles))


def clear_memory_cache() -> None:
  with _lock:
    dropped = list(_memory)
    _memory.clear()
  key_audit.forget(dropped)


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
           counted: bool = True, witness: key_audit.Witness | None = None) -> Found:
  """The compile of ``entry_key``: from memory, else from disk (``decode``; None refuses an entry), else
  ``compile()``, which returns (result, cacheable): a result that cannot be checked later for staleness
  is cached nowhere. ``encode`` may return None for a result that can be kept in memory only. Hits of an
  entry that is not a compile (``counted=False``: a specialization) are not counted as compiles served.
  ``witness``: what the compile is made from, which the key audit proves each hit against (key_audit.py)."""
  audit = witness is not None and key_audit.on()
  with _lock:
    value = _memory.get(entry_key)
  if value is not None and (fresh is None or fresh(value)) and (not audit or _audited(entry_key, witness, value,
                                                                                      "memory", counted)):
    with _lock:
      if entry_key in _memory:
        _memory.move_to_end(entry_key)
      _stats.memory_hits += counted
    return Found(value, "memory")
  # Not in memory, or stale there: the disk entry if it is fresh, else a compile, whose entry replaces it.
  value = disk_cache.load_decoded(entry_key, decode)
  if value is not None and (not audit or _audited(entry_key, witness, value, "disk", counted)):
    with _lock:
      _stats.disk_hits += counted
    source = "disk"
  else:
    value, cacheable = compile()
    if not cacheable:
      return Found(value, "compiled")
    if audit:
      key_audit.record(entry_key, witness, value)
    data = encode(value)
    if data is not None:
      disk_cache.store(entry_key, data)
    source = "compiled"
  with _lock:
    _memory[entry_key] = value
    _memory.move_to_end(entry_key)
    dropped = []
    while len(_memory) > _MEMORY_CACHE_SIZE:
      dropped.append(_memory.popitem(last=False)[0])
  key_audit.forget(dropped)
  return Found(value, source)


def _audited(entry_key: str, witness: key_audit.Witness, value, source: str, counted: bool) -> bool:
  proven = key_audit.check(entry_key, witness, value, source)
  if proven:
    with _lock:
      _stats.audits += counted
  return proven
