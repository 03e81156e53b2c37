"""Which packed entries serve a GPU whose own arch a pack was not recorded for: family targets by default.

A pack records each program once per target (``pack record --arch sm_90,sm_100f``), and a node keys its compiles by
its own arch (sm_103). Where no entry is keyed so, the best image the packs hold for that GPU serves it, with no
setting on the node: first its family's (a target ``sm_XYf`` of its major version at or below it: a cubin every GPU
of the family loads), then an older arch's whose PTX it can JIT (nearest first). The pack itself holds, on a
machine with GPUs, only entries one of whose images loads there (store/packs.py), so whatever is found this way
runs. Only a compiler that builds such images gives the store its key for another target (`entries.Key.retarget`):
NVRTC's and the CuTe DSL's; Triton builds sm_100a when asked for sm_100f, which an sm_103 does not load.

``pack check --fleet`` (pack/fleet.py) tells the same rule for each GPU of a fleet.
"""

from __future__ import annotations

from typing import Iterable

from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base.module_format import Arch
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.toolchain import kernel as kernel_lib


def reaching(capability: int, recorded: Iterable[str]) -> list[str]:
  """The targets among ``recorded`` (those a pack was recorded for) other than the GPU's own arch whose entries
  may serve a GPU of ``capability`` (103), best first: its family's (highest first), then older archs' (nearest
  first), whose PTX it may JIT."""
  family, older = [], []
  for target in set(recorded):
    try:
      arch = Arch.parse(target)
    except ValueError:
      continue
    if arch.suffix == "f" and arch.number // 10 == capability // 10 and arch.number <= capability:
      family.append(arch)
    elif not arch.suffix and arch.number < capability:
      older.append(arch)
  return [a.sm for a in sorted(family, key=lambda a: -a.number) + sorted(older, key=lambda a: -a.number)]


def serving(own: tuple[Arch, ...]) -> list[tuple[Arch, ...]]:
  """For a compile keyed by ``own`` targets, the other targets whose packed entries may serve it, best first;
  none unless ``own`` is one GPU's arch, as a GPU of this machine (or ``JAX_MOSAIC_FFI_TARGETS``, which stands for
  the GPUs a machine would have: ``pack check`` runs a program so) reports it. A family target named by the
  setting or by the call is a choice already made."""
  recorded = packs.recorded_targets()  # first: without packs, nothing else is asked (the GPUs are not probed)
  if not recorded or len(own) != 1 or own[0].suffix:
    return []
  here = kernel_lib.targets_setting() or tuple(Arch(gpu.arch) for gpu in gpu_info.visible_gpus())
  if own[0] not in here:
    return []
  return [(Arch.parse(target),) for target in reaching(own[0].number, recorded)]

