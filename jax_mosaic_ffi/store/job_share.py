"""Once per job: the processes of a ``jax.distributed`` job share what one of them made (a compile-cache entry, an
autotuning decision) through the coordination service's key-value store, which every multi-process job already
runs (no other server, no shared folder).

Where ``jax.distributed`` runs more than one process (and ``JAX_MOSAIC_FFI_JOB_SHARE`` is not 0), a process that
must make something the job may already make asks for its `turn` (`Claims`; store/job_tier.py is the job as a
tier of the store): the first to set the item's claim key (the store
refuses a second set) makes it and `Turn.publish`\\ es it, beating for it meanwhile (store/job_heartbeat.py); the
others wait for the value while the claimant's heartbeat moves, up to ``JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S`` (default:
the compile bound plus a margin), then verify it and use it. A claimant that died or fell silent leaves the others
after ten beats (one slower than the bound, at the bound), never hanging: they make it themselves, and the first of
them to finish publishes it for any process still to come (the store keeps the first value set). A compile started
ahead (store/ahead.py) whose item a peer claimed and has not published steps aside (`Parked`) instead of waiting,
so that the process compiles its next kernel meanwhile: processes making the same kernels in the same order claim
different ones at once.

Keys: ``jax_mosaic_ffi/job/<space>/<key>/claim``, ``.../beat`` and ``.../value``; ``<key>`` is 64 hex digits (the
compile cache's entry key, a decision's key). A value is ours, bounded and bound to its key before anything reads it:

    offset 0   magic b"JMFJOB1\\0"
           8   status, u8: 0 an item; 1 none (the claimant could not share it: compile it yourself)
           9   the payload's length, u32 little-endian, at most MAX_PAYLOAD_BYTES
          13   sha256 of the key and the payload (base/disk_cache.key's framing), 32 bytes
          45   the payload (a compile: the bytes a pack's entry holds, its `Portable` form)

The job's processes run one program under one coordinator, and a value's framing needs no secret: a peer could
publish any entry under any key. So a peer's entry is used by this process only, never written to its disk cache
(a later process that is not in the job would take it as its own), checked as the call's (the module it holds must
define the kernel the call names) and, for a decision, checked to be its own table's fastest over this call's
configs (docs/threat_model.md). The framing stops a damaged, truncated, oversized or misplaced value (another
key's, another release's) from being used. Compile time only: nothing here runs on a launch.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
import struct
import threading

from jax._src import distributed  # no public key-value API in jax 0.11/0.12

from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.store import stats as store_stats
from jax_mosaic_ffi.store.job_heartbeat import HEART, Late, wait_for_value

ENV = flags.JOB_SHARE
WAIT_ENV = flags.JOB_SHARE_WAIT_S
_PREFIX = "jax_mosaic_ffi/job"
_MAGIC = b"JMFJOB1\0"
_HEADER = struct.Struct("<8sBI32s")
_ITEM, _NONE = 0, 1
# The coordinator (in process 0) holds every value for the job's life, in memory: a larger entry is compiled by
# every process that needs it, counted as unshared. A kernel's cubins are far smaller (jax 0.11's store itself
# carries 200 MiB values).
MAX_PAYLOAD_BYTES = 32 << 20
# Time for the claimant to encode and publish once its compile ended within the bound.
_MARGIN_S = 30.0
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass
class Stats:
  received: int = 0   # items this process took from a peer instead of making them
  published: int = 0  # items this process made and gave to the job
  unshared: int = 0   # items made here that could not be shared (too large, not cacheable, failed), or that a
                      # claimant said it could not share
  timeouts: int = 0   # waits for a peer's item that ran past the bound: made here instead
  silent: int = 0     # waits for a peer's item that its claimant's heartbeat ended (it stopped beating): made here
  stepped_aside: int = 0  # compiles started ahead that let a peer's claim be and compiled another kernel first
  refused: int = 0    # values read from the store and refused (damaged, oversized, another key's): made here


_lock = threading.Lock()
_late: set[bytes] = set()  # the claimants (process ids, as they claim) a wait for ran past the bound
_parking: contextvars.ContextVar[bool] = contextvars.ContextVar("jax_mosaic_ffi_job_parking", default=False)


class Parked(Exception):
  """A peer claimed the item and has not published it yet, and the caller (a compile started ahead) would rather
  make another item meanwhile than wait: it asks again later, and then waits."""


@contextlib.contextmanager
def parking(allowed: bool):
  """Within: a `Claims.turn` at an item a peer claimed raises `Parked` where its value is not there yet."""
  token = _parking.set(allowed)
  try:
    yield
  finally:
    _parking.reset(token)


def stats(space: str) -> Stats:
  """The counts of one space ("compile", "decision"), as the store's mapping holds them (store/stats.py)."""
  events = store_stats.counts().get(space, {})
  return Stats(**{field.name: events.get(field.name, 0) for field in dataclasses.fields(Stats)})


def _count(space: str, field: str, n: int = 1) -> None:
  store_stats.count(space, field, n)


def enabled() -> bool:
  """Whether ``JAX_MOSAIC_FFI_JOB_SHARE`` allows sharing (on by default); a value neither on nor off is an error."""
  return flags.switch(ENV, True, on="the processes of a jax.distributed job share compiles and autotuning "
                      "decisions: the default", off="every process compiles and tunes for itself")


def _client():
  """The store's client where this process is one of several of a jax.distributed job sharing, else None. Both
  settings are checked first, in every process: a typo is an error at the first compile, not only in a job."""
  bound_ok = enabled() and wait_s() > 0
  state = distributed.global_state
  if not bound_ok or state.client is None or (state.num_processes or 1) <= 1:
    return None
  return state.client


def process_rank() -> tuple[int, int]:
  """(this process's index, the job's process count); (0, 1) where nothing is shared."""
  state = distributed.global_state
  if _client() is None:
    return 0, 1
  return int(state.process_id or 0), int(state.num_processes)


def wait_s() -> float:
  """How long a process waits for a peer's item before making it itself (``JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S``;
  default the compile bound plus a margin, its default where compiles are unbounded: never unbounded)."""
  value = os.environ.get(WAIT_ENV, "").strip()
  if not value:
    return (compile_timeout.seconds() or compile_timeout.DEFAULT_S) + _MARGIN_S
  try:
    bound = float(value)
  except ValueError:
    raise ValueError(f"{WAIT_ENV} must be a number of seconds, got {value!r}") from None
  if not 0 < bound < float("inf"):
    raise ValueError(f"{WAIT_ENV} must be a finite number of seconds > 0 (the store never waits unbounded), "
                     f"got {value!r}")
  return min(bound, compile_timeout.MAX_S)


def _digest(key: str, payload: bytes) -> bytes:
  return bytes.fromhex(disk_cache.key(_MAGIC, key, payload))


def encoded(key: str, payload: bytes | None) -> bytes:
  """The store value for ``key``: the payload, or (None) a claimant's word that it cannot share it."""
  data = b"" if payload is None else payload
  return _HEADER.pack(_MAGIC, _NONE if payload is None else _ITEM, len(data), _digest(key, data)) + data


def decoded(key: str, value) -> tuple[bool, bytes | None]:
  """(whether ``value`` is a valid value for ``key``, its payload: None where the claimant could not share it).
  Everything is bounded before it is read: a value from the store is a peer's."""
  if not isinstance(value, bytes) or not _HEADER.size <= len(value) <= _HEADER.size + MAX_PAYLOAD_BYTES:
    return False, None
  magic, status, size, digest = _HEADER.unpack_from(value)
  payload = value[_HEADER.size:]
  if magic != _MAGIC or status not in (_ITEM, _NONE) or size != len(payload) or digest != _digest(key, payload):
    return False, None
  if status == _NONE:
    return (size == 0), None
  return True, payload


def _set_once(client, key: str, value: bytes) -> bool:
  """Sets ``key`` unless it is set; False where it was (the store keeps the first value)."""
  try:
    client.key_value_set_bytes(key, value, allow_overwrite=False)
    return True
  except Exception as err:  # noqa: BLE001 - jax's error type is private: its text says
    if "ALREADY_EXISTS" in str(err):
      return False
    raise


def _timed_out(err: Exception) -> bool:
  return "DEADLINE_EXCEEDED" in str(err) or "timed out" in str(err).lower()


class Turn:
  """One process's part in one item of the job: a peer's verified payload (`payload`), or the item is this
  process's to make, then to `publish` (or `decline`) once. Made by `turn`."""

  def __init__(self, space: str, key: str, client=None, base: str = "", claimed: bool = False,
               payload: bytes | None = None, settled: bool = False):
    self.space, self.key, self._client, self._base = space, key, client, base
    self._claimed, self.payload, self._settled = claimed, payload, settled

  @property
  def shared(self) -> bool:
    """Whether this item goes through the job's store at all."""
    return self._client is not None

  def publish(self, payload: bytes | None) -> None:
    """Gives the item this process made to the job (None: it cannot be shared; the waiters make it themselves).
    Only where no value is set yet: a claimant's, or that of a process that waited past the bound."""
    if self._client is None or self._settled:
      return
    self._settled = True
    if payload is not None and len(payload) > MAX_PAYLOAD_BYTES:
      payload = None
    if payload is None:
      _count(self.space, "unshared")
    try:
      if _set_once(self._client, f"{self._base}/value", encoded(self.key, payload)) and payload is not None:
        _count(self.space, "published")
    except Exception:  # noqa: BLE001 - the store gone (the job ends): the item is this process's anyway
      pass
    HEART.drop(self._base)  # once the value is set: its waiters have it

  def settle(self, payload: bytes) -> bytes:
    """`publish`, for an item every process must hold alike (an autotuning decision): returns the payload the job
    holds, this one or the one a peer published first (a claimant slower than a waiter's bound, or the waiter
    that gave up on it); this one where the job's cannot be read or is refused."""
    if self._client is None or self._settled:
      return payload
    self._settled = True
    key = f"{self._base}/value"
    try:
      if _set_once(self._client, key, encoded(self.key, payload)):
        _count(self.space, "published")
        return payload
      value = self._client.key_value_try_get_bytes(key)
    except Exception:  # noqa: BLE001 - the store gone (the job ends): this process's own
      return payload
    finally:
      HEART.drop(self._base)
    valid, held = decoded(self.key, value)
    if not valid or held is None:
      _count(self.space, "refused" if not valid else "unshared")
      return payload
    _count(self.space, "received")
    return held

  def decline(self) -> None:
    """This process's making of the item failed: the waiters stop waiting and make it themselves."""
    self.publish(None)


class Claims:
  """Who makes an item of the job: the first process to set its claim key makes it, the others wait for its value
  while its heartbeat moves, or, for a compile started ahead, make another item first (`Parked`). The one place that
  decides it."""

  def turn(self, space: str, key: str) -> Turn:
    """This process's turn at the item ``key`` of ``space`` ("compile", "decision"): a peer's payload where the
    job has one (waiting for the claimant while it beats, up to `wait_s`), else this process's to make; `Parked`
    where a peer claimed it and the caller is `parking`. Outside a job, or with sharing off, always this
    process's."""
    client = _client()
    if client is None or not _KEY.fullmatch(key):
      return Turn(space, key)
    base = f"{_PREFIX}/{space}/{key}"
    me = str(distributed.global_state.process_id or 0).encode()
    claimant = b""
    try:
      if _set_once(client, f"{base}/claim", me):
        HEART.hold(client, base)
        return Turn(space, key, client, base, claimed=True)
      claimant = client.key_value_try_get_bytes(f"{base}/claim")[:32]
      if _parking.get():
        value = _published(client, base)
        if value is None:  # the peer is making it: this process makes another item first, and asks again
          _count(space, "stepped_aside")
          raise Parked(key)
      # A claimant this process already waited for in vain (it died, or is that slow) is not waited for again: only
      # a value already there is taken. Else a dead process's every claim would cost the bound once more.
      elif claimant in _late:
        value = client.blocking_key_value_get_bytes(f"{base}/value", 1)
      else:
        value = wait_for_value(client, base, wait_s(), _timed_out)
    except Late as late:
      _count(space, late.why)
      with _lock:
        _late.add(claimant)
      return Turn(space, key, client, base)  # made here; published for later processes where still unset
    except Parked:
      raise
    except Exception as err:  # noqa: BLE001 - jax's error type is private
      if _timed_out(err):
        _count(space, "timeouts")
        with _lock:
          _late.add(claimant)
        return Turn(space, key, client, base)  # made here; published for later processes where still unset
      return Turn(space, key)  # the store failed otherwise (the job ends): made here, nothing shared
    valid, payload = decoded(key, value)
    if not valid:
      _count(space, "refused")
    elif payload is None:
      _count(space, "unshared")
    else:
      _count(space, "received")
      return Turn(space, key, client, base, payload=payload, settled=True)
    return Turn(space, key, client, base, settled=True)  # made here; the value set stays


def _published(client, base: str) -> bytes | None:
  """The item's value where it is set already, else None."""
  try:
    return client.key_value_try_get_bytes(f"{base}/value")
  except Exception:  # noqa: BLE001 - not set: jax's error type is private
    return None


CLAIMS = Claims()


def turn(space: str, key: str) -> Turn:
  """`Claims.turn` of the job's claims."""
  return CLAIMS.turn(space, key)


def refused(turn_: Turn) -> None:
  """A peer's payload that passed the checks here but that the caller could not use (it does not decode, or the
  key audit could not prove it): counted as refused instead of received; the caller makes the item itself."""
  _count(turn_.space, "received", -1)
  _count(turn_.space, "refused")
  turn_.payload = None
