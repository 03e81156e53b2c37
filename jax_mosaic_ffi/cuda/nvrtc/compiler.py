"""CUDA C++ to cubin and PTX with NVRTC (cuda-python), behind the store.

A compile is looked up through the store's tiers (store/stack.py: memory, the
kernel packs, the disk cache, a job's peers), and only then handed to NVRTC
(``worker``, in a child process with a time bound); its entries' codec is
`CODEC`. The cache key covers everything given that changes the binary: the
source, the in-memory headers, the options, the target archs, the NVRTC
build and this package's module format. The headers NVRTC read from disk
are known only after the compile: the entry lists them with their contents'
hashes, and the paths NVRTC's search tried before each of them as absent
(``include_search``: a header created there would shadow it), and a hit in
either cache counts only while they are unchanged (``file_deps``). A memory
hit re-checks the user's headers only: those of the CUDA toolkit and of this
package change with an install, which a running process does not take in
anyway; a fresh process's disk hit re-checks every one.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import re
import time
import weakref

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import file_deps
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import nvshmem_package
from jax_mosaic_ffi.base import ptx_info
from jax_mosaic_ffi.base import wheel_record
from jax_mosaic_ffi.base.errors import CompileTimeout
from jax_mosaic_ffi.base.module_format import Arch, Image, ImageKind, ParsedModule
from jax_mosaic_ffi.base.paths import DEVICE_INCLUDE_DIR
from jax_mosaic_ffi.store import ahead
from jax_mosaic_ffi.store import compile_cache
from jax_mosaic_ffi.store import key_audit
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store.entries import Codec, Key, Unkept
from jax_mosaic_ffi.toolchain import param_types
from jax_mosaic_ffi.toolchain.compiled import Compiled, PendingCompiled
from jax_mosaic_ffi.toolchain.kernel import symbol_names
from jax_mosaic_ffi.cuda.nvrtc import compat
from jax_mosaic_ffi.cuda.nvrtc import error_lines
from jax_mosaic_ffi.cuda.nvrtc import include_search
from jax_mosaic_ffi.cuda.nvrtc import kernel_names
from jax_mosaic_ffi.cuda.nvrtc import portable
from jax_mosaic_ffi.cuda.nvrtc import program
from jax_mosaic_ffi.cuda.nvrtc import release
from jax_mosaic_ffi.cuda.nvrtc import worker


@functools.cache
def nvrtc_version() -> tuple[int, int]:
  nvrtc = program.load_nvrtc()
  err, major, minor = nvrtc.nvrtcVersion()
  program.check(nvrtc, err, "nvrtcVersion")
  return int(major), int(minor)


@functools.cache
def nvrtc_identity() -> str:
  """What the cache key needs of the compiler: the NVRTC library's identity, the same on every machine with the
  same build (a kernel pack's keys are computed on the machine that loads it).

  For the NVRTC wheel, its distribution, release and the sha256 its RECORD gives the library (base/wheel_record.py):
  read without loading NVRTC (tens of milliseconds; a process whose kernels all come from a pack never loads it).
  NVRTC is asked its version only when the wheel is not there.
  """
  try:
    import nvidia  # noqa: PLC0415  (optional: the NVRTC wheel, when it is there)
    libraries = [lib for base in nvidia.__path__ for lib in sorted(pathlib.Path(base).glob("cu*/lib/libnvrtc.so*"))
                 if "builtins" not in lib.name and "alt" not in lib.name]
  except (ImportError, OSError):
    libraries = []
  for lib in libraries:
    found = wheel_record.identity(lib, ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13", "nvidia-cuda-nvrtc-cu12"))
    if found is not None:
      return found
  major, minor = nvrtc_version()
  return f"nvrtc{major}.{minor}"


def _has_option(options, *prefixes) -> bool:
  return any(str(o).startswith(p) for o in options for p in prefixes)


# Bumped whenever the code we add to a kernel changes (program.wait_at_entry).
_INSTRUMENTATION = "pdl-wait-2"
# Entries before deps-1 did not list the headers they read; before param-types-1, the parameter types; before
# include-search-1, the paths NVRTC tried before each header; before include-search-2, the paths its
# __has_include probes searched (include_search.py); before reproducible-1, code compiled with NVRTC's time trace on
# and a random seed (program.py: it varied from one process to the next); before one-pass-1, a PDL-safe kernel's
# entry that managed PDL itself kept NVRTC's cubin (now nvJitLink builds every such cubin from the PTX).
_ENTRY_FORMAT = "one-pass-1"


def cache_key(source: str, name: str, options, headers: dict, targets, compiler: str, pdl: bool = True,
              nvshmem: str | None = None) -> str:
  """Everything that changes the binary, hashed: the key of both caches. ``nvshmem``: the identity of
  the NVSHMEM release linked in (nvshmem_package), for kernels that call it."""
  return disk_cache.key(
      _ENTRY_FORMAT, f"format{module_format.FORMAT_VERSION}", f"compat{compat.HEADERS_HASH}",
      _INSTRUMENTATION if pdl else "as-written", compiler, f"linked with {nvshmem or 'nothing'}", source, name,
      f"{len(options)} options", *options, f"{len(headers)} headers",
      *(f"{k}\0{v}" for k, v in sorted(headers.items())), *(t.sm for t in targets))


def compile_cuda(source: str, name: str, *, options=(), headers=None,
                 targets: tuple[Arch, ...], pdl: bool = True, nvshmem: bool = False) -> Compiled | PendingCompiled:
  """Compiles ``source`` for each target, through the memory and disk caches.

  The result holds one cubin per target and the PTX of the first one, the
  portable form a newer GPU can still JIT. With ``pdl``, the kernel's entry
  waits for the previous grid first (program.wait_at_entry), so it may
  be launched with programmatic dependent launch.

  With ``nvshmem``, the kernel is compiled as relocatable code against
  NVSHMEM's headers and linked with its device library (nvJitLink): one cubin
  per target and no PTX (relocatable PTX cannot be loaded alone), flagged for
  the runtime to start NVSHMEM. Such a kernel is not made PDL-safe: it is
  launched cooperatively, as nvshmemx_collective_launch does.

  Inside ``jmf.compile_ahead()`` a compile that is not in memory starts on the store's pool (store/ahead.py) and a
  `PendingCompiled` is returned at once: its first use waits for it.
  """
  options = tuple(str(o) for o in options)
  if _has_option(options, "-arch", "--gpu-architecture", "-gencode"):
    raise ValueError("set the GPU architecture with targets=('sm_90', ...), not with NVRTC options")
  headers = dict(sorted((headers or {}).items()))
  # Settings mistakes surface before a compile that may take seconds.
  disk_cache.check_settings()
  timeout = worker.timeout_s()
  package = nvshmem_package.require(f"cuda_kernel '{name}'") if nvshmem else None
  pdl = pdl and package is None
  linked = f"{package.identity} renamed {NVSHMEM_PTX_RENAMES}" if package else None
  entry_key = cache_key(source, name, options, headers, targets, nvrtc_identity(), pdl, linked)
  # A pack recorded for this GPU's family (sm_100f for an sm_103) serves it by default (store/targets.py).
  key = entry_key if len(targets) != 1 else Key(entry_key, entry_key, targets, lambda other: cache_key(
      source, name, options, headers, other, nvrtc_identity(), pdl, linked))

  def compile():
    # A header written just before the compile cannot be told from one written during it (file timestamps come
    # from a coarse clock): then the compile runs once more, once that write is safely past, so that what is
    # cached never depends on how fast the machine went. One compile is counted either way.
    for attempt in range(2):
      started = time.time_ns()
      parsed, sizes, read, types = _compile_with_nvrtc(source, name, options, headers, targets, timeout, pdl,
                                                       package, counted=attempt == 0)
      deps = file_deps.snapshot(read, started)
      if deps is not None or read is None or not file_deps.settle(read, started):
        break
    # What it read is not known (deps None): cached nowhere, so never stale.
    compiled = Compiled.of(parsed, sizes, deps or (), types)
    return compiled if deps is not None else Unkept(compiled)

  # NVRTC cannot stop after preprocessing, so what the audit compares is its output: a hit compiles again.
  witness = key_audit.Witness(
      "PTX", lambda: _output_text(_compile_with_nvrtc(source, name, options, headers, targets, timeout, pdl, package,
                                                      counted=False)[0]),
      of=lambda compiled: _output_text(compiled.parsed), what=f"cuda_kernel '{name}' for "
      f"{', '.join(t.sm for t in targets)}", read="the source, the headers it read and their paths, the options")
  def about():
    return {"front_end": "CUDA C++ (NVRTC)", "kernel": name, "targets": [t.sm for t in targets],
            "specialization": f"options: {' '.join(options) or 'none'}; headers given: {', '.join(headers) or 'none'}"
                              + (f"; linked with {package.identity}" if package else ""),
            "toolchain": nvrtc_identity()}

  if ahead.active():  # jmf.compile_ahead: the compile runs on the store's pool, the kernel waits for it when asked
    pending = stack.start(key, CODEC, compile, about, witness=witness)
    return pending.result().value if pending.done() else PendingCompiled(lambda: pending.result().value)
  return stack.get_or_make(key, CODEC, compile, about, witness=witness).value


def _output_text(parsed: ParsedModule) -> str:
  """What a compile made, as text: its PTX, or, for a kernel linked with NVSHMEM (no PTX), its cubins' digests."""
  ptx = [i.data.decode(errors="replace") for i in parsed.images if i.kind == ImageKind.PTX]
  return "\n".join(ptx) if ptx else "\n".join(f"{i.arch.sm} {hashlib.sha256(i.data).hexdigest()}"
                                               for i in parsed.images)


# Compiled -> the deps outside the installed header folders, worked out on its first memory hit.
_user_deps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@functools.cache
def _installed_header_dirs() -> tuple[str, ...]:
  return tuple(os.path.join(os.path.abspath(d), "") for d in (*compat.cuda_include_dirs(), DEVICE_INCLUDE_DIR))


def _user_headers_unchanged(compiled: Compiled) -> bool:
  deps = _user_deps.get(compiled)
  if deps is None:
    installed = _installed_header_dirs()
    deps = tuple(d for d in compiled.deps if not os.path.abspath(d[0]).startswith(installed))
    _user_deps[compiled] = deps
  return file_deps.unchanged(deps)


def _fresh_entry(data: bytes) -> Compiled | None:
  compiled = Compiled.from_bytes(data)
  return compiled if file_deps.unchanged(compiled.deps) else None


# NVRTC's entries: the module with what NVRTC read (fresh while the user's headers are unchanged), and in a pack or
# a job's store with those headers named portably (portable.py), there holding the kernel the call names.
CODEC = Codec("compile", encode=Compiled.to_bytes, decode=_fresh_entry, pack_encode=portable.PORTABLE.encode,
              pack_decode=portable.PORTABLE.decode, fresh=_user_headers_unchanged,
              fits=lambda compiled, about: symbol_names(compiled.parsed.symbol, about["kernel"]))


def _compile_with_nvrtc(source, name, options, headers, targets, timeout, pdl,
                        package: nvshmem_package.NvshmemPackage | None, counted: bool = True):
  """(the module, its parameter sizes (from the PTX), the files NVRTC read and the paths its include search
  tried before them (None if it did not say), the parameter types (None if unknown)).

  The same compile instantiates the type probe (param_types.PROBE_SOURCE): nothing is compiled twice for
  the types, which then live in the compiled module's cache entry.
  """
  filename = re.sub(r"\W", "_", name.split("<")[0]) + ".cu"
  all_options = list(options)
  if not _has_option(options, "-std", "--std"):
    all_options.append("-std=c++17")
  all_options.extend(compat.nvrtc_options())  # before the CUDA dirs: its shims win
  all_options.append(f"-I{DEVICE_INCLUDE_DIR}")
  if package is not None:
    all_options.extend(_nvshmem_options(package))
  all_options.extend(f"-I{d}" for d in compat.cuda_include_dirs())
  request = {"source": source, "filename": filename, "name": name, "headers": headers, "options": all_options,
             "targets": [t.sm for t in targets], "pdl": pdl,
             "probe": {"source": param_types.PROBE_SOURCE, "expression": param_types.probe_expression(name)},
             "link_libraries": [str(package.device_library)] if package is not None else [],
             "ptx_renames": list(NVSHMEM_PTX_RENAMES) if package is not None else []}
  if counted:  # not the key audit's compiles
    compile_cache.count_compiles("nvrtc", len(targets))
    release.check()  # NVRTC, nvJitLink and the driver, at the process's first compile (once)
  try:
    result = worker.compile_bounded(request, timeout)
  except program.NvrtcFailure as e:
    raise error_lines.compile_error(name, e.log, source, filename, request, timeout,
                                    release.advice() or compat.advice(e.log),
                                    kernel_names.misnamed(e.log, source, name)) from None
  except worker.NvrtcTimeout as e:
    raise CompileTimeout(name, str(e), source, filename, compat.advice(str(e))) from None
  images = [Image(ImageKind.CUBIN, target, cubin) for target, cubin in zip(targets, result["cubins"])]
  flags = module_format.FLAG_PDL_WAIT if result["pdl_wait"] else 0
  if package is None:
    images.append(Image(ImageKind.PTX, targets[0], result["ptx"]))
  else:  # relocatable PTX calls into the device library: only the linked cubins can be loaded
    flags |= module_format.FLAG_NVSHMEM
  parsed = ParsedModule(result["symbol"], tuple(images), flags)
  sizes = ptx_info.entries(result["ptx"].decode(errors="replace")).get(result["symbol"])
  probe_symbol = result.get("probe_symbol")
  types = param_types.of_probe(probe_symbol) if probe_symbol else None
  if types is None:  # no probe (it alone failed): a C++ kernel's own symbol still carries its types
    types = param_types.of_symbol(parsed.symbol)
  read = result.get("deps")
  if read is not None:
    includes, folders = result.get("includes") or (), include_search.search_folders(all_options)
    texts = include_search.read_texts(includes, source)  # each file read once for both
    read = [*read, *include_search.tried_before(includes, folders, source, texts),
            *include_search.probed(includes, folders, source, in_memory=headers or {}, texts=texts)]
  return parsed, sizes, read, types


# NVRTC's <cstdint> (CCCL) makes uint64_t `unsigned long long`; NVSHMEM's device library, built by nvcc on
# Linux, has it `unsigned long`. Same size and calling convention, other mangled names: of the library
# functions a kernel calls (non_abi/device/pt-to-pt/nvshmemi_transfer_api.cuh) only put_signal takes one,
# so its calls are renamed to the library's symbol before the link ('y' -> 'm' in the mangling).
NVSHMEM_PTX_RENAMES = ((r"(_Z\d+nvshmemi_transfer_put_signalIL13threadgroup_t\d+EEvPvS1_mS1_)y(14nvshmemi_amo_tib)",
                        r"\1m\2"),)


def _nvshmem_options(package: nvshmem_package.NvshmemPackage) -> list[str]:
  """Relocatable code against NVSHMEM's headers. Its 3.4 headers need <type_traits> (our prelude) and
  have one unannotated (host) constructor, which -default-device makes a device one."""
  return ["-rdc=true", "-default-device", f"--pre-include={compat.INCLUDE_DIR / 'jmf_nvshmem_prelude.h'}",
          f"-I{package.include_dir}"]
