"""Packs merged into one, keeping where each entry came from and naming what they disagree on.

Each entry keeps the pack it came from (``from_pack``: its path and digest, unless an earlier merge named one), and
the merged pack's ``created`` lists every source pack with what made it (jax_mosaic_ffi, jax, toolchains, archs,
tuning files) and the union of each. Entries of one key are one compile or timing: where two packs hold different
bytes for a key, the first pack's are kept and the conflict is named. A note another pack answers is dropped: a
call "without a winner" for a GPU model that another pack has a winner for, a compile "refused" for targets another
pack holds it for; two winners of one call and model that pick different configs are named as a conflict.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from jax_mosaic_ffi.base import pack_file

# What a pack's `created` says of what made it, kept per source pack and as a union.
_MADE_WITH = ("jax_mosaic_ffi", "jax", "jaxlib", "python", "toolchains", "recorded_for", "tuning_files")


@dataclasses.dataclass
class Merged:
  entries: list[pack_file.Entry]
  notes: dict[str, list[dict]]
  created: dict
  conflicts: list[str]


def merged(packs: Iterable[pack_file.Pack]) -> Merged:
  """``packs`` in one (an entry held by several is taken from the first)."""
  packs = list(packs)
  entries: dict[str, pack_file.Entry] = {}
  origin: dict[str, str] = {}
  conflicts: list[str] = []
  for pack in packs:
    source = f"{pack.path} ({pack.digest[:16]})"
    for key, entry in pack.entries.items():
      known = entries.get(key)
      if known is None:
        about = dict(entry.about)
        about.setdefault("from_pack", source)
        entries[key] = pack_file.Entry(key, entry.kind, entry.payload, about)
        origin[key] = source
      elif known.sha256 != entry.sha256:
        what = pack_file.escaped(entry.about.get("kernel") or entry.about.get("name"))
        conflicts.append(f"{entry.kind} {key[:16]} ({what}): {pack_file.escaped(origin[key])} and "
                         f"{pack_file.escaped(source)} hold different bytes; the first's are kept")
  notes = _notes(packs, list(entries.values()), conflicts)
  return Merged(list(entries.values()), notes, _created(packs), conflicts)


def _created(packs: list[pack_file.Pack]) -> dict:
  created = {"merged_from": [_bounded(f"{p.path} ({p.digest[:16]}): " + "; ".join(
      f"{k} {_text(p.created[k])}" for k in _MADE_WITH if k in p.created)) for p in packs][:pack_file.MAX_LIST]}
  for field in _MADE_WITH:
    values = []
    for pack in packs:
      value = pack.created.get(field)
      values += value if isinstance(value, list) else [value] if value else []
    if values:
      created[field] = [_bounded(str(v)) for v in dict.fromkeys(values)][:pack_file.MAX_LIST]
  return created


def _notes(packs: list[pack_file.Pack], entries: list[pack_file.Entry], conflicts: list[str]) -> dict[str, list]:
  notes: dict[str, list[dict]] = {name: [] for name in pack_file.NOTE_LISTS}
  for pack in packs:
    for name in pack_file.NOTE_LISTS:
      notes[name] += [dict(n) for n in pack.notes.get(name, ()) if dict(n) not in notes[name]]
  won: dict[tuple, dict] = {}
  for note in notes["winners"]:
    call = (note.get("name"), _text(note.get("shapes")), note.get("device"))
    first = won.setdefault(call, note)
    if first is not note and first.get("config") != note.get("config"):
      conflicts.append(f"autotuned {pack_file.escaped(call[0])} {pack_file.escaped(call[1])} on "
                       f"{pack_file.escaped(call[2])}: winners {pack_file.escaped(first.get('config'))} and "
                       f"{pack_file.escaped(note.get('config'))} (measured apart: the timings kept decide)")
  notes["untuned"] = [n for n in notes["untuned"] if not n.get("device") or
                      (n.get("name"), _text(n.get("shapes")), n.get("device")) not in won]
  held = {(e.about.get("front_end"), e.about.get("kernel"), _text(e.about.get("targets"))) for e in entries
          if e.kind == "compile"}
  notes["refused"] = [n for n in notes["refused"]
                      if (n.get("front_end"), n.get("kernel"), _text(n.get("targets"))) not in held]
  return notes


def _text(value) -> str:
  return ", ".join(map(str, value)) if isinstance(value, list) else str(value if value is not None else "")


def _bounded(text: str) -> str:
  return text if len(text) <= pack_file.MAX_TEXT else text[:pack_file.MAX_TEXT - 3] + "..."
