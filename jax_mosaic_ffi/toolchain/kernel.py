"""`Kernel`: compiled GPU code plus its entry symbol, as every front end makes it; the targets to compile for."""

from __future__ import annotations

import dataclasses
import os
import re

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base.module_format import Arch, Image, ParsedModule
from jax_mosaic_ffi.toolchain import param_types as param_types_lib
from jax_mosaic_ffi.toolchain.compiled import Compiled

DEFAULT_ARCH = Arch(90)
# Programmatic dependent launch (griddepcontrol.wait / launch_dependents): Hopper (sm_90) and newer.
PDL_MIN_ARCH = 90


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
  """A kernel ready to launch: its module (as bytes and parsed), hash and signature.

  `cuda_kernel`, `ptx_kernel` and `cubin_kernel` make one (`triton_kernel` with ``signature=`` too);
  `mosaic_kernel` launches it. ``name`` is what the user asked for (``"add<float>"``); ``symbol`` the
  entry in the binary (``"_Z3addIfEvPKT_S2_PS0_i"``). ``param_sizes`` is the size in bytes of each kernel
  parameter when the module has PTX to read it from, else None; ``param_types`` each one's C++ type when
  known (from NVRTC, a mangled symbol, or ``signature=``), else None::

    >>> source = 'extern "C" __global__ void add(const float* x, float* y, int n) {}'
    >>> kernel = jmf.cuda_kernel(source, "add", targets=["sm_90"])
    >>> kernel.images          # a cubin per target, and the PTX of the first
    (Image(cubin, sm_90, ... bytes), Image(ptx, sm_90, ... bytes))
    >>> kernel.param_sizes, [t.text for t in kernel.param_types]
    ((8, 8, 4), ['const float*', 'float*', 'int'])
  """

  name: str
  compiled: Compiled

  @property
  def parsed(self) -> ParsedModule:
    return self.compiled.parsed

  @property
  def symbol(self) -> str:
    return self.compiled.parsed.symbol

  @property
  def images(self) -> tuple[Image, ...]:
    return self.compiled.parsed.images

  @property
  def module(self) -> bytes:
    """The serialized module: the bytes the custom call carries."""
    return self.compiled.module_bytes

  @property
  def hash(self) -> bytes:
    return self.compiled.hash

  @property
  def param_sizes(self) -> tuple[int, ...] | None:
    return self.compiled.param_sizes

  @property
  def param_types(self) -> tuple[param_types_lib.ParamType, ...] | None:
    types = self.compiled.param_types
    return None if types is None else tuple(param_types_lib.parsed(t) for t in types)

  @property
  def uses_nvshmem(self) -> bool:
    """It is linked with NVSHMEM's device library: only a call with
    ``Collective(..., transport="nvshmem")`` may launch it."""
    return self.compiled.parsed.nvshmem

  @property
  def pdl_safe(self) -> bool:
    """Its entry waits for the previous kernel (griddepcontrol.wait) before
    touching memory, so `mosaic_kernel` launches it with programmatic
    dependent launch by default."""
    return self.compiled.parsed.pdl_wait

  def defines_its_name(self) -> bool:
    """Whether its module's entry is the kernel it names (`symbol_names`): a module the caches handed to another
    kernel's call (a peer's entry under this key) is refused at lowering. A front end whose modules name their
    entry otherwise (the CuTe DSL's, one prefix for every kernel) says so here."""
    return symbol_names(self.symbol, self.name)

  def batch_misalignment(self, strides: tuple[int, ...], param_order: tuple[int, ...], num_inputs: int) -> str | None:
    """What batch elements ``strides`` bytes apart (one stride per buffer: inputs, then outputs) break of what the
    compiled code assumes of its buffers' addresses, as the rest of a message "under vmap ...", or None. A
    front end whose compiles assume an alignment (Triton's pointer hints, a CuTe DSL tensor's assumed alignment)
    says so here; vmap refuses such a batch. ``param_order``: the launch's parameter codes."""
    return None

  def __repr__(self) -> str:
    images = ", ".join(f"{i.kind.name.lower()}:{i.arch}" for i in self.images)
    return f"{type(self).__name__}({self.name!r}, images=[{images}])"

  def __hash__(self) -> int:
    return hash(self.hash)

  def __eq__(self, other) -> bool:
    return isinstance(other, Kernel) and self.hash == other.hash and self.name == other.name


def symbol_names(symbol: str, name: str) -> bool:
  """Whether a module's entry ``symbol`` can be the kernel ``name`` a call asked for: the same name, or a C++
  name's Itanium mangling holding its function's identifier (``ns::scale<float, 4>``: ``_Z5scaleIfLi4EEv...``)."""
  if symbol == name:
    return True
  function = re.split(r"[<(]", name, maxsplit=1)[0].split("::")[-1].strip()
  return symbol.startswith("_Z") and bool(function) and f"{len(function.encode())}{function}" in symbol


def buffer_name(buffer: int, num_inputs: int) -> str:
  """A buffer (inputs, then outputs) as messages name it: "input 1", "output 0"."""
  return f"input {buffer}" if buffer < num_inputs else f"output {buffer - num_inputs}"


TARGETS_ENV = flags.TARGETS


def default_targets() -> tuple[Arch, ...]:
  """The archs kernels without ``targets=`` compile for: ``JAX_MOSAIC_FFI_TARGETS`` where set, else the visible
  GPUs', or sm_90 where there is none."""
  return targets_setting() or visible_targets()


def visible_targets() -> tuple[Arch, ...]:
  """The archs of the visible GPUs, or sm_90 where there is none."""
  archs = sorted({gpu.arch for gpu in gpu_info.visible_gpus()})
  return tuple(Arch(a) for a in archs) or (DEFAULT_ARCH,)


def targets_setting() -> tuple[Arch, ...]:
  """``JAX_MOSAIC_FFI_TARGETS`` read (empty where unset): GPUs as a machine with them computes its default targets,
  so a machine without them (a CI runner recording a pack) makes the same kernels under the same keys. An arch is
  written as a GPU reports it, without a suffix: Triton and the CuTe DSL pick the arch-specific target (sm_90a)
  themselves, as they do for a visible GPU. A family target (sm_100f: NVRTC's cubin and the CuTe DSL's object run
  on every GPU of the 10.x family from sm_100 up) is kept as written, on the machine that records and on every node
  that loads."""
  value = os.environ.get(TARGETS_ENV, "").strip()
  if not value:
    return ()
  archs = []
  for text in value.split(","):
    try:
      arch = Arch.parse(text)
    except ValueError as e:
      raise ValueError(f"{TARGETS_ENV}={value!r}: {e}") from None
    if arch.suffix == "a":
      raise ValueError(f"{TARGETS_ENV}={value!r} names {arch.sm}; it names GPUs as they report their arch, without a "
                       f"suffix: write sm_{arch.number} (Triton and the CuTe DSL build sm_{arch.number}{arch.suffix} "
                       f"for it themselves; a kernel that needs {arch.sm} from NVRTC passes targets=), or a family "
                       f"target, sm_{arch.number}f, for every GPU of its family")
    archs.append(arch)
  return tuple(sorted(dict.fromkeys(archs), key=lambda a: a.number))


def parse_targets(targets) -> tuple[Arch, ...]:
  if targets is None:
    return default_targets()
  if isinstance(targets, (str, int)):
    targets = (targets,)
  parsed = tuple(dict.fromkeys(Arch.parse(t) for t in targets))
  if not parsed:
    raise ValueError("targets must name at least one GPU architecture")
  return parsed
