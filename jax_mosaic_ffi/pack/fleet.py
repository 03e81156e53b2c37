"""``python -m jax_mosaic_ffi.pack check PACK --fleet sm_90,sm_100,...``: how each node of a fleet would be served by
a pack, told on a machine without a GPU, for CI to fail where a node would.

For each compute capability of the fleet, a node looks kernels up by the keys of its default targets: its own arch
(sm_103); where the pack was not recorded for it, by the store's rule (store/targets.py) and with no setting, the
family target it was recorded for (sm_100f), then an older arch whose PTX it can JIT; this only for a compile whose
entry holds such an image (NVRTC's, the CuTe DSL's): another (Triton's sm_100a for sm_100f) needs the node told the
target (``JAX_MOSAIC_FFI_TARGETS=sm_100f``). From each entry it reaches, the runtime's own rule
(`module_format.served_image`) picks what the node would load: an exact cubin, a family or generic cubin of its
major version, PTX the driver compiles there at the first launch (JIT), or nothing. For each autotuned call and GPU
model (``--gpus``, as ``jax.devices()[0].device_kind`` names it), whether the pack holds its winner: winners are
per GPU model and stand in for another one only where the pack was built asking for it (``--alias-winners``), which
the report says, naming the model it was measured on.

Everything short of an exact or family cubin, every compile refused while recording, a pack without a single
compile and a call without a winner is a problem: `check` lists each and `problems` counts them.
"""

from __future__ import annotations

import dataclasses

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.module_format import Arch, ImageKind
from jax_mosaic_ffi.pack import contents
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store import targets as store_targets


@dataclasses.dataclass(frozen=True)
class Served:
  """How one kernel would be served on one compute capability: ``how`` is "exact cubin", "family cubin",
  "PTX JIT" or "missing"; ``detail`` says which image, under which setting, or why not."""

  how: str
  detail: str

  @property
  def ok(self) -> bool:
    return self.how in ("exact cubin", "family cubin")


def parse_fleet(text: str) -> list[int]:
  """``sm_90,sm_100,sm_103`` (or ``9.0,10.3``) as compute capabilities (90, 100, 103); raises ValueError."""
  found = []
  for part in filter(None, (p.strip() for p in text.split(","))):
    major, dot, minor = part.partition(".")
    arch = Arch(int(major) * 10 + int(minor)) if dot and major.isdigit() and minor.isdigit() else Arch.parse(part)
    if arch.suffix:
      raise ValueError(f"{part} is a compile target; the fleet names GPUs as they report their arch: "
                       f"sm_{arch.number}")
    found.append(arch.number)
  if not found:
    raise ValueError("name at least one GPU arch: --fleet sm_90,sm_100")
  return list(dict.fromkeys(found))


def _images(entry: pack_file.Entry) -> list[tuple[ImageKind, Arch]] | None:
  names = entry.about.get("images")
  if not isinstance(names, list) or not names:
    return None
  try:
    return [module_format.parse_image_name(n) for n in names]
  except ValueError:
    return None


def _reached_by(capability: int, recorded: set[str]) -> list[str]:
  """The default targets a node of ``capability`` may key its kernels by, among those recorded, best first: its own
  arch, else those whose entries serve it (store/targets.py: its family's, then older archs')."""
  own = f"sm_{capability}"
  return [own] if own in recorded else store_targets.reaching(capability, recorded)


def _setting(entry: pack_file.Entry, target: str, capability: int) -> str:
  """What a node of ``capability`` needs to reach ``entry``, recorded for ``target``: nothing for its own arch or
  for an entry holding a family or PTX image (the store looks those up by itself); else the targets setting."""
  images = _images(entry) or []
  if target == f"sm_{capability}" or any(arch.suffix == "f" or kind == ImageKind.PTX for kind, arch in images):
    return ""
  return f"with {flags.TARGETS}={target} on the node"


def misses(pack: pack_file.Pack, recording) -> list[str]:
  """What a program's ``recording`` (pack/recordings.py) used that ``pack`` does not hold: each compile, with
  the nearest packed one and what differs, and each compile that failed."""
  found = []
  for entry in recording.entries.values():
    if entry.kind == "compile" and entry.key not in pack.entries:
      about = entry.about
      line = packs.nearest(about, [pack]).strip().replace("\n", " ")
      found.append(f"{contents.shown(about.get('front_end'))} '{contents.shown(about.get('kernel'))}' for "
                   f"{contents.shown(about.get('targets'))} at {contents.shown(about.get('call_sites'))} is not in "
                   f"the pack" + (f"; {line}" if line else ""))
  for failure in recording.failed:
    found.append(f"{contents.shown(failure.get('front_end'))} '{contents.shown(failure.get('kernel'))}' failed: "
                 f"{contents.shown(contents.first_line(failure.get('error')))}")
  return found


def serving(entry: pack_file.Entry, capability: int, setting: str) -> Served:
  """How ``entry`` would be served on a GPU of ``capability`` (the runtime's rule on its images)."""
  images = _images(entry)
  if images is None:
    return Served("missing", "the pack does not say which images this compile holds (recorded by an older "
                             "release): record the pack again")
  index = module_format.served_image(images, capability)
  if index is None:
    held = ", ".join(module_format.image_name(k, a) for k, a in images)
    return Served("missing", f"none of its images ({held}) loads on sm_{capability}")
  kind, arch = images[index]
  where = f" {setting}" if setting else ""
  if kind == ImageKind.PTX:
    return Served("PTX JIT", f"{module_format.image_name(kind, arch)}{where}: the driver compiles it on the node "
                             "at the first launch; record a cubin for this arch")
  return Served("exact cubin" if arch.number == capability and arch.suffix != "f" else "family cubin",
                f"{module_format.image_name(kind, arch)}{where}")


def kernels(pack: pack_file.Pack) -> dict[tuple[str, str, str], list[pack_file.Entry]]:
  """The pack's compiles, grouped by what they compile: (front end, kernel, specialization)."""
  found: dict[tuple[str, str, str], list[pack_file.Entry]] = {}
  for entry in pack.entries.values():
    if entry.kind == "compile":
      about = entry.about
      found.setdefault((str(about.get("front_end", "?")), str(about.get("kernel", "?")),
                        str(about.get("specialization", ""))), []).append(entry)
  return found


def kernel_serving(entries: list[pack_file.Entry], capability: int) -> Served:
  """How a kernel (its compiles for every recorded target) would be served on a GPU of ``capability``."""
  recorded = {t for e in entries for t in _list(e.about.get("recorded_for"))}
  for target in _reached_by(capability, recorded):
    reached = [e for e in entries if target in _list(e.about.get("recorded_for"))]
    served = [serving(e, capability, _setting(e, target, capability)
                      or (f"(the node takes {target}'s entry by itself: no setting)"
                          if target != f"sm_{capability}" else "")) for e in reached]
    best = next((s for s in served if s.ok), served[0] if served else None)
    if best is not None:
      return best
  return Served("missing", f"not recorded for sm_{capability} (record with --arch sm_{capability}, or with a family "
                           f"target sm_{capability // 10 * 10}f where its front end builds one)")


def winners(pack: pack_file.Pack, gpus: list[str]) -> list[tuple[str, str, str]]:
  """(call, GPU model, what `check` says: "winner in the pack", aliased from which model, or "PROBLEM: " and why
  it has none) for each autotuned call and GPU model: the models named, or else those the pack's notes name; a
  recorded call with no tuning file for its arch counts as one without."""
  calls = {(str(n.get("name")), contents.shown(n.get("shapes"))) for name in ("winners", "untuned")
           for n in pack.notes.get(name, ())}
  won = {(str(n.get("name")), contents.shown(n.get("shapes")), str(n.get("device"))): _won(n)
         for n in pack.notes["winners"]}
  rows = []
  for name, shapes in sorted(calls):
    call = f"{name} {shapes}"
    if gpus:
      for gpu in gpus:
        rows.append((call, gpu, won.get((name, shapes, gpu)) or "PROBLEM: no winner in the pack (measure one on "
                     "that GPU with jmf.save_tuning and record with --tuning FILE)"))
      continue
    for note in pack.notes["winners"]:
      if (str(note.get("name")), contents.shown(note.get("shapes"))) == (name, shapes):
        rows.append((call, str(note.get("device")), _won(note)))
    for note in pack.notes["untuned"]:
      if (str(note.get("name")), contents.shown(note.get("shapes"))) == (name, shapes):
        model = note.get("device") or f"GPUs of {contents.shown(note.get('recorded_for'))}"
        rows.append((call, str(model), f"PROBLEM: {note.get('why') or 'no winner'}"))
  return rows


def _won(note) -> str:
  """What `check` says of a winner note: in the pack, and measured on which model where it was aliased."""
  source = note.get("aliased_from")
  return "winner in the pack" + (f" (aliased: measured on {contents.shown(source)}, asked for with --alias-winners)"
                                 if source else "")


def settings_differences(pack: pack_file.Pack, here: dict[str, list[str]]) -> list[str]:
  """Where the keyed settings a pack's compiles were made under (each entry's "settings") differ from ``here``'s
  (by front end: the keyed variables this environment sets): a node with this environment misses those kernels."""
  recorded: dict[str, set[tuple[str, ...]]] = {}
  for entry in pack.entries.values():
    front_end = str(entry.about.get("front_end"))
    if entry.kind == "compile" and "settings" in entry.about and front_end in here:
      recorded.setdefault(front_end, set()).add(tuple(_list(entry.about["settings"])))
  return [f"{front_end} kernels were compiled under {contents.shown(list(made)) if made else 'no keyed setting'}, "
          f"and this environment sets {contents.shown(here[front_end]) if here[front_end] else 'none'}: a node with "
          f"it misses them (unset or set those variables there, or record under the nodes' settings)"
          for front_end, variants in sorted(recorded.items()) for made in sorted(variants)
          if list(made) != here[front_end]]


def check(pack: pack_file.Pack, fleet: list[int], gpus: list[str],
          here: dict[str, list[str]] | None = None) -> tuple[str, int]:
  """The report of how ``fleet`` would be served by ``pack``, and how many problems it names; with ``here`` (the
  keyed settings of the environment `check` runs in, by front end), where the pack's were others."""
  esc = pack_file.escaped
  lines = [f"{esc(pack.path)} (sha256 {pack.digest}) for sm_{', sm_'.join(map(str, fleet))}:"]
  problems = 0
  groups = kernels(pack)
  if not groups:
    lines.append("  PROBLEM: the pack holds no compile (did the recorded program call any kernel?)")
    problems += 1
  for (front_end, kernel, specialization), entries in sorted(groups.items()):
    lines.append(f"  {esc(front_end)} '{esc(kernel)}' ({esc(specialization)[:120]}):")
    for capability in fleet:
      served = kernel_serving(entries, capability)
      problems += not served.ok
      lines.append(f"    sm_{capability}: {'' if served.ok else 'PROBLEM: '}{served.how}: {esc(served.detail)}")
  for note in pack.notes.get("refused", ()):
    problems += 1
    lines.append(f"  PROBLEM: refused while recording: {esc(note.get('front_end'))} '{esc(note.get('kernel'))}' "
                 f"for {contents.shown(note.get('targets'))}: {esc(contents.first_line(note.get('error')))}")
  for difference in settings_differences(pack, here or {}):
    problems += 1
    lines.append(f"  PROBLEM: {difference}")
  for call, gpu, said in winners(pack, gpus):
    problems += said.startswith("PROBLEM: ")
    lines.append(f"  autotuned {esc(call)} on {esc(gpu)}: {esc(said)}")
  lines.append(f"{problems} problem{'s' if problems != 1 else ''}" + (": a node would compile, JIT or time there"
                                                                      if problems else ""))
  return "\n".join(lines), problems


def _list(value) -> list[str]:
  return [str(v) for v in value] if isinstance(value, list) else ([str(value)] if value else [])
