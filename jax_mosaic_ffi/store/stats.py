"""What the store did in this process, as one mapping: ``{kind: {event: count}}``.

A kind is an entry's ("compile", "specialization", "tuning": a timing, "decision"), or "compiles" for the
compiles run by each compiler (``{"nvrtc": 3}``, one per target arch). An event is the tier that served an entry
("memory", "pack", "disk", "peer"), "made" (made here), or what a tier or an observer counts of it: the key
audit's "audits" (hits proven), the job's "received", "published", "unshared", "timeouts" and "refused"
(store/job_share.py), autotuning's "tuned", "from pack", "from disk", "skipped" (decisions) and "timed" (timings
measured). `jmf.kernel_cache_stats()` reads its names off this mapping.
"""

from __future__ import annotations

import threading

from jax_mosaic_ffi.store.entries import Observer

_lock = threading.Lock()
_counts: dict[str, dict[str, int]] = {}


def count(kind: str, event: str, n: int = 1) -> None:
  with _lock:
    events = _counts.setdefault(kind, {})
    events[event] = events.get(event, 0) + n


def counts() -> dict[str, dict[str, int]]:
  """A copy of the mapping, since the process started."""
  with _lock:
    return {kind: dict(events) for kind, events in _counts.items()}


class Counts(Observer):
  """Counts each entry served, by its kind and the tier that served it, and each made."""

  def served(self, ask, found) -> None:
    count(ask.codec.kind, found.source)

  def made(self, ask, found, unkept) -> None:
    count(ask.codec.kind, "made")


COUNTS = Counts()
