"""CUDA C++ to cubin and PTX with NVRTC (cuda-python), behind two caches.

A compile is looked up first in memory, then on disk (``disk_cache``), and
only then handed to NVRTC (``worker``, in a child process with a time
bound). The cache key covers everything given that changes the binary: the
source, the in-memory headers, the options, the target archs, the NVRTC
build and this package's module format. The headers NVRTC read from disk
are known only after the compile: the entry lists them with their contents'
hashes, and a hit in either cache counts only while they are unchanged
(``file_deps``). A memory hit re-checks the user's headers only: those of
the CUDA toolkit and of this package change with an install, which a
running process does not take in anyway; a fresh process's disk hit
re-checks every one.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import time
import weakref

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import file_deps
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.errors import CompileError
from jax_mosaic_ffi.base.module_format import Arch, Image, ImageKind, ParsedModule
from jax_mosaic_ffi.base.paths import DEVICE_INCLUDE_DIR
from jax_mosaic_ffi.toolchain import compile_cache
from jax_mosaic_ffi.toolchain import param_types
from jax_mosaic_ffi.toolchain.compiled import Compiled, param_sizes
from jax_mosaic_ffi.toolchain.nvrtc import compat
from jax_mosaic_ffi.toolchain.nvrtc import kernel_names
from jax_mosaic_ffi.toolchain.nvrtc import program
from jax_mosaic_ffi.toolchain.nvrtc import worker


@functools.cache
def nvrtc_version() -> tuple[int, int]:
  nvrtc = program.load_nvrtc()
  err, major, minor = nvrtc.nvrtcVersion()
  program.check(nvrtc, err, "nvrtcVersion")
  return int(major), int(minor)


@functools.cache
def nvrtc_identity() -> str:
  """What the cache key needs of the compiler: the NVRTC library's identity.

  Reading the wheel's library file (path, size, mtime) costs microseconds,
  where loading NVRTC to ask its version costs tens of milliseconds; the
  version is asked only when the wheel is not there.
  """
  try:
    import nvidia  # noqa: PLC0415  (optional: the NVRTC wheel, when it is there)
    for base in nvidia.__path__:
      for lib in sorted(pathlib.Path(base).glob("cu*/lib/libnvrtc.so*")):
        if "builtins" not in lib.name and "alt" not in lib.name:
          stat = lib.stat()
          return f"{lib}:{stat.st_size}:{int(stat.st_mtime)}"
  except (ImportError, OSError):
    pass
  major, minor = nvrtc_version()
  return f"nvrtc{major}.{minor}"


def _has_option(options, *prefixes) -> bool:
  return any(str(o).startswith(p) for o in options for p in prefixes)


# Bumped whenever the code we add to a kernel changes (program.wait_at_entry).
_INSTRUMENTATION = "pdl-wait-1"
# Entries before deps-1 did not list the headers they read; before param-types-1, the parameter types.
_ENTRY_FORMAT = "param-types-1"


def cache_key(source: str, name: str, options, headers: dict, targets, compiler: str, pdl: bool = True) -> str:
  """Everything that changes the binary, hashed: the key of both caches."""
  return disk_cache.key(
      _ENTRY_FORMAT, f"format{module_format.FORMAT_VERSION}", f"compat{compat.HEADERS_HASH}",
      _INSTRUMENTATION if pdl else "as-written", compiler, source, name,
      f"{len(options)} options", *options, f"{len(headers)} headers",
      *(f"{k}\0{v}" for k, v in sorted(headers.items())), *(t.sm for t in targets))


def compile_cuda(source: str, name: str, *, options=(), headers=None,
                 targets: tuple[Arch, ...], pdl: bool = True) -> Compiled:
  """Compiles ``source`` for each target, through the memory and disk caches.

  The result holds one cubin per target and the PTX of the first one, the
  portable form a newer GPU can still JIT. With ``pdl``, the kernel's entry
  waits for the previous grid first (program.wait_at_entry), so it may
  be launched with programmatic dependent launch.
  """
  options = tuple(str(o) for o in options)
  if _has_option(options, "-arch", "--gpu-architecture", "-gencode"):
    raise ValueError("set the GPU architecture with targets=('sm_90', ...), not with NVRTC options")
  headers = dict(sorted((headers or {}).items()))
  # Settings mistakes surface before a compile that may take seconds.
  disk_cache.check_settings()
  timeout = worker.timeout_s()
  entry_key = cache_key(source, name, options, headers, targets, nvrtc_identity(), pdl)

  def compile():
    started = time.time_ns()
    parsed, read, types = _compile_with_nvrtc(source, name, options, headers, targets, timeout, pdl)
    deps = file_deps.snapshot(read, started)
    # What it read is not known (deps None): cached nowhere, so never stale.
    return Compiled.of(parsed, param_sizes(parsed), deps or (), types), deps is not None

  return compile_cache.cached(entry_key, compile=compile, encode=Compiled.to_bytes, decode=_fresh_entry,
                              fresh=_user_headers_unchanged).value


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


def _compile_with_nvrtc(source, name, options, headers, targets, timeout, pdl):
  """(the module, the files NVRTC read (None if it did not say), the parameter types (None if unknown)).

  The same compile instantiates the type probe (param_types.PROBE_SOURCE): nothing is compiled twice for
  the types, which then live in the compiled module's cache entry.
  """
  filename = re.sub(r"\W", "_", name.split("<")[0]) + ".cu"
  all_options = list(options)
  if not _has_option(options, "-std", "--std"):
    all_options.append("-std=c++17")
  all_options.extend(compat.nvrtc_options())  # before the CUDA dirs: its shims win
  all_options.append(f"-I{DEVICE_INCLUDE_DIR}")
  all_options.extend(f"-I{d}" for d in compat.cuda_include_dirs())
  request = {"source": source, "filename": filename, "name": name, "headers": headers, "options": all_options,
             "targets": [t.sm for t in targets], "pdl": pdl,
             "probe": {"source": param_types.PROBE_SOURCE, "expression": param_types.probe_expression(name)}}
  compile_cache.count_compiles("nvrtc", len(targets))
  try:
    result = worker.compile_bounded(request, timeout)
  except program.NvrtcFailure as e:
    missing = kernel_names.misnamed(e.log, source, name)
    if missing is not None:
      raise CompileError(name, e.log, source, filename, message=missing) from None
    raise CompileError(name, e.log, source, filename, compat.advice(e.log)) from None
  except worker.NvrtcTimeout as e:
    raise CompileError(name, str(e), source, filename, compat.advice(str(e))) from None
  images = [Image(ImageKind.CUBIN, target, cubin) for target, cubin in zip(targets, result["cubins"])]
  images.append(Image(ImageKind.PTX, targets[0], result["ptx"]))
  parsed = ParsedModule(result["symbol"], tuple(images), module_format.FLAG_PDL_WAIT if result["pdl_wait"] else 0)
  probe_symbol = result.get("probe_symbol")
  types = param_types.of_probe(probe_symbol) if probe_symbol else None
  if types is None:  # no probe (it alone failed): a C++ kernel's own symbol still carries its types
    types = param_types.of_symbol(parsed.symbol)
  return parsed, result.get("deps"), types
