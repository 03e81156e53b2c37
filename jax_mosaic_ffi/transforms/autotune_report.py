"""What autotuning decided: every decision of this process (`report`, ``jmf.autotune_report``), each with its table
on the ``jax_mosaic_ffi`` logger (INFO, as the store's cold-start records: store/cold_starts.py), and on stderr
under ``JAX_MOSAIC_FFI_AUTOTUNE_LOG=1``.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.store import cold_starts

# Decisions kept, the oldest dropped past this: a long-running program decides for every new shape.
MAX_REPORTS = 4096
_lock = threading.Lock()
_reports: collections.deque = collections.deque(maxlen=MAX_REPORTS)


def record(entry: dict) -> None:
  """One decision: kept for `report`, logged, and printed when ``JAX_MOSAIC_FFI_AUTOTUNE_LOG`` is on."""
  with _lock:
    _reports.append(entry)
  printed = os.environ.get(flags.AUTOTUNE_LOG, "").strip().lower() not in ("", "0", "off", "false")
  if printed or cold_starts.LOGGER.isEnabledFor(logging.INFO):
    text = _text(entry)
    cold_starts.LOGGER.info("%s", text, extra={"jmf_kernel": entry["name"], "jmf_front_end": "autotune",
                                               "jmf_source": entry["source"]})
    if printed:
      print(text, file=sys.stderr, flush=True)


def report() -> list[dict]:
  """Every autotuning decision of this process, oldest first (the last 4096) (``jmf.autotune_report``).

  Each is a dict:

  - ``"name"``: the autotuned call's name; ``"shapes"``: its inputs' dtypes and shapes;
  - ``"winner"`` and ``"config"``: the chosen config's index and values;
  - ``"source"``: ``"tuned"`` (some configs were timed now), ``"disk"``, ``"file"`` (`load_tuning`), ``"pack"`` or
    ``"memory"`` (every timing was stored already), ``"untuned"`` (no GPU), ``"only config"`` (one config:
    nothing to time);
  - ``"timed"``: the indices of the configs timed now;
  - ``"table"``: one row per config, ``{"config", "us" (median GPU time per call, or None), "error"}``.

  For example, where each decision came from and what it chose::

    >>> [(d["name"], d["source"], d["config"]) for d in jmf.autotune_report()]
    [...]
  """
  with _lock:
    return [dict(r) for r in _reports]


def _text(entry: dict) -> str:
  lines = [f"jax_mosaic_ffi autotune '{entry['name']}' {entry['shapes']}: {entry['source']}, "
           f"winner config {entry['winner']} {entry['config']}"]
  for k, row in enumerate(entry["table"]):
    mark = "*" if k == entry["winner"] else " "
    time_text = f"{row['us']:10.2f} us" if row.get("us") is not None else "    failed   "
    lines.append(f" {mark} {k:3d} {time_text}  {row['config']}" + (f"  ({row['error']})" if row.get("error") else ""))
  return "\n".join(lines)
