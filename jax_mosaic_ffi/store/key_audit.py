"""The key audit: every compile-cache hit proven against the compiler's own input (``JAX_MOSAIC_FFI_KEY_AUDIT=1``).

A compile key is fast because it reads the user's Python (base/value_key.py) instead of tracing it. What decides
the kernel is what the trace makes: Triton's and Gluon's TTIR, the CuTe DSL's MLIR. Under the audit each compile
also stores that IR (its `Witness`) beside its entry, in memory and on disk, and each hit makes this call's IR and
compares: a hit of an entry made from other IR raises `KeyAuditError` with the first line that differs and what the
key read. NVRTC has no preprocess-only mode to give its input, so its witness is its output: a hit compiles again
and compares the PTX (the cubins' digests for a kernel linked with NVSHMEM, which has none).

An entry stored without the audit has no witness: under it, such a hit is compiled again (and witnessed), never
trusted; so is a kernel pack's entry (a pack carries no witness), which strict mode allows (compile_cache.py).
The audit costs a trace (or an NVRTC compile) per hit; it is for tests and CI, not for production.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import re
import threading
import zlib
from typing import Any, Callable

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base.errors import KeyAuditError
from jax_mosaic_ffi.store import stats
from jax_mosaic_ffi.store.entries import Observer, own

_MAX_WITNESS_BYTES = 64 << 20
# Witnesses kept in memory, the oldest dropped first (each is also on disk).
_MAX_IN_MEMORY = 1024
# A location's file: the same code at another path is the same kernel (keys leave paths out, base/code_key.py).
_LOCATION_FILE = re.compile(r'loc\("(?:[^"]*/)?([^"/]*)":')


def on() -> bool:
  """Whether the audit is on; ValueError for a value that is neither on nor off."""
  return flags.switch(flags.KEY_AUDIT, False, on="audit every compile-cache hit against the compiler's IR",
                      off="no audit, as when it is unset")


@dataclasses.dataclass(frozen=True)
class Witness:
  """What a compile was made from, as the audit compares it.

  Attributes:
    kind: its name in messages ("TTIR", "CuTe DSL MLIR", "PTX").
    now: this call's, made on demand (a trace; for NVRTC a compile).
    of: the witness a compiled value carries in itself (NVRTC's PTX), or None: stored beside the entry.
    what: the kernel, as the error names it.
    read: what the fast key read of the user's values, as the error names it.
  """

  kind: str
  now: Callable[[], str]
  of: Callable[[Any], str | None] | None = None
  what: str = "the kernel"
  read: str = ""


_lock = threading.Lock()
_memory: collections.OrderedDict[str, str] = collections.OrderedDict()  # entry key -> witness, compiled here


def _disk_key(entry_key: str) -> str:
  return disk_cache.key("key-audit-witness-1", entry_key)


def normal(text: str) -> str:
  """The witness as compared: a location's file by its name alone."""
  return _LOCATION_FILE.sub(r'loc("\1":', text)


def record(entry_key: str, witness: Witness) -> None:
  """A compile's witness, kept beside its entry (in memory and on disk)."""
  if witness.of is not None:
    return
  text = normal(witness.now())
  with _lock:
    _memory[entry_key] = text
    _memory.move_to_end(entry_key)
    while len(_memory) > _MAX_IN_MEMORY:
      _memory.popitem(last=False)
  data = text.encode()
  if len(data) <= _MAX_WITNESS_BYTES:
    disk_cache.store(_disk_key(entry_key), zlib.compress(data, 6))


def forget() -> None:
  with _lock:
    _memory.clear()


def _stored(entry_key: str, witness: Witness, value) -> str | None:
  if witness.of is not None:
    found = witness.of(value)
    return None if found is None else normal(found)
  with _lock:
    text = _memory.get(entry_key)
  if text is not None:
    return text
  data = disk_cache.load(_disk_key(entry_key))
  if data is None:
    return None
  try:
    inflater = zlib.decompressobj()
    raw = inflater.decompress(data, _MAX_WITNESS_BYTES)
    return raw.decode() if inflater.eof and not inflater.unconsumed_tail else None
  except (zlib.error, UnicodeDecodeError):
    return None


def check(entry_key: str, witness: Witness, value, source: str) -> bool:
  """Audits a hit from ``source`` ("memory", "disk", "pack"): True when proven, False when its key has no witness
  (the caller compiles again); raises KeyAuditError when the entry was made from other IR than this call's."""
  stored = _stored(entry_key, witness, value)
  if stored is None:
    return False
  now = normal(witness.now())
  if now != stored:
    raise KeyAuditError(_message(witness, source, stored, now))
  return True


def _message(witness: Witness, source: str, stored: str, now: str) -> str:
  old, new = stored.splitlines(), now.splitlines()
  line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
  diff = "\n".join(list(difflib.unified_diff(old, new, "stored", "this call", n=1, lineterm=""))[:24])
  read = f" The key read: {witness.read}." if witness.read else ""
  return (f"{witness.what}: the compile cache's {source} entry for this call was made from another {witness.kind} "
          f"than this call makes (first difference at line {line + 1}): its key missed a change, and without "
          f"{flags.KEY_AUDIT} a stale kernel would have run.{read}\n{diff}\n"
          "This is a bug of jax_mosaic_ffi's compile keys: please report it with this message. Until it is fixed, "
          f"remove the cache folder ({flags.CACHE_DIR}) after such an edit, or pass compile_key=")


class Audit(Observer):
  """The audit as the store's observer: under ``JAX_MOSAIC_FFI_KEY_AUDIT=1``, a lookup with a witness takes only
  ``witnessed`` tiers (not a job's peers: their entries come to a process that must compile to prove them anyway),
  each hit is proven before it is served (not proven: the next tier answers), and each compile's witness kept."""

  vetoes = True

  def watches(self, ask) -> bool:
    return ask.witness is not None and on()

  def admits(self, ask, tier) -> bool:
    return tier.witnessed

  def proves(self, ask, found, tier) -> bool:
    proven = check(own(ask.key), ask.witness, found.value, tier.name)
    if proven:
      stats.count(ask.codec.kind, "audits")
    return proven

  def made(self, ask, found, unkept) -> None:
    if unkept is None:
      record(own(ask.key), ask.witness)

  def clear(self) -> None:
    forget()


AUDIT = Audit()
