"""Kernel packs as a cache tier: compiles and autotuning winners served from pack files, ahead of the disk cache.

The packs in use are those `load_pack` was given (first, in the order given), then those of
``JAX_MOSAIC_FFI_PACKS`` (read at each lookup, separated by ``:``). Each is read and verified whole
(base/pack_file.py) the first time it is needed, then kept: on a machine with GPUs, only the compiles that would
load on one of them (by the runtime's image rule: `module_format.served_image`) are held, so a process per GPU does
not hold every generation's kernels (all are held where ``JAX_MOSAIC_FFI_TARGETS`` is set); a pack that is
refused raises its `PackError` at every lookup, so a deployment whose pack is damaged never quietly compiles.
`lookup` answers by the store's own entry key (a compile's, store/compile_cache.py), so a pack serves exactly what
a compile would make here; store/pack_tier.py is the packs as a tier of the store.

``JAX_MOSAIC_FFI_PACKS_STRICT=1`` makes a compile the packs cannot serve an error (`NotInPacks`), raised by
`missing` with the kernel, its call site, its specialization and the command that adds it.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from typing import Any, Callable, Mapping

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.errors import NotInPacks, PackError
from jax_mosaic_ffi.base.module_format import Arch

PACKS_ENV = flags.PACKS
STRICT_ENV = flags.PACKS_STRICT

_lock = threading.Lock()
_called: list[str] = []                                    # load_pack's paths, in order
_read: dict[str, pack_file.Pack | PackError] = {}          # by path as named: the pack, or why it is refused
_recorded: dict[str, frozenset[str]] = {}                   # by path: the targets its compiles were recorded for


def load_pack(path: str | os.PathLike) -> int:
  """Puts the kernel pack at ``path`` ahead of the disk cache (and of the packs named in ``JAX_MOSAIC_FFI_PACKS``)
  for this process; returns how many of its entries this process holds (on a machine with GPUs, the compiles
that load on none of them are left out). The pack is read and verified whole now: a file that is
  not a pack of yours, is damaged or of another pack format version raises `PackError` naming it and what to do,
  and nothing of it is used. Then each kernel it holds is taken from it instead of compiled, on any machine
  (``JAX_MOSAIC_FFI_PACKS`` does the same from the environment; :doc:`deploying </guides/deploying>` makes one)::

    >>> import os
    >>> if os.path.exists("model.jmfpack"):   # made in CI by: python -m jax_mosaic_ffi.pack record ...
    ...   jmf.load_pack("model.jmfpack")
  """
  path = os.fspath(path)
  pack = _pack(path)
  with _lock:
    if path not in _called:
      _called.append(path)
  return len(pack.entries)


def paths() -> list[str]:
  """The packs in use, in lookup order."""
  named = [p for p in os.environ.get(PACKS_ENV, "").split(os.pathsep) if p.strip()]
  with _lock:
    called = list(_called)
  return called + [p for p in named if p not in called]


def active() -> list[pack_file.Pack]:
  """The packs in use, each verified; raises the `PackError` of one that is refused."""
  return [_pack(p) for p in paths()]


def recorded_targets() -> frozenset[str]:
  """The targets the compiles of the packs in use were recorded for (their entries' ``recorded_for``)."""
  found: set[str] = set()
  for path in paths():
    with _lock:
      held = _recorded.get(path)
    if held is None:
      held = frozenset(str(t) for e in _pack(path).entries.values() if e.kind == "compile"
                       for t in (e.about.get("recorded_for") or ()))
      with _lock:
        _recorded[path] = held
    found |= held
  return frozenset(found)


def lookup(entry_key: str, kind: str) -> pack_file.Entry | None:
  """The entry ``entry_key`` of the first pack in use that holds one of ``kind``, or None. The strict mode's setting
  is checked here too: a value that is neither on nor off is an error at the first kernel, not at the first miss."""
  strict()
  for pack in active():
    entry = pack.entries.get(entry_key)
    if entry is not None and entry.kind == kind:
      return entry
  return None


def strict() -> bool:
  """Whether ``JAX_MOSAIC_FFI_PACKS_STRICT`` is on; a value that is neither on nor off is an error."""
  return flags.switch(STRICT_ENV, False, on="a kernel missing from the packs is an error", off="it compiles")


def missing(about: Mapping[str, Any], why: str = "", doing: str = "compiling it", fix: str = "") -> NotInPacks:
  """The strict mode's error for a compile the packs cannot serve (``doing``: what it would do instead; ``fix``:
  what to do, where recording the program is not it). ``about``: what the front end says of it (kernel, front_end,
  specialization, targets, call_sites)."""
  kernel = str(about.get("kernel", "?"))
  where = ", ".join(about.get("call_sites") or ()) or "<unknown call site>"
  targets = ", ".join(about.get("targets") or ()) or "?"
  in_use = paths()
  held = f"the packs in use ({', '.join(in_use)})" if in_use else f"no pack (set {PACKS_ENV} or call jmf.load_pack)"
  program = shlex.join(["python", *sys.argv]) if sys.argv and sys.argv[0] else "python your_program.py"
  arch = _family(about) or ",".join(dict.fromkeys(_gpu(t) for t in about.get("targets") or ())) or "sm_90"
  shipped = in_use[0] if in_use else "model.jmfpack"
  return NotInPacks(kernel, (
      f"{about.get('front_end', 'kernel')} '{kernel}' at {where} is not in {held}, and {STRICT_ENV}=1 forbids "
      f"{doing} here{f' ({why})' if why else ''}.\n"
      f"  specialization: {about.get('specialization', '?')}\n  targets: {targets}\n{nearest(about)}" + (fix or (
          f"Add it to the pack: record the program that makes this call (it runs on the CPU, without a GPU) into a "
          f"new pack, and merge it with the one you ship, e.g.\n"
          f"  python -m jax_mosaic_ffi.pack record new.jmfpack --arch {arch} -- {program}\n"
          f"  python -m jax_mosaic_ffi.pack merge merged.jmfpack {shlex.quote(shipped)} new.jmfpack\n"
          "then ship the merged pack (or unset the strict mode to compile it here)."))))


# What a pack's entry says of its compile that a node's own can differ in: the compiler release, the targets, the
# specialization (options, types, constexprs), the keyed settings of the environment.
_INGREDIENTS = ("toolchain", "targets", "specialization", "settings")


def nearest(about: Mapping[str, Any], among: list[pack_file.Pack] | None = None) -> str:
  """A line naming the packed compile nearest this one (the same front end and kernel under another key) and the
  ingredients of the key that differ, or "" where the packs (``among``, else those in use) hold none: why a kernel
  the listing shows is missed."""
  same = []
  try:
    for pack in active() if among is None else among:
      same += [(pack, e) for e in pack.entries.values() if e.kind == "compile" and
               e.about.get("kernel") == about.get("kernel") and e.about.get("front_end") == about.get("front_end")]
  except PackError:
    return ""
  if not same:
    return ""

  def differs(entry) -> list[str]:
    return [f"{field}: {_shown(entry.about.get(field))} in the pack, {_shown(about.get(field))} here"
            for field in _INGREDIENTS if _shown(entry.about.get(field)) != _shown(about.get(field))]

  # An entry whose target serves this GPU (its family's) first: the one a fix would build on.
  pack, entry = min(same, key=lambda found: (len(differs(found[1])), not _serves_here(found[1].about, about)))
  found = differs(entry) or ["nothing the pack says of it: the source, a header it read or a value its key "
                             "reads differs"]
  pruned = pack.created.get("pruned_to")
  if pruned and not any(_gpu(t) in pruned for t in about.get("targets") or ()):
    found.append(f"the pack was pruned to {_shown(pruned)}")
  serves = (", a target that serves this GPU without a setting" if _serves_here(entry.about, about) else "")
  return (f"  nearest in the packs: {pack_file.escaped(pack.path)} holds '{about.get('kernel')}' under another key "
          f"(recorded for {_shown(entry.about.get('recorded_for'))}{serves}); what differs: {'; '.join(found)}\n")


def _plain_arch(target: str) -> Arch | None:
  try:
    arch = Arch.parse(target)
  except ValueError:
    return None
  return arch if not arch.suffix else None


def _serves_here(packed: Mapping[str, Any], about: Mapping[str, Any]) -> bool:
  """Whether a packed entry was recorded for a family target of the GPU ``about`` is compiled for (sm_100f for
  an sm_103): what a node takes from the pack with no setting (store/targets.py)."""
  here = [a for a in map(_plain_arch, about.get("targets") or ()) if a is not None]
  for target in packed.get("recorded_for") or ():
    try:
      arch = Arch.parse(str(target))
    except ValueError:
      continue
    if arch.suffix == "f" and any(a.number // 10 == arch.number // 10 and arch.number <= a.number for a in here):
      return True
  return False


def _family(about: Mapping[str, Any]) -> str:
  """The family target the packs were recorded for that serves the GPU ``about`` is compiled for, or "": the arch
  a fix records for (one pack entry then serves every GPU of the family)."""
  try:
    recorded = recorded_targets()
  except PackError:
    return ""
  return next((t for t in sorted(recorded, reverse=True) if _serves_here({"recorded_for": [t]}, about)), "")


def _shown(value) -> str:
  """A value of a manifest (anyone's text), escaped for a terminal (pack_file.escaped); "-" for none."""
  return pack_file.escaped((", ".join(map(str, value)) if isinstance(value, (list, tuple)) else
                            str(value if value is not None else "")) or "-")


def _gpu(target: str) -> str:
  """A target as the record command's --arch names its GPU: sm_100a -> sm_100 (a family target as it is)."""
  try:
    arch = Arch.parse(target)
    return arch.sm if arch.suffix == "f" else f"sm_{arch.number}"
  except ValueError:
    return "sm_90"


def with_call_site(about: Callable[[], Mapping[str, Any]] | None, call_site: str) -> dict:
  """What ``about()`` says of a compile, with the call site it was reached from where it names none: what an
  error, a recording or a note of that compile names."""
  found = dict(about() if about is not None else {})
  if not found.get("call_sites"):
    found["call_sites"] = [call_site]
  return found


def forget() -> None:
  """Drops every pack read and every `load_pack` (for tests: the next lookup reads the environment's again)."""
  with _lock:
    _called.clear()
    _read.clear()
    _recorded.clear()


def _for_these_gpus(capabilities: tuple[int, ...]) -> Callable[[str, Mapping[str, Any]], bool] | None:
  """Which entries of a pack a process with GPUs of ``capabilities`` holds: every entry but the compiles none of
  whose images would load on them (None, all, where there is no GPU: recording and checking read every entry)."""
  if not capabilities:
    return None

  def keep(kind: str, about: Mapping[str, Any]) -> bool:
    names = about.get("images")
    if kind != "compile" or not isinstance(names, list) or not names:
      return True  # a timing, a specialization, or a compile that does not say its images: kept
    try:
      images = [module_format.parse_image_name(n) for n in names]
    except ValueError:
      return True
    return any(module_format.served_image(images, c) is not None for c in capabilities)
  return keep


def loads_on(entry: pack_file.Entry, capability: int, jit: bool) -> bool:
  """Whether a compile entry holds an image a GPU of ``capability`` loads (by the runtime's rule), as its manifest
  names them (``jit``: its PTX counts, which the driver compiles there); one that does not say is not taken."""
  try:
    images = [module_format.parse_image_name(n) for n in entry.about.get("images") or ()]
  except ValueError:
    return False
  index = module_format.served_image(images, capability) if images else None
  return index is not None and (jit or images[index][0] != module_format.ImageKind.PTX)


def _pack(path: str) -> pack_file.Pack:
  with _lock:
    found = _read.get(path)
  if found is None:
    try:
      # Where the targets are set, kernels are built for GPUs other than these (pack check runs a program as each
      # GPU of a fleet would): every entry is held.
      here = () if os.environ.get(flags.TARGETS, "").strip() else tuple(g.arch for g in gpu_info.visible_gpus())
      found = pack_file.read(path, keep=_for_these_gpus(here))
    except PackError as e:
      found = e
    with _lock:
      found = _read.setdefault(path, found)
  if isinstance(found, PackError):
    raise PackError(str(found))
  return found
