"""The in-memory compile cache, shared by every compiler (NVRTC, Triton) and what a compile is decided from
(Triton's specialization of a call): one LRU, one stats object.

A compile is looked up first here, then in the kernel packs in use (`packs`), then on disk (`disk_cache`, under
the same key), then, in a job of several processes, taken from the process of the job that compiled it
(`job_share`: one compiles, the others wait for its entry), and only then run; its result goes to memory and disk
(and to the job's other processes). Under ``JAX_MOSAIC_FFI_PACKS_STRICT=1`` a
compile the packs do not hold raises `NotInPacks` instead. Under ``JAX_MOSAIC_FFI_PACK_RECORD``, every entry used
is recorded for a pack (`pack_record`), with what the front end's ``about`` says of it. The key is the compiler's:
everything that changes the binary, hashed. A compiler whose result can go stale while cached (headers read from
disk) gives ``fresh``, asked on every memory hit. A compile gives its `key_audit.Witness` (its IR, made on demand),
which ``JAX_MOSAIC_FFI_KEY_AUDIT=1`` checks every hit against; a pack's entry carries none, so under the audit it
is compiled again (and witnessed) even in strict mode, which refuses only a compile the packs do not hold. A peer's
entry carries none either: under the audit nothing is shared, and under the strict mode a peer's entry is a
compile (refused before it is asked for), never a pack's.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from typing import Any, Callable, Mapping, TypeVar

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.store import job_share
from jax_mosaic_ffi.store import key_audit
from jax_mosaic_ffi.store import pack_record
from jax_mosaic_ffi.toolchain.compiled import Compiled
from jax_mosaic_ffi.store import packs

_MEMORY_CACHE_SIZE = 512

_T = TypeVar("_T")


@dataclasses.dataclass
class CompileStats:
  compiles: dict[str, int] = dataclasses.field(default_factory=dict)  # by compiler, one per target arch
  memory_hits: int = 0      # compiles served by this cache
  disk_hits: int = 0        # compiles served by the disk cache
  pack_hits: int = 0        # compiles served by a kernel pack
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
  source: str  # "memory", "pack", "disk", "peer" (another process of the job compiled it) or "compiled"


@dataclasses.dataclass(frozen=True)
class Portable:
  """How an entry goes into a pack and comes out on another machine, where that differs from the disk cache's
  encode / decode (an NVRTC entry names the headers it read by this machine's paths: cuda/nvrtc/portable.py).
  ``decode`` raises ValueError saying why an entry does not apply here."""

  encode: Callable[[Any], bytes | None]
  decode: Callable[[bytes], Any]


def cached(entry_key: str, *, compile: Callable[[], tuple[_T, bool]], encode: Callable[[_T], bytes | None],
           decode: Callable[[bytes], _T | None], fresh: Callable[[_T], bool] | None = None,
           counted: bool = True, witness: key_audit.Witness | None = None,
           about: Callable[[], Mapping[str, Any]] | None = None, portable: Portable | None = None) -> Found:
  """The compile of ``entry_key``: from memory, else from a kernel pack, else from disk (``decode``; None refuses
  an entry), else ``compile()``, which returns (result, cacheable): a result that cannot be checked later for
  staleness is cached nowhere. ``encode`` may return None for a result that can be kept in memory only. Hits of an
  entry that is not a compile (``counted=False``: a specialization) are not counted as compiles served, and the
  strict mode does not require them in a pack. ``witness``: what the compile is made from, which the key audit
  proves each hit against (key_audit.py). ``about``: what the front end says of the compile (kernel, front_end,
  specialization, targets, toolchain), asked only to record it or to name it in an error. ``portable``: its pack
  form, where it is not ``encode`` / ``decode``'s."""
  audit = witness is not None and key_audit.on()
  kind = "compile" if counted else "specialization"
  with _lock:
    value = _memory.get(entry_key)
  if value is not None and (fresh is None or fresh(value)) and (not audit or _audited(entry_key, witness, value,
                                                                                      "memory", counted)):
    with _lock:
      if entry_key in _memory:
        _memory.move_to_end(entry_key)
      _stats.memory_hits += counted
    _record(entry_key, kind, value, encode, portable, about)
    return Found(value, "memory")
  # Not in memory, or stale there: a pack's entry, else the disk entry if it is fresh, else a compile, whose entry
  # replaces it.
  value, why = _from_packs(entry_key, kind, decode if portable is None else portable.decode)
  if value is not None and (not audit or _audited(entry_key, witness, value, "pack", counted)):
    with _lock:
      _stats.pack_hits += counted
    source = "pack"
  elif counted and value is None and packs.strict():
    # A pack's entry the audit could not prove (a pack carries no witness) is in the packs: it is compiled again
    # below, the audit's proof, as a disk entry made without the audit is; strict mode refuses only what is missing.
    raise packs.missing(packs.with_call_site(about, source_location.current()), why)
  elif (value := disk_cache.load_decoded(entry_key, decode)) is not None and (
      not audit or _audited(entry_key, witness, value, "disk", counted)):
    with _lock:
      _stats.disk_hits += counted
    source = "disk"
  else:
    # Missing here: in a multi-process job, one process compiles it and the others take its entry (job_share.py).
    # Not under the key audit: a peer's entry carries no witness, so each process would compile it again anyway.
    shared = counted and not audit
    turn = job_share.turn("compile", entry_key) if shared else job_share.Turn("compile", entry_key)
    value = _from_peer(turn, decode if portable is None else portable.decode)
    if value is not None:
      data = encode(value)
      if data is not None:  # kept on this machine's disk, as a compile's entry would be
        disk_cache.store(entry_key, data)
      source = "peer"
    else:
      try:
        value, cacheable = _compiled(compile, about)
      except BaseException:
        turn.decline()
        raise
      if not cacheable:
        turn.decline()
        if pack_record.on():
          _note_unpackable(about, "what the compile read is not known, so it is cached nowhere")
        return Found(value, "compiled")
      if audit:
        key_audit.record(entry_key, witness)
      data = encode(value)
      if data is not None:
        disk_cache.store(entry_key, data)
      if turn.shared:
        turn.publish(data if portable is None else portable.encode(value))
      source = "compiled"
  _record(entry_key, kind, value, encode, portable, about)
  with _lock:
    _memory[entry_key] = value
    _memory.move_to_end(entry_key)
    dropped = []
    while len(_memory) > _MEMORY_CACHE_SIZE:
      dropped.append(_memory.popitem(last=False)[0])
  key_audit.forget(dropped)
  return Found(value, source)


def _from_peer(turn: job_share.Turn, decode: Callable[[bytes], Any]):
  """The value of the entry a peer of the job published, or None (none, or refused: compiled here). A peer's entry
  is read as a pack's, in its portable form."""
  if turn.payload is None:
    return None
  try:
    value = decode(turn.payload)
  except Exception:  # noqa: BLE001 - a peer's entry that does not apply here (an NVRTC header that differs)
    value = None
  if value is None:
    job_share.refused(turn)
    return None
  return value


def _audited(entry_key: str, witness: key_audit.Witness, value, source: str, counted: bool) -> bool:
  proven = key_audit.check(entry_key, witness, value, source)
  if proven:
    with _lock:
      _stats.audits += counted
  return proven


def _from_packs(entry_key: str, kind: str, decode: Callable[[bytes], Any]) -> tuple[Any, str]:
  """(the value a pack in use holds for ``entry_key``, or None; why a pack's entry does not apply here, or "")."""
  entry = packs.lookup(entry_key, kind)
  if entry is None:
    return None, ""
  try:
    value = decode(entry.payload)
  except Exception as e:  # an entry that does not apply here (an NVRTC header that differs): compiled instead
    return None, f"its entry does not apply here: {e}"
  return value, "" if value is not None else "its entry does not apply here"


def _compiled(compile: Callable[[], tuple[Any, bool]], about) -> tuple[Any, bool]:
  with noted(about):
    return compile()


@contextlib.contextmanager
def noted(about: Callable[[], Mapping[str, Any]] | None):
  """While recording for a pack, a failure inside (a front end that cannot target an arch) is noted with what
  ``about`` says of the compile, then raised as it was; so is a crash that ends the process (a note made before)."""
  if not pack_record.on():
    yield
    return
  found = packs.with_call_site(about, source_location.current())
  running = pack_record.compiling(found)
  try:
    yield
  except Exception as e:
    pack_record.note("failed", {**found, "error": f"{type(e).__name__}: {str(e)[:2000]}"})
    raise
  finally:
    pack_record.compiled(running)


def _record(entry_key: str, kind: str, value, encode, portable: Portable | None, about) -> None:
  if not pack_record.on() or pack_record.written(entry_key):
    return
  data = (encode if portable is None else portable.encode)(value)
  if data is None:
    if kind == "compile":  # a specialization that cannot be written is only answered again on the node
      _note_unpackable(about, "it is kept in memory only (its values cannot be written)")
    return
  compiled = value if isinstance(value, Compiled) else getattr(value, "compiled", None)  # every front end's holds one
  images = {"images": compiled.image_names()} if isinstance(compiled, Compiled) else {}
  pack_record.entry(entry_key, kind, data, {**packs.with_call_site(about, source_location.current()), **images})


def driver_compiled(about: Callable[[], Mapping[str, Any]], why: str, fix: str) -> None:
  """A kernel the driver compiles where it is loaded (PTX), which no pack can hold: recorded as refused (``pack
  check`` fails on it), and in the strict mode an error saying ``why`` and ``fix``; checked as each is made."""
  if pack_record.on():
    _note_unpackable(about, why)
  if packs.strict():
    raise packs.missing(packs.with_call_site(about, source_location.current()), why, doing="JIT-compiling it",
                        fix=fix)


def _note_unpackable(about, why: str) -> None:
  pack_record.note("failed", {**packs.with_call_site(about, source_location.current()),
                              "error": f"not packable: {why}"})
