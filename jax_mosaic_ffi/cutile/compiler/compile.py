"""cuTile kernels compiled once ever, for any arch list, without a GPU: ``export_kernel`` per target, through the
compile cache.

A specialization is a ``@ct.kernel`` and a `Plan` (plan.py). For each target, ``cuda.tile.compilation.export_kernel``
makes a cubin for that exact arch (``sm_90`` gives an ``sm_90a`` cubin), which needs no GPU; the cubins are the
images of one module of our format, which goes through the compile cache, memory, then the kernel packs, then
disk, then the job's other processes, keyed by: the cuda-tile release, the tileiras that compiles (its
``--version``), cuTile's settings, the kernel's Python function and all it reaches (keys.py; or, where that cannot
be read whole, the TileIR bytecode cuTile makes of it), the plan, the ``ct.kernel`` options and the targets. Never
by the cubin's bytes, which are in any case made from code naming a fixed folder (relocate.py), so the same kernel
in another checkout compiles to the same bytes. cuTile's own cache is off in our compiles. A warm process compiles
nothing; `jax.export` carries the module.

Every compile runs under ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``, in a child forked for it and killed at the deadline
(toolchain/forked_compile.py): cuTile's Python front end and tileiras, for every target; one deadline for the whole
compile, whatever pieces it forks (the bytecode key, the compile, the key audit's witness). What cuTile looks up once
per process (its tileiras, the bytecode version that tileiras takes: a tileiras run each) is looked up here before
the fork, since a child's lookups die with it; the child's temporary files go in its own folder, which the parent
removes. Its cost above ``export_kernel`` alone is then the fork's (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import struct
import subprocess
import tempfile
import threading

from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.errors import CompileError, CompileTimeout
from jax_mosaic_ffi.base.module_format import Arch, Image, ImageKind, ParsedModule
from jax_mosaic_ffi.cutile.compiler import cubin as cubin_lib
from jax_mosaic_ffi.cutile.compiler import keys as cutile_keys
from jax_mosaic_ffi.cutile.compiler import parameters as parameters_lib
from jax_mosaic_ffi.cutile.compiler import relocate
from jax_mosaic_ffi.cutile.compiler import release as release_lib
from jax_mosaic_ffi.cutile.compiler import signature as signature_lib
from jax_mosaic_ffi.cutile.compiler.cubin import LaunchInfo
from jax_mosaic_ffi.cutile.compiler.plan import XLA_BUFFER_ALIGNMENT, Plan
from jax_mosaic_ffi.store import compile_cache
from jax_mosaic_ffi.store import key_audit
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store.entries import Codec
from jax_mosaic_ffi.toolchain import dump
from jax_mosaic_ffi.toolchain import forked_compile
from jax_mosaic_ffi.toolchain.compiled import Compiled
from jax_mosaic_ffi.toolchain.kernel import Kernel, buffer_name

_CACHE_FORMAT = "cutile-1"
COMPILER = "cuTile"
# cuTile compiles under a process-wide lock of its own; ours is held across each fork, so no other thread of ours
# is inside cuTile when the child starts.
_lock = threading.RLock()


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class CutileKernel(Kernel):
  """A `Kernel` compiled by cuTile: a cubin per target, launched as a tile kernel (a block of one: the tile compiler
  picks the threads). ``launch_infos``: per image arch (``"sm_90a"``), what its cubin declares (threads per block,
  static shared memory)."""

  launch_infos: tuple[tuple[str, LaunchInfo], ...] = ()

  def launch_info(self, arch: str) -> LaunchInfo | None:
    return dict(self.launch_infos).get(arch)

  def defines_its_name(self) -> bool:
    # cuTile names the entry after the Python function, then its mangled signature ("vector_add_Kt1_A1f32_...").
    return self.symbol == self.name or self.symbol.startswith(self.name + "_K")

  def batch_misalignment(self, strides, param_order, num_inputs) -> str | None:
    misaligned = [b for b, s in enumerate(strides) if s % XLA_BUFFER_ALIGNMENT]
    if not misaligned:
      return None
    b = misaligned[0]
    return (f"each batch element of {buffer_name(b, num_inputs)} starts {strides[b]} bytes after the last, not a "
            f"multiple of the {XLA_BUFFER_ALIGNMENT} bytes cuTile compiled the kernel to assume of its arrays' "
            "addresses (as cuda.tile.jax assumes of XLA's buffers). Give the kernel the batch as a leading array "
            "axis (jmf.cutile_kernel(..., batch_bid=...): one launch over the batch), or call it in a lax.map")


def cutile_arch(target: Arch) -> tuple[str, Arch]:
  """(cuTile's gpu_code, the arch of the cubin it makes) for a target: tileiras compiles for the exact arch,
  arch-specific from sm_90 on (``sm_90`` and ``sm_90a`` both give an ``sm_90a`` cubin)."""
  if target.suffix == "f":
    raise ValueError(f"cuTile compiles for exact archs; {target.sm} is a family target: name each GPU's arch "
                     f"(sm_{target.number})")
  return f"sm_{target.number}", Arch(target.number, "a" if target.number >= 90 else "")


def _configure_cutile() -> None:
  """cuTile's own disk cache off (ours keeps the cubins); in a forked compile's child, its temporary files (each
  compile's bytecode and cubin, which it does not remove) in the child's own folder, which the parent removes,
  not in the folder cuTile made for this process, which would keep them until the process ends."""
  from cuda.tile import _cext  # noqa: PLC0415  (optional dependency: cuTile; its context's configuration)
  config = _cext.default_tile_context.config
  config.cache_dir = None
  if forked_compile.in_child():
    config.temp_dir = tempfile.gettempdir()


def _unrelocated(text: str, kernel, relocated) -> str:
  """A message of cuTile's with the fixed folder's names put back to the files they stand for."""
  real = parameters_lib.python_function(kernel).__code__.co_filename
  fixed = parameters_lib.python_function(relocated).__code__.co_filename
  return text.replace(fixed, real) if fixed != real else text


def _export(kernel, plan: Plan, target: Arch, name: str, what: str, bytecode: bool = False) -> tuple[str, bytes]:
  """(the entry's symbol, the cubin or TileIR bytecode) of ``kernel`` for ``plan`` on ``target``, made here."""
  release_lib.require_cutile()
  from cuda.tile.compilation import export_kernel  # noqa: PLC0415  (optional dependency: cuTile)
  _configure_cutile()
  moved = relocate.relocated(kernel)
  gpu_code, _ = cutile_arch(target)
  try:
    # The entry named as cuTile names it: the function's name mangled with the signature.
    signature = signature_lib.kernel_signature(plan, parameters_lib.python_function(kernel).__name__, _itemsize)
    out = io.BytesIO()
    export_kernel(moved, [signature], out, gpu_code=gpu_code, bytecode_version=release_lib.bytecode_version(),
                  output_format="tileir_bytecode" if bytecode else "cubin")
  except Exception as e:  # cuTile's errors are many types; each says what it found and where
    raise CompileError(name, _unrelocated(f"{type(e).__name__}: {str(e).rstrip()}", kernel, moved), "", "",
                       compiler=COMPILER, what=what) from None
  return signature.symbol, out.getvalue()


def _itemsize(array) -> int:
  import numpy as np  # noqa: PLC0415  (cheap; ml_dtypes registers bfloat16 and the float8 types with jax)
  import jax.numpy as jnp  # noqa: PLC0415
  return int(np.dtype(jnp.dtype(array.dtype)).itemsize) if array.dtype != "float4_e2m1fn" else 1


def _bounded(work, stage: str, name: str, targets: tuple[Arch, ...], where: str) -> bytes:
  bound = compile_timeout.seconds()
  what = f"'{name}' for {', '.join(t.sm for t in targets)}" + (f" (called at {where})" if where else "")
  release_lib.require_cutile()
  release_lib.bytecode_version()  # probed here, once per process: a child's would die with it
  with _lock:
    try:
      return forked_compile.run(work, bound, stage)
    except forked_compile.Stopped as e:
      raise CompileTimeout(name, f"the compile ran past {compile_timeout.describe(bound)} seconds in {e.stage}, "
                           "and its process was killed", "", "", compiler=COMPILER, what=what,
                           advice="a compile's time grows with the tile sizes and the code cuTile unrolls "
                           f"(ct.static_iter): use smaller tiles, or raise {compile_timeout.ENV} (0: no bound)") \
          from None
    except forked_compile.Died as e:
      raise CompileError(name, f"the compile's process ended ({e.how}) in {e.stage}, without a result; this "
                         "process is unharmed", "", "", compiler=COMPILER, what=what,
                         advice="a crash of cuTile or tileiras: report it to cuTile with the kernel and this "
                         "call") from None


def _bytecode_key(kernel, plan: Plan, targets, name: str, where: str) -> str:
  """The digest of the TileIR bytecode cuTile makes of the kernel for each target: its identity where the key
  reader cannot read its code whole."""
  what = f"kernel '{name}' for {', '.join(t.sm for t in targets)} (called at {where})"

  def digest() -> bytes:
    h = hashlib.sha256()
    for t in targets:
      h.update(_export(kernel, plan, t, name, what, bytecode=True)[1])
    return h.hexdigest().encode()
  return _bounded(digest, "cuTile's front end, for the kernel's bytecode key", name, targets, where).decode()


def _witness_text(kernel, plan: Plan, targets, name: str, where: str) -> str:
  """The TileIR of each target, as MLIR text where tileirdisasm is installed (else the bytecode in hex): the key
  audit's witness."""
  what = f"kernel '{name}' (called at {where})"

  def text() -> bytes:
    parts = []
    for t in targets:
      data = _export(kernel, plan, t, name, what, bytecode=True)[1]
      parts.append(f"// {t.sm}\n{_disassembled(data)}")
    return "\n".join(parts).encode()
  return _bounded(text, "cuTile's front end, for the key audit", name, targets, where).decode()


def _disassembled(data: bytes) -> str:
  tool = release_lib.disassembler()
  if tool is not None:
    with tempfile.TemporaryDirectory(prefix="jmf-cutile-") as folder:
      path = os.path.join(folder, "kernel.tileirbc")
      with open(path, "wb") as f:
        f.write(data)
      done = subprocess.run([tool, path], capture_output=True, text=True, check=False)
      if done.returncode == 0:
        return done.stdout
  return "\n".join(data[i:i + 32].hex() for i in range(0, len(data), 32))


def _to_bytes(kernel: CutileKernel) -> bytes:
  infos = [[arch, list(i.threads), i.static_smem, i.tile] for arch, i in kernel.launch_infos]
  header = json.dumps({"launch_infos": infos}).encode()
  return struct.pack("<I", len(header)) + header + kernel.compiled.to_bytes()


def _from_bytes(name: str, data: bytes) -> CutileKernel:
  (length,) = struct.unpack_from("<I", data)
  if length > len(data) - 4:
    raise ValueError("bad header length")
  header = json.loads(data[4:4 + length])
  infos = []
  for arch, threads, smem, tile in header["launch_infos"]:
    if not (isinstance(arch, str) and isinstance(threads, list) and len(threads) == 3
            and all(type(v) is int and 0 <= v <= 1024 for v in threads) and type(smem) is int
            and 0 <= smem <= 1 << 20 and type(tile) is bool):
      raise ValueError("bad launch_infos")
    infos.append((Arch.parse(arch).sm, LaunchInfo(tuple(threads), smem, tile)))
  compiled = Compiled.from_bytes(data[4 + length:])
  if compiled.parsed.host_code or len(infos) != len(compiled.parsed.images):
    raise ValueError("not a cuTile module")
  return CutileKernel(name, compiled, tuple(infos))


# cuTile's entries (decoded under the call's kernel name).
CODEC = Codec("compile", encode=_to_bytes, decode=lambda data: _from_bytes("", data))


def compile_plan(kernel, plan: Plan, *, name: str, targets: tuple[Arch, ...], where: str = "") -> CutileKernel:
  """The kernel of this specialization for ``targets``: from memory, a pack, disk, a peer, or compiled. Its pieces
  (the bytecode key's front end, the compile, the audit's witness) share one deadline (base/compile_timeout.py)."""
  with compile_timeout.whole_compile(compile_timeout.seconds()):
    return _compile_plan(kernel, plan, name, targets, where)


def _compile_plan(kernel, plan: Plan, name: str, targets: tuple[Arch, ...], where: str) -> CutileKernel:
  release = release_lib.release()
  release_lib.check_release(release)
  for t in targets:
    cutile_arch(t)  # a family target refused before anything compiles
  tileiras = release_lib.tileiras_identity()
  hints = parameters_lib.hints(kernel)
  fn = parameters_lib.python_function(kernel)
  code = cutile_keys.fingerprint(fn)
  identity = "code:" + code if code is not None else "ir:" + _bytecode_key(kernel, plan, targets, name, where)
  described = plan.describe(_itemsize)
  entry_key = disk_cache.key(_CACHE_FORMAT, f"format{module_format.FORMAT_VERSION}", f"cuda-tile {release}", tileiras,
                             cutile_keys.settings_key(), fn.__name__, identity, described,
                             json.dumps(hints, sort_keys=True, default=str), *(t.sm for t in targets))
  what = f"kernel '{name}' for {', '.join(t.sm for t in targets)}" + (f" (called at {where})" if where else "")

  def compile_all() -> bytes:
    images, infos, symbol = [], [], None
    for t in targets:
      gpu_code, arch = cutile_arch(t)
      forked_compile.stage(f"cuTile's front end and tileiras for {gpu_code}")
      symbol, data = _export(kernel, plan, t, name, what)
      if cubin_lib.sm_number(data) != t.number:
        raise CompileError(name, f"tileiras made a cubin for sm_{cubin_lib.sm_number(data)}, asked for {gpu_code}",
                           "", "", compiler=COMPILER, what=what)
      images.append(Image(ImageKind.CUBIN, arch, data))
      infos.append((arch.sm, cubin_lib.launch_info(data, symbol)))
    compiled = Compiled.of(ParsedModule(symbol, tuple(images)), None)
    return _to_bytes(CutileKernel(name, compiled, tuple(infos)))

  def compile():
    made = _from_bytes(name, _bounded(compile_all, f"cuTile's front end and tileiras for {targets[0].sm}", name,
                                      targets, where))
    compile_cache.count_compiles("cutile", len(targets))
    return made

  witness = key_audit.Witness(
      "TileIR", lambda: _witness_text(kernel, plan, targets, name, where), what=what,
      read=f"the kernel's Python function and everything it reaches ({identity.split(':')[0]}); its constants")

  def about():
    return {"front_end": COMPILER, "kernel": name, "specialization": described, "targets": [t.sm for t in targets],
            "toolchain": f"cuda-tile {release}; {tileiras}", "call_sites": [where] if where else [],
            "settings": cutile_keys.settings_environment()}

  found = stack.get_or_make(entry_key, CODEC.bound(decode=lambda d: _from_bytes(name, d)), compile, about,
                            witness=witness)
  made = found.value
  if made.name != name:  # the same code under another name
    made = dataclasses.replace(made, name=name)
  if found.source != "memory":
    dump.maybe_dump(made)
  return made
