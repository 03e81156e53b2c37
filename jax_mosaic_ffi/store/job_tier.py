"""The processes of a ``jax.distributed`` job as a tier: what one of them made (a compile, an autotuning decision),
the others take instead of making it (store/job_share.py: the claims, the values, their framing).

`get` asks for this process's turn at the item: a peer's entry (read as a pack's, checked as this call's: it must
be the entry the call names), or the claim to make it, which `put` honours by publishing what was made (for a
kind every process must hold alike, taking the job's first one instead) and `abandon` by telling the waiters to
make it themselves. The tier is ``shared``: its entries are kept in memory only, never as this machine's own on
disk, and the key audit, which cannot prove an entry that carries no witness, does not take them. Nothing is
shared under the strict pack mode: every process serves from the packs alike.
"""

from __future__ import annotations

import threading

from jax_mosaic_ffi.store import job_share
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store.entries import Found, own
from jax_mosaic_ffi.store.tiers import Tier


class JobTier(Tier):
  name = "peer"
  shared = True

  def __init__(self, claims: job_share.Claims):
    self.claims = claims
    self._lock = threading.Lock()
    self._turns: dict[tuple[str, str, int], job_share.Turn] = {}  # the items this process (a thread) is to make

  def holds(self, codec):
    return codec.shared and not packs.strict()

  def get(self, ask):
    turn = self.claims.turn(ask.codec.kind, own(ask.key))
    if turn.payload is None:
      if turn.shared:
        with self._lock:
          self._turns[(ask.codec.kind, own(ask.key), threading.get_ident())] = turn
      return None
    value = self._read(turn.payload, ask)
    if value is None:
      job_share.refused(turn)  # made here
      return None
    return Found(value, "peer", "peer", False)

  def put(self, ask, found):
    turn = self._taken(ask)
    if turn is None or not found.own:
      return None
    payload = ask.codec.packed(found.value)
    if not ask.codec.alike:
      turn.publish(payload)
      return None
    held = turn.settle(payload)
    if held == payload:
      return None
    value = self._read(held, ask)  # a peer's, published first: every process of the job takes it
    return None if value is None else Found(value, "peer", "peer", False)

  def abandon(self, ask):
    turn = self._taken(ask)
    if turn is not None:
      turn.decline()

  def _taken(self, ask) -> job_share.Turn | None:
    with self._lock:
      return self._turns.pop((ask.codec.kind, own(ask.key), threading.get_ident()), None)

  @staticmethod
  def _read(payload: bytes, ask):
    try:
      return ask.codec.unpacked(payload, ask.about)
    except Exception:  # noqa: BLE001 - a peer's entry that does not apply here, or is not this call's
      return None
