"""A claimant's heartbeat: how long the processes of a job wait for the one that claimed an item (store/job_share.py).

A process that claims an item beats for it until it publishes (or declines) it: a counter under the item's
``.../beat`` key, set at the claim and every ``JAX_MOSAIC_FFI_JOB_SHARE_HEARTBEAT_S`` seconds after (default 1) by
one thread of the process (`HEART`). A waiter (`wait_for_value`) waits for the value while the beat moves, and stops
waiting once the claimant was silent for `SILENT_BEATS` beats: it died, or it is stopped, or too slow to be scheduled,
and the waiter makes the item itself. A living claimant compiling a slow kernel is waited for, each kernel once per
job, up to ``JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S`` (the outer bound, default the compile bound plus 30 s); a silent one
costs its waiters ten beats, not that bound.

The beat is a number the claimant counts up, read only for whether it changed (bounded: 20 bytes at most); nothing
here runs on a launch.
"""

from __future__ import annotations

import os
import threading
import time

from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.base import flags

ENV = flags.JOB_SHARE_HEARTBEAT_S
DEFAULT_S = 1.0
SILENT_BEATS = 10
_MAX_BEAT_BYTES = 20


class Late(Exception):
  """A wait that ended without the value: ``why`` is "timeouts" (past the outer bound) or "silent" (the claimant's
  heartbeat stopped)."""

  def __init__(self, why: str):
    super().__init__(why)
    self.why = why


def heartbeat_s() -> float:
  """Seconds between beats (``JAX_MOSAIC_FFI_JOB_SHARE_HEARTBEAT_S``); ValueError naming the setting for a value that
  is not a finite number > 0."""
  value = os.environ.get(ENV, "").strip()
  if not value:
    return DEFAULT_S
  try:
    beat = float(value)
  except ValueError:
    raise ValueError(f"{ENV} must be a number of seconds, got {value!r}") from None
  if not 0 < beat < float("inf"):
    raise ValueError(f"{ENV} must be a finite number of seconds > 0, got {value!r}")
  return min(beat, compile_timeout.MAX_S)


class Heart:
  """This process's beats: one thread counting up the beat key of every item it holds a claim to."""

  def __init__(self):
    self._reset()
    os.register_at_fork(after_in_child=self._reset)  # a forked child holds none of its parent's claims

  def _reset(self) -> None:
    self._lock = threading.Lock()
    self._held: dict[str, object] = {}  # beat key -> the store's client
    self._thread: threading.Thread | None = None
    self._count = 0

  def hold(self, client, base: str) -> None:
    """Beats for the item under ``base`` from now until `drop`."""
    key = f"{base}/beat"
    with self._lock:
      self._held[key] = client
      self._count += 1
      count = self._count
      if self._thread is None:
        self._thread = threading.Thread(target=self._beat, name="jax_mosaic_ffi job heartbeat", daemon=True)
        self._thread.start()
    _set(client, key, count)

  def drop(self, base: str) -> None:
    with self._lock:
      self._held.pop(f"{base}/beat", None)

  def _beat(self) -> None:
    while True:
      time.sleep(heartbeat_s())
      with self._lock:
        if not self._held:
          self._thread = None
          return
        self._count += 1
        count, held = self._count, list(self._held.items())
      for key, client in held:
        _set(client, key, count)


def _set(client, key: str, count: int) -> None:
  try:
    client.key_value_set_bytes(key, str(count).encode(), allow_overwrite=True)
  except Exception:  # noqa: BLE001 - the store gone (the job ends): the waiters stop waiting at the bound anyway
    pass


def _beat_of(client, base: str) -> bytes | None:
  try:
    value = client.key_value_try_get_bytes(f"{base}/beat")
  except Exception:  # noqa: BLE001 - not set (yet), or the store gone
    return None
  return value[:_MAX_BEAT_BYTES] if isinstance(value, bytes) else None


def wait_for_value(client, base: str, bound_s: float, timed_out) -> bytes:
  """The value under ``base`` once the claimant publishes it; `Late` where ``bound_s`` passed first or the claimant
  fell silent. ``timed_out(err)``: whether the store's error is its deadline's (another is raised as it is)."""
  beat_every = heartbeat_s()
  now = time.monotonic()
  deadline, silent_after = now + bound_s, SILENT_BEATS * beat_every
  last, since = _beat_of(client, base), now
  while True:
    step = max(0.001, min(deadline - now, beat_every))
    try:
      return client.blocking_key_value_get_bytes(f"{base}/value", max(1, int(step * 1000)))
    except Exception as err:  # noqa: BLE001 - jax's error type is private
      if not timed_out(err):
        raise
    now = time.monotonic()
    if now >= deadline:
      raise Late("timeouts")
    beat = _beat_of(client, base)
    if beat != last:
      last, since = beat, now
    elif now - since >= silent_after:
      raise Late("silent")


HEART = Heart()
