"""An autotuning decision made once per GPU model of a ``jax.distributed`` job (store/job_share.py).

A decision's key (autotune.py) holds its environment (the device's name and compute capability, the driver and the
releases) and every config's timing key, so the processes that reach one share a GPU model and a program. The
first to claim it decides as a lone process would (stored timings, the missing ones timed on its GPU) and
publishes the winner with the whole table; the others take both, and keep the timings as their own (memory and
disk). A process that waited past the bound decides itself, then takes the decision the job holds if a peer
published one first: every process of a model ends with the first decision published, so the programs of the
job's ranks stay identical. Nothing is shared under the strict pack mode (its decisions come from the packs, alike
everywhere) or outside a job. The configs are built (compiled) in each process's own rotation of the list
(`rotation`), so the job's processes compile different configs at once.

A published decision is a peer's: read bounded (job_share.py bounds its size), in our format, over exactly this
call's configs, every timing checked as a tuning file's (tuning_records.checked_timing), the winner a config that
ran; anything else is refused and decided here.
"""

from __future__ import annotations

import json

from jax_mosaic_ffi.store import job_share
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store import tuning_failures
from jax_mosaic_ffi.store import tuning_records

_FORMAT = "job-tuning-1"


def turn(decision: str) -> job_share.Turn:
  """This process's turn at ``decision`` (a peer's payload, or this process's to decide and settle)."""
  if packs.strict():
    return job_share.Turn("tuning", decision)
  return job_share.turn("tuning", decision)


def rotation(count: int) -> list[int]:
  """The order this process builds ``count`` configs in: from its own place in the list, by its rank in the job."""
  rank, processes = job_share.process_rank()
  start = rank * count // processes
  return list(range(start, count)) + list(range(start))


def received(turn_: job_share.Turn, configs: list[str], env, keys) -> tuple[int, list[dict]] | None:
  """(winner, table) of the peer's decision ``turn_`` holds, its timings kept here; None where it holds none or
  one that is refused (counted so)."""
  if turn_.payload is None:
    return None
  found = _decoded(turn_.payload, configs)
  if found is None:
    job_share.refused(turn_)
    return None
  _keep(found[1], env, keys)
  return found


def settled(turn_: job_share.Turn, winner: int, table: list[dict], configs: list[str], env,
            keys) -> tuple[int, list[dict]] | None:
  """Publishes this process's decision; returns a peer's that the job held first (kept here), else None."""
  if not turn_.shared:
    return None
  ours = _encoded(winner, table)
  held = turn_.settle(ours)
  if held == ours:
    return None
  found = _decoded(held, configs)
  if found is not None:
    _keep(found[1], env, keys)
  return found


def _encoded(winner: int, table: list[dict]) -> bytes:
  rows = [{"config": row["config"], "us": row["us"], "error": row["error"]} for row in table]
  return json.dumps({"format": _FORMAT, "winner": winner, "table": rows}, sort_keys=True).encode()


def _decoded(payload: bytes, configs: list[str]) -> tuple[int, list[dict]] | None:
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
  return winner, table


def _keep(table: list[dict], env, keys) -> None:
  """Keeps a peer's timings here as this process's own would be (what autotune.py stores of a timing)."""
  for key, row in zip(keys, table):
    timing = tuning_records.Timing(row["us"], row["error"])
    if key is not None and (timing.us is not None or tuning_failures.lasting(timing.error)):
      tuning_records.store(env, key, timing)
