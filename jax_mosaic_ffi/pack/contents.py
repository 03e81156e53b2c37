"""A pack's contents: listed (kernels, specializations, archs, sizes, toolchains, where each came from), and
entries for archs not wanted pruned."""

from __future__ import annotations

import json
from typing import Iterable

from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.module_format import Arch


def as_json(pack: pack_file.Pack) -> dict:
  return {"path": pack.path, "digest": pack.digest, "bytes": pack.size, "created": dict(pack.created),
          "entries": [{"key": e.key, "kind": e.kind, "bytes": len(e.payload), "sha256": e.sha256, **e.about}
                      for e in pack.entries.values()],
          **{name: [dict(n) for n in notes] for name, notes in pack.notes.items()}}


def listing(pack: pack_file.Pack) -> str:
  """The pack as text: what made it, then each compile (grouped by front end and kernel), the autotuning winners,
  the calls without one and the compiles a front end refused."""
  lines = [f"{pack_file.escaped(pack.path)}: {len(pack.entries)} entries, {pack.size} bytes, sha256 {pack.digest}"]
  lines += [f"  {pack_file.escaped(k)}: {shown(v)}" for k, v in pack.created.items()]
  compiles = [e for e in pack.entries.values() if e.kind == "compile"]
  specializations = sum(e.kind == "specialization" for e in pack.entries.values())
  lines.append(f"\ncompiles ({len(compiles)}; and {specializations} Triton specializations):")
  for e in sorted(compiles, key=lambda e: (str(e.about.get("front_end")), str(e.about.get("kernel")))):
    a = e.about
    lines.append(f"  {shown(a.get('front_end', '?'))} '{shown(a.get('kernel', '?'))}' for "
                 f"{shown(a.get('targets', '?'))}, {len(e.payload)} bytes, {shown(a.get('toolchain', '?'))}")
    lines.append(f"      {shown(a.get('specialization', ''))}")
    lines.append(f"      recorded for {shown(a.get('recorded_for', '?'))} at {shown(a.get('call_sites', '?'))}; "
                 f"key {e.key[:16]}" + (f"; from {shown(a['from_pack'])}" if a.get("from_pack") else ""))
  sections = (("winners", "autotuning winners", "{name} {shapes} on {device} ({compute_capability}): {config} "
                                                 "({us} us){aliased_from}"),
              ("untuned", "autotuned calls without a winner (they would time their configs there)",
               "{name} {shapes} on {device}{recorded_for}: {why}"),
              ("refused", "compiles that failed while recording (not in the pack)",
               "{front_end} '{kernel}' for {targets} (recorded for {recorded_for}) at {call_sites}: {error}"))
  for name, title, line in sections:
    notes = pack.notes.get(name, ())
    if notes:
      lines.append(f"\n{title} ({len(notes)}):")
      for note in notes:
        values = {k: shown(note.get(k, "")) for k in ("name", "shapes", "device", "compute_capability", "config",
                                                       "us", "recorded_for", "why", "front_end", "kernel",
                                                       "targets", "call_sites", "error")}
        values["aliased_from"] = f"; aliased: measured on {shown(note['aliased_from'])}" if note.get(
            "aliased_from") else ""
        if name == "untuned" and not note.get("device"):
          values["device"] = "GPUs"
          values["recorded_for"] = f" of {values['recorded_for']}"
        lines.append("  " + first_line(line.format(**values)))
  return "\n".join(lines)


def pruned(pack: pack_file.Pack, keep: Iterable[str]) -> tuple[list[pack_file.Entry], dict, dict]:
  """(entries, notes, created) of ``pack`` less what is for none of the archs ``keep`` (GPU generations: sm_90a and
  sm_90 alike). A compile made for several targets stays when one of them is kept: its module is one entry."""
  numbers = {Arch.parse(a).number for a in keep}

  def wanted(archs) -> bool:
    archs = [archs] if isinstance(archs, str) else list(archs or ())
    return not archs or any(_number(a) in numbers for a in archs)

  def capability_wanted(note_or_about) -> bool:
    cc = note_or_about.get("compute_capability")
    return wanted(note_or_about.get("recorded_for")) if not cc else _capability_number(cc) in numbers

  entries = [e for e in pack.entries.values()
             if (capability_wanted(e.about) if e.kind == "tuning" else wanted(e.about.get("targets")))]
  notes = {name: [dict(n) for n in pack.notes.get(name, ())
                  if (wanted(n.get("targets")) and wanted(n.get("recorded_for")) if name == "refused"
                      else capability_wanted(n))] for name in pack_file.NOTE_LISTS}
  created = {**pack.created, "pruned_to": sorted(f"sm_{n}" for n in numbers)}
  return entries, notes, created


def _number(arch: str) -> int | None:
  try:
    return Arch.parse(arch).number
  except ValueError:
    return None


def _capability_number(cc: str) -> int | None:
  major, _, minor = str(cc).partition(".")
  return int(major) * 10 + int(minor) if major.isdigit() and minor.isdigit() else None


def shown(value) -> str:
  """A manifest's value as text (a list joined with commas), escaped (`pack_file.escaped`)."""
  if isinstance(value, (list, tuple)):
    return pack_file.escaped(", ".join(map(str, value)) or "-")
  return pack_file.escaped(str(value) if not isinstance(value, dict) else json.dumps(value))


def first_line(value) -> str:
  """The first line of a note's text ("" for none): what a listing shows of an error or a reason."""
  lines = str(value or "").splitlines()
  return lines[0] if lines else ""
