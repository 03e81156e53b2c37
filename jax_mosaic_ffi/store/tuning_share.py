"""An autotuning decision as an entry of the store: kept in memory, and made once per GPU model of a
``jax.distributed`` job (store/job_tier.py, store/job_share.py).

A decision's key (autotune.py) holds its environment (the device's name and compute capability, the driver and the
releases) and every config's timing key, so the processes that reach one share a GPU model and a program. The
first to claim it decides as a lone process would (stored timings, the missing ones timed on its GPU) and
publishes the winner with the whole table; the others take both: the winner for their program, the table's
timings kept in memory as the peer's (never on disk, never in a tuning file this process saves). A process that
waited past the bound decides itself, then takes the decision the job holds if a peer published one first: every
process of a model ends with the first decision published, so the programs of the job's ranks stay identical.
Nothing is shared under the strict pack mode (its decisions come from the packs, alike everywhere) or outside a
job. The configs are built (compiled) in each process's own rotation of the list (`rotation`), so the job's
processes compile different configs at once.

A published decision is a peer's: read bounded (job_share.py bounds its size), in our format, over exactly this
call's configs, every timing checked as a tuning file's (tuning_records.checked_timing), the winner a config that
ran and the fastest of its own table; anything else is refused and decided here.
"""

from __future__ import annotations

import json
from typing import Callable

from jax_mosaic_ffi.store import job_share
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store import tuning_failures
from jax_mosaic_ffi.store import tuning_records
from jax_mosaic_ffi.store.entries import Codec, Found

_FORMAT = "job-tuning-1"
# Decisions kept in this process, the oldest used dropped first.
MAX_DECISIONS = 4096


def rotation(count: int) -> list[int]:
  """The order this process builds ``count`` configs in: from its own place in the list, by its rank in the job."""
  rank, processes = job_share.process_rank()
  start = rank * count // processes
  return list(range(start, count)) + list(range(start))


def decide(decision: str, configs: list[str], make: Callable[[], tuple[int, list[dict]]], env,
           keys) -> Found:
  """The decision ``decision`` over ``configs`` (each as its JSON text): (winner, table) from this process's memory,
  a peer of the job, or ``make()``; a peer's table's timings are kept in memory as the peer's."""
  found = stack.get_or_make(decision, CODEC.bound(decode=lambda payload: _decoded(payload, configs)), make)
  if found.source == "peer" or (found.source == "made" and found.origin == "peer"):
    _keep(found.value[1], env, keys)
  return found


def _encoded(decision: tuple[int, list[dict]]) -> bytes:
  winner, table = decision
  rows = [{"config": row["config"], "us": row["us"], "error": row["error"]} for row in table]
  return json.dumps({"format": _FORMAT, "winner": winner, "table": rows}, sort_keys=True).encode()


def _decoded(payload: bytes, configs: list[str]) -> tuple[int, list[dict]] | None:
  """A peer's decision over exactly ``configs``, or None: one that is not ours, covers other configs, holds a
  timing that is not one, or whose winner did not run or is not its table's fastest."""
  try:
    decision = json.loads(payload)
    if not isinstance(decision, dict) or decision.get("format") != _FORMAT or set(decision) != {
        "format", "winner", "table"}:
      return None
    rows, winner = decision["table"], decision["winner"]
    if not isinstance(rows, list) or len(rows) != len(configs) or type(winner) is not int:
      return None
    table = []
    for k, (row, config) in enumerate(zip(rows, configs)):
      if not isinstance(row, dict) or set(row) != {"config", "us", "error"} or row["config"] != config:
        return None
      timing = tuning_records.checked_timing(row["us"], row["error"], f"table[{k}]")
      table.append({"config": config, "us": timing.us, "error": timing.error})
  except (ValueError, RecursionError, TypeError):  # tuning_records.Malformed is a ValueError
    return None
  if not 0 <= winner < len(table) or table[winner]["us"] is None:
    return None
  if table[winner]["us"] > min(row["us"] for row in table if row["us"] is not None):
    return None  # a winner that is not the fastest of its own table: not a decision this process would make
  return winner, table


def _keep(table: list[dict], env, keys) -> None:
  """Keeps a peer's timings here, as the peer's (memory only), where a lone process would keep its own."""
  for key, row in zip(keys, table):
    timing = tuning_records.Timing(row["us"], row["error"])
    if key is not None and (timing.us is not None or tuning_failures.lasting(timing.error)):
      tuning_records.keep_peers(env, key, timing)


# A decision's entries: (winner, table), never on disk (its timings are), shared by a job's processes of one GPU
# model, alike in each (the first published replaces one's own); decoded against the call's configs.
CODEC = Codec("decision", encode=_encoded, decode=lambda payload: None, required=False, shared=True, alike=True,
              persistent=False, recorded=False, memory=MAX_DECISIONS)
