"""Autotuning and kernel packs: a decision recorded for a pack, and the strict mode's error for one a pack lacks.

Recording (``JAX_MOSAIC_FFI_PACK_RECORD``, store/pack_record.py) runs where nothing can be timed (the CPU of a
CI runner): there every config of an autotuned call is built, so that its kernels go into the pack (a machine
serving from the pack builds every config too, to key the stored timings), and the decision is noted with each
config's timing key. The pack's builder (python -m jax_mosaic_ffi.pack) finds those keys in the tuning files
measured on each GPU model and packs their timings: the winner is then known there without timing anything.
"""

from __future__ import annotations

from typing import Sequence

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import NotInPacks
from jax_mosaic_ffi.store import pack_record
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store import tuning_records


def recording() -> bool:
  return pack_record.on()


def record(name: str, shapes: list[str], keys: Sequence[tuning_records.TimingKey | None], configs: list[str],
           launches: Sequence, default: int) -> None:
  """Notes an autotuning decision for a pack: each config's timing key, or how it failed to build."""
  rows = []
  for key, config, found in zip(keys, configs, launches):
    if key is None:
      rows.append({"config": config, "error": str(found)[:2000]})
    else:
      rows.append({"config": key.config, "launches": list(key.launches)})
  signature = next((k.signature for k in keys if k is not None), "")
  pack_record.note("tuning", {"name": name, "shapes": shapes, "signature": signature, "default": default,
                              "configs": rows, "call_sites": [source_location.current()]})


def missing(name: str, shapes: list[str], env: tuning_records.Environment, untimed: list[str]) -> NotInPacks:
  """The strict mode's error for an autotuned call whose configs the packs hold no timings of on this GPU."""
  error = packs.missing({"front_end": "autotuned call", "kernel": name, "call_sites": [source_location.current()],
                         "specialization": f"inputs {', '.join(shapes)}; configs not timed on {env.device} "
                                           f"(compute capability {env.compute_capability}): {'; '.join(untimed)}",
                         "targets": [f"sm_{env.compute_capability.replace('.', '')}"]
                         if env.compute_capability.replace(".", "").isdigit() else []},
                        doing="timing its configs")
  return NotInPacks(name, f"{error}\nIts winners come from tuning files measured on this GPU model "
                          "(jmf.save_tuning there): pass them to the record command with --tuning FILE.")
