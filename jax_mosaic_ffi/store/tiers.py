"""A tier of the store: one place entries are kept and found (`Tier`), and the two every kind has: this process's
memory and the disk cache. The kernel packs' tier is store/pack_tier.py, the job's peers' store/job_tier.py.

A tier says what it is by its flags: ``read_only`` (it holds what others made: nothing is put into it; where it
is strict, a miss refuses everything below it and ``make``), ``shared`` (its entries are other processes': never
written to this machine's disk as its own; a lookup that makes nothing does not ask it, as it would take a claim
it never honours), ``witnessed`` (the key audit can prove its hits, by the witness kept here for their key or the
one an entry carries: a job's peers' cannot be, so the audit does not take them).
"""

from __future__ import annotations

import collections
import threading

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.store.entries import Ask, Codec, Found, own


class Tier:
  """A place entries are kept: `get` an entry of a key (None: a miss), `put` one found below it or made here."""

  name = ""
  read_only = False
  shared = False
  witnessed = False

  def holds(self, codec: Codec) -> bool:
    """Whether it keeps entries of this kind at all."""
    return True

  def get(self, ask: Ask) -> Found | None:
    """The entry of ``ask.key``, or None."""
    raise NotImplementedError

  def put(self, ask: Ask, found: Found) -> Found | None:
    """Keeps ``found``; returns the entry that replaces it where the tier holds another for the key that every
    process must use alike (a job's first decision), else None."""
    return None

  def abandon(self, ask: Ask) -> None:
    """What this process was to make for the key will not come (``make`` failed, or its value is kept nowhere)."""

  def refusal(self, ask: Ask) -> Exception | None:
    """After a miss: the error that refuses every tier below and ``make`` (a strict read-only tier's), or None."""
    return None

  def clear(self) -> None:
    """Empties what it holds in this process."""


class MemoryTier(Tier):
  """This process's entries, one LRU per kind (``Codec.memory`` entries each), each with where it came from."""

  name = "memory"
  witnessed = True

  def __init__(self):
    self._lock = threading.Lock()
    self._kinds: dict[str, collections.OrderedDict[str, Found]] = {}

  def get(self, ask):
    entry_key, codec = own(ask.key), ask.codec
    with self._lock:
      entries = self._kinds.get(codec.kind)
      held = None if entries is None else entries.get(entry_key)
      if held is None:
        return None
      entries.move_to_end(entry_key)
    if codec.fresh is not None and not codec.fresh(held.value):
      return None  # stale: the tiers below answer, and their entry replaces it
    return held

  def put(self, ask, found):
    held = found if found.source == "memory" else Found(found.value, "memory", found.origin, found.own)
    entry_key = own(ask.key)
    with self._lock:
      entries = self._kinds.setdefault(ask.codec.kind, collections.OrderedDict())
      entries[entry_key] = held
      entries.move_to_end(entry_key)
      while len(entries) > ask.codec.memory:
        entries.popitem(last=False)
    return None

  def entries(self, kind: str) -> list[Found]:
    """Every entry of ``kind`` held now, oldest used first."""
    with self._lock:
      return list(self._kinds.get(kind, {}).values())

  def clear(self, kinds=None) -> None:
    with self._lock:
      for kind in list(self._kinds) if kinds is None else kinds:
        self._kinds.pop(kind, None)


class DiskTier(Tier):
  """The disk cache (base/disk_cache.py): the entries this machine made, under their key. An entry another process
  made (a peer's, a pack's, a tuning file's) is never written here: a later process would take it as its own."""

  name = "disk"
  witnessed = True

  def holds(self, codec):
    return codec.persistent

  def get(self, ask):
    value = disk_cache.load_decoded(own(ask.key), ask.codec.decode)
    return None if value is None else Found(value, "disk", "disk", True)

  def put(self, ask, found):
    if found.own and found.source != "disk":
      data = ask.codec.encode(found.value)
      if data is not None:
        disk_cache.store(own(ask.key), data)
    return None
