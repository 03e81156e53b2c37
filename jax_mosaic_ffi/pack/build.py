"""A pack built from recordings (pack/recordings.py) and tuning files (store/tuning_records.py).

Every recorded entry goes in as it was recorded. Each recorded autotuning decision is looked up in the tuning
files measured on GPUs of the arch it was recorded for: where a file times every config the call builds (at least
one of them successfully), those timings go in, keyed for that GPU model (`tuning_records.pack_key`), and the
winner is listed; where none does, the call is listed as untuned for that model, with why. Compiles a front end
refused while recording are listed per kernel and arch.

Winners are per GPU model: one measured on an H100 SXM is never used on an H100 PCIe unless the user asks, by an
`Alias` (``--alias-winners "NVIDIA H100 PCIe=NVIDIA H100 80GB HBM3"``). Then the source model's timings go in a second
time, keyed for the target model, and its winner note says ``aliased_from``: `pack check` and `pack list` show it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
from typing import Iterable

import jax

from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.module_format import Arch
from jax_mosaic_ffi.pack import recordings
from jax_mosaic_ffi.store import tuning_failures
from jax_mosaic_ffi.store import tuning_records


@dataclasses.dataclass(frozen=True)
class Alias:
  """The winners measured on GPU model ``source`` stand for GPU model ``target`` too (of compute capability
  ``capability``: the source's where None), which has no tuning file of its own."""

  target: str
  source: str
  capability: str | None = None

  @property
  def shown(self) -> str:
    return f"{self.target}{f'@{self.capability}' if self.capability else ''}={self.source}"


def parse_aliases(texts: Iterable[str]) -> list[Alias]:
  """``TARGET=SOURCE`` pairs (comma-separated, or one per text), a target as ``MODEL`` or ``MODEL@9.0`` (a model of
  another compute capability of the family: a B300 takes a B200's winners as ``NVIDIA B300@10.3=NVIDIA B200``);
  raises ValueError naming a malformed pair."""
  found = []
  for text in texts:
    for pair in filter(None, (p.strip() for p in text.split(","))):
      target, equals, source = (part.strip() for part in pair.partition("="))
      model, at, cc = (part.strip() for part in target.partition("@"))
      major, dot, minor = cc.partition(".")
      if not equals or not model or not source or (at and not (dot and major.isdigit() and minor.isdigit())):
        raise ValueError(f"{pair!r} is not TARGET=SOURCE (GPU models as jax names them, a target optionally with "
                         "its compute capability): \"NVIDIA H100 PCIe=NVIDIA H100 80GB HBM3\"")
      if model == source and not at:
        raise ValueError(f"{pair!r} aliases a model to itself")
      found.append(Alias(_text(model), _text(source), cc or None))
  return list(dict.fromkeys(found))


@dataclasses.dataclass
class Built:
  entries: list[pack_file.Entry]
  notes: dict[str, list[dict]]
  created: dict


def capability(arch: str) -> str:
  """An arch's compute capability as a tuning file names it: sm_90a -> "9.0", sm_100 -> "10.0"."""
  number = Arch.parse(arch).number
  return f"{number // 10}.{number % 10}"


def build(recording: recordings.Recording,
          tuning: Iterable[tuple[str, tuning_records.Environment, list]] = (), aliases: Iterable[Alias] = ()) -> Built:
  """The pack's contents: ``tuning`` holds (file, environment, timings) of each tuning file; ``aliases`` the GPU
  models that take another model's winners. Raises ValueError for an alias whose source no tuning file was measured
  on, or whose target has a tuning file of its own (its own winners are the ones to use)."""
  tuning, aliases = list(tuning), list(aliases)
  measured = {env.device for _, env, _ in tuning}
  for alias in aliases:
    if alias.target in measured:
      raise ValueError(f"{alias.shown}: a tuning file given was measured on {alias.target}, so its own winners "
                       "are used: drop the alias or that file")
    if alias.source not in measured:
      raise ValueError(f"{alias.shown}: no tuning file given was measured on {alias.source} (measured on: "
                       f"{', '.join(sorted(measured)) or 'none'})")
  entries = [pack_file.Entry(r.key, r.kind, r.payload, r.about) for r in recording.entries.values()]
  notes = {"winners": [], "untuned": [], "refused": []}
  for decision in _unique(recording.tuning):
    found = _winners(decision, tuning, aliases)
    for entry in found.entries:
      if all(e.key != entry.key for e in entries):
        entries.append(entry)
    notes["winners"] += found.notes["winners"]
    notes["untuned"] += found.notes["untuned"]
  for failure in _unique(recording.failed):
    notes["refused"].append({k: _text(failure.get(k)) for k in ("front_end", "kernel", "specialization", "targets",
                                                                  "recorded_for", "call_sites", "error")
                             if failure.get(k) is not None})
  toolchains = sorted({str(e.about["toolchain"]) for e in entries if e.about.get("toolchain")})
  archs = sorted({a for e in entries for a in e.about.get("recorded_for", ())})
  created = {"jax_mosaic_ffi": _version("jax_mosaic_ffi"), "jax": jax.__version__, "jaxlib": _version("jaxlib"),
             "python": platform.python_version(), "toolchains": toolchains, "recorded_for": archs,
             "tuning_files": [f"{path}: {env.device} ({env.compute_capability})" for path, env, _ in tuning]}
  if aliases:
    created["aliased_winners"] = [alias.shown for alias in aliases][:pack_file.MAX_LIST]
  return Built(entries, notes, created)


def _measured_for(arch: str, compute_capability: str) -> bool:
  """Whether a GPU of ``compute_capability`` runs the kernels recorded for ``arch`` (so a tuning file measured on it
  times them): a GPU of that compute capability, or for a family target (sm_100f) any GPU of the family (each model
  keeps its own winners)."""
  wanted = capability(arch)
  if not arch.endswith("f"):
    return compute_capability == wanted
  major, _, minor = str(compute_capability).partition(".")
  return major == wanted.split(".")[0] and minor.isdigit() and int(minor) >= int(wanted.split(".")[1])


def _winners(decision: dict, tuning: list, aliases: list[Alias]) -> Built:
  """The packed timings of one decision for each GPU model tuned for its arch (and each model aliased to one),
  and its notes."""
  out = Built([], {"winners": [], "untuned": []}, {})
  name, signature = _text(decision.get("name")), _text(decision.get("signature"))
  shapes = _text(decision.get("shapes"))
  rows = decision.get("configs") if isinstance(decision.get("configs"), list) else []
  keys = [tuning_records.TimingKey(name, str(row.get("config")), tuple(str(x) for x in row["launches"]),
                                   str(decision.get("signature")))
          if isinstance(row, dict) and isinstance(row.get("launches"), list) else None for row in rows]
  for arch in decision.get("recorded_for") or ():
    wanted = capability(str(arch))
    files = [(path, env, dict(timings)) for path, env, timings in tuning
             if _measured_for(str(arch), env.compute_capability)]
    if not files:
      out.notes["untuned"].append({"name": name, "shapes": shapes, "recorded_for": str(arch),
                                   "why": f"no tuning file measured on a GPU of compute capability {wanted} was given "
                                          "(--tuning FILE, from jmf.save_tuning on such a GPU)"})
    for path, env, timings in files:
      found = {k: timings.get(key) for k, key in enumerate(keys) if key is not None}
      untimed = [k for k, t in found.items() if t is None or (t.us is None and not tuning_failures.lasting(t.error))]
      if untimed or not any(t.us is not None for t in found.values()):
        why = (f"{path} has no timing of config(s) {', '.join(str(k) for k in untimed)}" if untimed
               else f"every config failed in {path}")
        out.notes["untuned"].append({"name": name, "shapes": shapes, "device": env.device,
                                     "compute_capability": env.compute_capability, "why": why})
        continue
      best = min((k for k, t in found.items() if t.us is not None), key=lambda k: found[k].us)
      models = [(env.device, env.compute_capability, None)] + [
          (a.target, a.capability or env.compute_capability, env.device) for a in aliases
          # A model of another compute capability only where the recorded kernels run there (a family target).
          if a.source == env.device and _measured_for(str(arch), a.capability or env.compute_capability)]
      for device, cc, source in models:
        for k, timing in found.items():
          about = {"name": name, "device": device, "compute_capability": cc, "config": keys[k].config,
                   "signature": signature[:pack_file.MAX_TEXT]}
          out.entries.append(pack_file.Entry(tuning_records.pack_key(device, cc, keys[k]), "tuning",
                                             tuning_records.pack_payload(timing), about))
        out.notes["winners"].append({"name": name, "shapes": shapes, "device": device, "compute_capability": cc,
                                     "config": keys[best].config, "us": f"{found[best].us:.2f}",
                                     **({"aliased_from": f"{source} ({env.compute_capability})"} if source else {})})
  return out


def _unique(documents: list[dict]) -> list[dict]:
  seen, out = set(), []
  for d in documents:
    marker = repr(sorted(d.items(), key=lambda item: item[0]))
    if marker not in seen:
      seen.add(marker)
      out.append(d)
  return out


def _text(value) -> str | list[str]:
  """A recorded value as a manifest holds it: text, or a list of text, each bounded."""
  if isinstance(value, (list, tuple)):
    return [_text(v) for v in value][:pack_file.MAX_LIST]
  text = str(value) if value is not None else ""
  return text if len(text) <= pack_file.MAX_TEXT else text[:pack_file.MAX_TEXT - 3] + "..."


def _version(distribution: str) -> str:
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return "unknown"
