"""What the trades between processes (cross_process.py, nvshmem.py) do with ``jax.distributed``'s key-value
store: publish a key once, tell a timeout from other errors, and end each attempt in one verdict.

One verdict per generation: an attempt is keyed by a generation every process counts alike, and ends in a
value ``<base>/verdict`` set once by whichever process gets there first (the store refuses a second set):
``go`` from one that read every peer, ``abandoned/<who>/<seconds>`` from one that gave up waiting. Every
process follows the verdict, so either all go on or all fail this generation, and the next attempt (the next
generation) starts in step: a late process finds the verdict instead of waiting for peers that moved on.
"""

from __future__ import annotations

import time

# Bounded waits for what a peer that settled `go` has already published.
SETTLED_WAIT_MS = 10_000


def timed_out(err: Exception) -> bool:
  """Whether a blocking get failed by its deadline (jax's error type is private: its text says)."""
  return "DEADLINE_EXCEEDED" in str(err) or "timed out" in str(err)


def _already_set(err: Exception) -> bool:
  return "ALREADY_EXISTS" in str(err)


def set_once(client, key: str, value: str | bytes, who: str) -> None:
  """Publishes ``key``; one already set is an error naming it (jax says only ALREADY_EXISTS)."""
  try:
    if isinstance(value, bytes):
      client.key_value_set_bytes(key, value)
    else:
      client.key_value_set(key, value)
  except Exception as err:  # noqa: BLE001 - jax's error type is private
    if not _already_set(err):
      raise RuntimeError(f"{who}: publishing {key!r} in the jax.distributed key-value store failed: {err}") from None
    raise RuntimeError(
        f"{who}: the key {key!r} is already set in the jax.distributed key-value store, so another process "
        "took this process's place: two processes with the same process index, or a process of an earlier job "
        "on the same coordinator. Restart every process of the job (the coordinator too), each with its own "
        "process_id") from None


def settle(client, base: str, verdict: str, who: str) -> str:
  """Sets the attempt's verdict unless a peer set one first; returns the one that holds."""
  try:
    client.key_value_set(f"{base}/verdict", verdict)
    return verdict
  except Exception as err:  # noqa: BLE001 - jax's error type is private
    if not _already_set(err):
      raise RuntimeError(f"{who}: settling {base!r} in the jax.distributed key-value store failed: {err}") from None
  return client.blocking_key_value_get(f"{base}/verdict", SETTLED_WAIT_MS)


def settle_quietly(client, base: str, verdict: str) -> None:
  """`settle`, for a process about to raise its own error anyway."""
  try:
    client.key_value_set(f"{base}/verdict", verdict)
  except Exception:  # noqa: BLE001 - a peer settled first, or the store is gone: the error raised says why
    pass


def gather(client, base: str, me: int, count: int, prefix: str, timeout_s: float, who: str, *, as_bytes: bool,
           late, unreadable, abandoned) -> dict:
  """Every peer's value of one attempt, by peer: the key ``f"{prefix}{peer}"`` of each of the ``count`` processes
  but ``me`` (as bytes or as text), within one deadline, then the attempt's verdict, followed. Raises
  ``late(peer)`` where this process gave up waiting for ``peer``, ``abandoned(verdict)`` where a peer gave up
  first (the attempt fails everywhere), ``unreadable(peer, error)`` where the store failed otherwise. (The
  errors are made as they are raised: one kept in a local would be held by the traceback of its own frame, a
  cycle.)"""
  read = client.blocking_key_value_get_bytes if as_bytes else client.blocking_key_value_get
  deadline = time.monotonic() + timeout_s
  got: dict = {}
  gave_up = None
  for peer in range(count):
    if peer == me:
      continue
    try:
      got[peer] = read(f"{prefix}{peer}", max(1, int((deadline - time.monotonic()) * 1000)))
    except Exception as err:  # noqa: BLE001 - jax's error type is private
      if not timed_out(err):
        settle_quietly(client, base, f"abandoned/{me}/{timeout_s:g}")
        raise unreadable(peer, err) from None
      gave_up = peer
      break
  verdict = settle(client, base, "go" if gave_up is None else f"abandoned/{me}/{timeout_s:g}", who)
  if verdict != "go":
    raise (late(gave_up) if gave_up is not None else abandoned(verdict)) from None
  for peer in range(count):  # a peer settled `go`: every value is in the store, not all read here yet
    if peer != me and peer not in got:
      try:
        got[peer] = read(f"{prefix}{peer}", SETTLED_WAIT_MS)
      except Exception as err:  # noqa: BLE001 - jax's error type is private
        raise unreadable(peer, err) from None
  return got


def abandoned_by(verdict: str, count: int) -> tuple[int, float] | None:
  """(who gave up, after how many seconds) from a verdict ``abandoned/<who>/<seconds>``; bounded, since a peer
  wrote it: None for anything else, or a ``who`` outside 0..count-1."""
  fields = verdict.split("/")
  try:
    who, seconds = int(fields[1]), float(fields[2])
  except (IndexError, ValueError):
    return None
  return (who, seconds) if fields[0] == "abandoned" and 0 <= who < count else None
