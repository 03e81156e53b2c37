"""CUDA C++ to cubin and PTX with NVRTC (cuda-python), behind two caches.

A compile is looked up first in memory, then on disk (``disk_cache``), and
only then handed to NVRTC (``nvrtc_program``, in a child process with a time
bound). The cache key covers everything given that changes the binary: the
source, the in-memory headers, the options, the target archs, the NVRTC
build and this package's module format. The headers NVRTC read from disk
are known only after the compile: the entry lists them with their contents'
hashes, and a hit in either cache counts only while they are unchanged
(``file_deps``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import pathlib
import re
import struct
import threading
import time

from jax_mosaic_ffi import disk_cache
from jax_mosaic_ffi import file_deps
from jax_mosaic_ffi import module_format
from jax_mosaic_ffi import nvrtc_compat
from jax_mosaic_ffi import nvrtc_program
from jax_mosaic_ffi import ptx_info
from jax_mosaic_ffi.module_format import Arch, Image, ImageKind, ParsedModule

DEVICE_INCLUDE_DIR = pathlib.Path(__file__).parent / "include"
_MEMORY_CACHE_SIZE = 512
# The JSON header of a cache entry: its list of headers read is the large part.
_MAX_ENTRY_HEADER = 16 << 20


class CompileError(RuntimeError):
  """NVRTC refused the source. The message carries its log with line numbers."""

  def __init__(self, kernel: str, log: str, source: str, filename: str):
    self.kernel = kernel
    self.log = log
    lines = source.splitlines()
    excerpts = []
    for line_no in sorted({int(n) for n in re.findall(rf"{re.escape(filename)}\((\d+)\)", log)})[:5]:
      if 1 <= line_no <= len(lines):
        excerpts.append(f"  {line_no:5d} | {lines[line_no - 1]}")
    message = f"NVRTC could not compile kernel '{kernel}':\n{log.rstrip()}"
    if excerpts:
      message += "\n\nsource lines named above:\n" + "\n".join(excerpts)
    hint = nvrtc_compat.advice(log)
    if hint:
      message += f"\n\nadvice: {hint}"
    super().__init__(message)


@dataclasses.dataclass(frozen=True, eq=False)
class Compiled:
  """A kernel module, as bytes and parsed, with what is derived from it, computed once."""

  parsed: ParsedModule
  module_bytes: bytes
  hash: bytes
  param_sizes: tuple[int, ...] | None  # from the PTX, when the module has some
  deps: file_deps.Deps = ()  # the files the compile read, with their hashes

  @classmethod
  def of(cls, parsed: ParsedModule, param_sizes: tuple[int, ...] | None, deps: file_deps.Deps = ()) -> "Compiled":
    data = module_format.serialize(parsed)
    return cls(parsed, data, module_format.kernel_hash(data), param_sizes, deps)

  def to_bytes(self) -> bytes:
    header = json.dumps({"param_sizes": self.param_sizes, "deps": self.deps}).encode()
    return struct.pack("<I", len(header)) + header + self.module_bytes

  @classmethod
  def from_bytes(cls, data: bytes) -> "Compiled":
    """Reads `to_bytes` back; raises ValueError on anything malformed."""
    if len(data) < 4:
      raise ValueError("truncated")
    (length,) = struct.unpack_from("<I", data)
    if length > min(len(data) - 4, _MAX_ENTRY_HEADER):
      raise ValueError("bad header length")
    header = json.loads(data[4:4 + length])
    sizes = header.get("param_sizes") if isinstance(header, dict) else None
    if sizes is not None and not (isinstance(sizes, list) and len(sizes) <= module_format.LIMITS["max_params"]
                                  and all(type(s) is int and 1 <= s <= 4096 for s in sizes)):
      raise ValueError("bad param_sizes")
    deps = file_deps.checked(header.get("deps", []))
    module_bytes = data[4 + length:]
    return cls(module_format.parse(module_bytes), module_bytes, module_format.kernel_hash(module_bytes),
               tuple(sizes) if sizes is not None else None, deps)


@dataclasses.dataclass
class CompileStats:
  nvrtc_compiles: int = 0
  memory_hits: int = 0
  disk_hits: int = 0


_stats = CompileStats()
_lock = threading.Lock()
_memory: collections.OrderedDict[str, Compiled] = collections.OrderedDict()


def stats() -> CompileStats:
  with _lock:
    return dataclasses.replace(_stats)


def clear_memory_cache() -> None:
  with _lock:
    _memory.clear()


@functools.cache
def nvrtc_version() -> tuple[int, int]:
  nvrtc = nvrtc_program._nvrtc()
  err, major, minor = nvrtc.nvrtcVersion()
  nvrtc_program._check(nvrtc, err, "nvrtcVersion")
  return int(major), int(minor)


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
  """Where <cuda_fp16.h> and CCCL (cuda/std/..., which cooperative_groups
  needs) live, as cuda-python's pathfinder finds them: the CUDA wheels, else
  CUDA_HOME or the system toolkit."""
  found = []
  try:
    from cuda import pathfinder
    for name in ("cudart", "cccl"):
      try:
        directory = pathfinder.find_nvidia_header_directory(name)
      except Exception:
        directory = None
      if directory:
        found.append(directory)
  except ImportError:
    pass
  home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
  found += [os.path.join(home, "include"), os.path.join(home, "include", "cccl")]
  return tuple(d for d in dict.fromkeys(found) if os.path.isdir(d))


@functools.cache
def nvrtc_identity() -> str:
  """What the cache key needs of the compiler: the NVRTC library's identity.

  Reading the wheel's library file (path, size, mtime) costs microseconds,
  where loading NVRTC to ask its version costs tens of milliseconds; the
  version is asked only when the wheel is not there.
  """
  try:
    import nvidia
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


# Bumped whenever the code we add to a kernel changes (nvrtc_program.wait_at_entry).
_INSTRUMENTATION = "pdl-wait-1"
# Entries before this one did not list the headers they read.
_ENTRY_FORMAT = "deps-1"


def cache_key(source: str, name: str, options, headers: dict, targets, compiler: str, pdl: bool = True) -> str:
  """Everything that changes the binary, hashed: the key of both caches."""
  return disk_cache.key(
      _ENTRY_FORMAT, f"format{module_format.FORMAT_VERSION}", f"compat{nvrtc_compat.HEADERS_HASH}",
      _INSTRUMENTATION if pdl else "as-written", compiler, source, name,
      f"{len(options)} options", *options, f"{len(headers)} headers",
      *(f"{k}\0{v}" for k, v in sorted(headers.items())), *(t.sm for t in targets))


def compile_cuda(source: str, name: str, *, options=(), headers=None,
                 targets: tuple[Arch, ...], pdl: bool = True) -> Compiled:
  """Compiles ``source`` for each target, through the memory and disk caches.

  The result holds one cubin per target and the PTX of the first one, the
  portable form a newer GPU can still JIT. With ``pdl``, the kernel's entry
  waits for the previous grid first (nvrtc_program.wait_at_entry), so it may
  be launched with programmatic dependent launch.
  """
  options = tuple(str(o) for o in options)
  if _has_option(options, "-arch", "--gpu-architecture", "-gencode"):
    raise ValueError("set the GPU architecture with targets=('sm_90', ...), not with NVRTC options")
  headers = dict(sorted((headers or {}).items()))
  # Settings mistakes surface before a compile that may take seconds.
  disk_cache.check_settings()
  timeout = nvrtc_program.timeout_s()
  entry_key = cache_key(source, name, options, headers, targets, nvrtc_identity(), pdl)
  with _lock:
    compiled = _memory.get(entry_key)
  if compiled is not None and file_deps.unchanged(compiled.deps):
    with _lock:
      _memory.move_to_end(entry_key)
      _stats.memory_hits += 1
    return compiled
  # Not in memory, or a header it read has changed since: the disk entry if its headers are as they
  # were, else NVRTC, whose entry replaces it.
  compiled = disk_cache.load_decoded(entry_key, _fresh_entry)
  if compiled is not None:
    with _lock:
      _stats.disk_hits += 1
  else:
    started = time.time_ns()
    parsed, read = _compile_with_nvrtc(source, name, options, headers, targets, timeout, pdl)
    deps = file_deps.snapshot(read, started)
    compiled = Compiled.of(parsed, param_sizes(parsed), deps or ())
    if deps is None:
      return compiled  # what it read is not known: cached nowhere, so never stale
    disk_cache.store(entry_key, compiled.to_bytes())
  with _lock:
    _memory[entry_key] = compiled
    while len(_memory) > _MEMORY_CACHE_SIZE:
      _memory.popitem(last=False)
  return compiled


def _fresh_entry(data: bytes) -> Compiled | None:
  compiled = Compiled.from_bytes(data)
  return compiled if file_deps.unchanged(compiled.deps) else None


def _compile_with_nvrtc(source, name, options, headers, targets, timeout, pdl) -> tuple[ParsedModule, list | None]:
  """The module, and the files NVRTC read (None if it did not say)."""
  filename = re.sub(r"\W", "_", name.split("<")[0]) + ".cu"
  all_options = list(options)
  if not _has_option(options, "-std", "--std"):
    all_options.append("-std=c++17")
  all_options.extend(nvrtc_compat.nvrtc_options())  # before the CUDA dirs: its shims win
  all_options.append(f"-I{DEVICE_INCLUDE_DIR}")
  all_options.extend(f"-I{d}" for d in cuda_include_dirs())
  request = {"source": source, "filename": filename, "name": name, "headers": headers, "options": all_options,
             "targets": [t.sm for t in targets], "pdl": pdl}
  with _lock:
    _stats.nvrtc_compiles += len(targets)
  try:
    result = nvrtc_program.compile_bounded(request, timeout)
  except nvrtc_program.NvrtcFailure as e:
    raise CompileError(name, e.log, source, filename) from None
  except nvrtc_program.NvrtcTimeout as e:
    raise CompileError(name, str(e), source, filename) from None
  images = [Image(ImageKind.CUBIN, target, cubin) for target, cubin in zip(targets, result["cubins"])]
  images.append(Image(ImageKind.PTX, targets[0], result["ptx"]))
  parsed = ParsedModule(result["symbol"], tuple(images), module_format.FLAG_PDL_WAIT if result["pdl_wait"] else 0)
  return parsed, result.get("deps")


def param_sizes(parsed: ParsedModule) -> tuple[int, ...] | None:
  """The kernel's parameter sizes, read from the module's PTX when it has one."""
  for image in parsed.images:
    if image.kind == ImageKind.PTX:
      return ptx_info.entries(image.data.decode(errors="replace")).get(parsed.symbol)
  return None
