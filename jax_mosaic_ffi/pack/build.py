"""A pack built from recordings (toolchain/pack_record.py) and tuning files (transforms/tuning_records.py).

Every recorded entry goes in as it was recorded. Each recorded autotuning decision is looked up in the tuning
files measured on GPUs of the arch it was recorded for: where a file times every config the call builds (at least
one of them successfully), those timings go in, keyed for that GPU model (`tuning_records.pack_key`), and the
winner is listed; where none does, the call is listed as untuned for that model, with why. Compiles a front end
refused while recording are listed per kernel and arch.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
from typing import Iterable

import jax

from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.module_format import Arch
from jax_mosaic_ffi.toolchain import pack_record
from jax_mosaic_ffi.transforms import tuning_failures
from jax_mosaic_ffi.transforms import tuning_records


@dataclasses.dataclass
class Built:
  entries: list[pack_file.Entry]
  notes: dict[str, list[dict]]
  created: dict


def capability(arch: str) -> str:
  """An arch's compute capability as a tuning file names it: sm_90a -> "9.0", sm_100 -> "10.0"."""
  number = Arch.parse(arch).number
  return f"{number // 10}.{number % 10}"


def build(recording: pack_record.Recording,
          tuning: Iterable[tuple[str, tuning_records.Environment, list]] = ()) -> Built:
  """The pack's contents: ``tuning`` holds (file, environment, timings) of each tuning file."""
  tuning = list(tuning)
  entries = [pack_file.Entry(r.key, r.kind, r.payload, r.about) for r in recording.entries.values()]
  notes = {"winners": [], "untuned": [], "refused": []}
  for decision in _unique(recording.tuning):
    found = _winners(decision, tuning)
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
  return Built(entries, notes, created)


def _measured_for(arch: str, env: tuning_records.Environment) -> bool:
  """Whether a tuning file measured on ``env``'s GPU times the kernels recorded for ``arch``: a GPU of that compute
  capability, or for a family target (sm_100f) any GPU of the family (each model keeps its own winners)."""
  wanted = capability(arch)
  if not arch.endswith("f"):
    return env.compute_capability == wanted
  major, _, minor = str(env.compute_capability).partition(".")
  return major == wanted.split(".")[0] and minor.isdigit() and int(minor) >= int(wanted.split(".")[1])


def _winners(decision: dict, tuning: list) -> Built:
  """The packed timings of one decision for each GPU model tuned for its arch, and its notes."""
  out = Built([], {"winners": [], "untuned": []}, {})
  name, signature = _text(decision.get("name")), _text(decision.get("signature"))
  shapes = _text(decision.get("shapes"))
  rows = decision.get("configs") if isinstance(decision.get("configs"), list) else []
  keys = [tuning_records.TimingKey(name, str(row.get("config")), tuple(str(x) for x in row["launches"]),
                                   str(decision.get("signature")))
          if isinstance(row, dict) and isinstance(row.get("launches"), list) else None for row in rows]
  for arch in decision.get("recorded_for") or ():
    wanted = capability(str(arch))
    files = [(path, env, dict(timings)) for path, env, timings in tuning if _measured_for(str(arch), env)]
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
      for k, timing in found.items():
        about = {"name": name, "device": env.device, "compute_capability": env.compute_capability,
                 "config": keys[k].config, "signature": signature[:pack_file.MAX_TEXT]}
        out.entries.append(pack_file.Entry(tuning_records.pack_key(env.device, env.compute_capability, keys[k]),
                                           "tuning", tuning_records.pack_payload(timing), about))
      best = min((k for k, t in found.items() if t.us is not None), key=lambda k: found[k].us)
      out.notes["winners"].append({"name": name, "shapes": shapes, "device": env.device,
                                   "compute_capability": env.compute_capability, "config": keys[best].config,
                                   "us": f"{found[best].us:.2f}"})
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
