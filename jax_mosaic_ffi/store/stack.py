"""The store's one loop: `get_or_make` an entry through the tiers in order, then ``make`` it, keeping it where it
belongs; every kind of entry (a compile, a Triton specialization, an autotuning timing or decision) goes through it.

The tiers, in order (`STACK`): this process's memory, the kernel packs in use, the disk cache, the job's peers.
An entry found in one is kept in the tiers before it that keep it (memory; a peer's never on disk); an entry made
here goes to every tier that keeps its kind (the job's first, so its waiters have it soonest). A tier that misses
and is strict (the packs under ``JAX_MOSAIC_FFI_PACKS_STRICT=1``) refuses every tier below it and ``make``. The
observers (`OBSERVERS`) watch what was served or made: the counts, the key audit (which may refuse a tier or an
entry it cannot prove), pack recording, the cold-start log. A new tier is a class (store/tiers.py says what one
is) and its place in `STACK`; nothing else names it. `start` is the same lookup begun ahead, on a pool
(store/ahead.py), for a front end that knows an entry before it needs it.

The shape is JAX's persistent compilation cache's (``compile_or_get_cached``: read, share through the job's
key-value store, compile and write) and Triton's remote cache over its file cache, as one list of tiers.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

from jax_mosaic_ffi.store import ahead
from jax_mosaic_ffi.store import cold_starts
from jax_mosaic_ffi.store import job_share
from jax_mosaic_ffi.store import key_audit
from jax_mosaic_ffi.store import pack_record
from jax_mosaic_ffi.store import stats
from jax_mosaic_ffi.store.entries import Ask, Codec, Found, Key, Observer, Unkept, own
from jax_mosaic_ffi.store.job_tier import JobTier
from jax_mosaic_ffi.store.pack_tier import PackTier
from jax_mosaic_ffi.store.tiers import DiskTier, MemoryTier, Tier

MEMORY = MemoryTier()
STACK: tuple[Tier, ...] = (MEMORY, PackTier(), DiskTier(), JobTier(job_share.CLAIMS))
OBSERVERS: tuple[Observer, ...] = (stats.COUNTS, key_audit.AUDIT, pack_record.RECORDER, cold_starts.LOG)


def get_or_make(key: str | Key, codec: Codec, make: Callable[[], Any], about: Callable[[], Any] | None = None, *,
                witness: Any = None) -> Found:
  """The entry of ``key``: from the first tier that holds it, else ``make()``'s (a value, or `Unkept`).
  ``about``: what the front end says of the entry, asked only to name it (an error, a record, a log line);
  ``witness``: what the key audit proves a hit against (store/key_audit.py). An entry being made ahead (`start`)
  is waited for, never made twice."""
  pending = ahead.POOL.running((codec.kind, own(key)))
  if pending is not None:
    return pending.result()
  return _lookup(Ask(key, codec, about, witness, time.perf_counter()), make)


def start(key: str | Key, codec: Codec, make: Callable[[], Any], about: Callable[[], Any] | None = None, *,
          witness: Any = None) -> ahead.Pending:
  """`get_or_make` ahead (store/ahead.py): an entry in memory at once, else its lookup (and ``make``) on the pool,
  whose `Pending` the caller asks when it needs the entry; one already started for ``key`` is returned as it is.
  The tiers, the observers and a job's claims see the lookup as `get_or_make`'s."""
  if MEMORY.get(Ask(key, codec, about, witness, 0.0)) is not None:  # warm: served here, as without ahead
    return ahead.started(ahead.Pending(get_or_make(key, codec, make, about, witness=witness)))
  return ahead.started(ahead.POOL.start(
      (codec.kind, own(key)), lambda: _lookup(Ask(key, codec, about, witness, time.perf_counter()), make)))


def _lookup(ask: Ask, make: Callable[[], Any]) -> Found:
  watching = [o for o in OBSERVERS if o.watches(ask)]
  found = _find(ask, watching, True)
  return found if found is not None else _made(ask, make, watching)


def find(key: str | Key, codec: Codec, about: Callable[[], Any] | None = None) -> Found | None:
  """The entry of ``key`` from the first tier that holds it, or None; nothing is made, and no job's claim is
  taken (a shared tier is not asked)."""
  ask = Ask(key, codec, about, None, time.perf_counter())
  return _find(ask, [o for o in OBSERVERS if o.watches(ask)], making=False)


def keep(key: str | Key, codec: Codec, value: Any, origin: str, own: bool) -> None:
  """Keeps an entry made outside `get_or_make` (a timing measured, a tuning file's, a peer's) in every tier that
  keeps its kind; ``own``: this process made it (else it stays off the disk cache)."""
  ask = Ask(key, codec, None, None, time.perf_counter())
  _keep([tier for tier in STACK if not tier.shared], ask, Found(value, origin, origin, own))


def clear_memory(kinds=None) -> None:
  """Empties the memory tier (of ``kinds``, else of everything), and what the observers keep beside it."""
  MEMORY.clear(kinds)
  for observer in OBSERVERS:
    observer.clear()


def _find(ask: Ask, watching: list[Observer], making: bool) -> Found | None:
  vetoing = [o for o in watching if o.vetoes]
  for index, tier in enumerate(STACK):
    if not tier.holds(ask.codec) or (tier.shared and not making) or (
        vetoing and not all(o.admits(ask, tier) for o in vetoing)):
      continue
    found = tier.get(ask)
    if found is None:
      refusal = tier.refusal(ask)
      if refusal is not None:
        raise refusal
    elif not vetoing or all(o.proves(ask, found, tier) for o in vetoing):
      if index:
        _keep(STACK[:index], ask, found)
      for observer in watching:
        observer.served(ask, found)
      return found
  return None


def _made(ask: Ask, make: Callable[[], Any], watching: list[Observer]) -> Found:
  tiers = [tier for tier in STACK if tier.holds(ask.codec)]
  try:
    with contextlib.ExitStack() as making:
      for observer in watching:
        making.enter_context(observer.making(ask))
      value = _run(make, ask)
  except BaseException:
    for tier in tiers:
      tier.abandon(ask)
    raise
  if isinstance(value, Unkept):
    for tier in tiers:
      tier.abandon(ask)
    found = Found(value.value, "made", "made", True)
  else:
    found = _keep(tiers, ask, Found(value, "made", "made", True))
  for observer in watching:
    observer.made(ask, found, value.why if isinstance(value, Unkept) else None)
  return found


def _run(make: Callable[[], Any], ask: Ask):
  """``make()``: the one place an entry is made (a test's peer that is slow or dies replaces it)."""
  return make()


def _keep(tiers, ask: Ask, found: Found) -> Found:
  """Puts ``found`` into ``tiers`` that keep its kind, the last first; an entry a tier replaces it with (the job's
  first decision) goes on in its place."""
  for tier in reversed(tiers):
    if not tier.read_only and tier.holds(ask.codec):
      found = tier.put(ask, found) or found
  return found
