"""CUDA C++ to cubin and PTX with NVRTC (cuda-python), behind two caches.

A compile is looked up first in memory, then on disk (``disk_cache``), and
only then handed to NVRTC. The cache key covers everything that changes the
binary: the source, the headers, the options, the target archs, the NVRTC
version and this package's module format.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import pathlib
import re
import threading

from jax_mosaic_ffi import disk_cache
from jax_mosaic_ffi import module_format
from jax_mosaic_ffi import ptx as ptx_info
from jax_mosaic_ffi.module_format import Arch, Image, ImageKind

DEVICE_INCLUDE_DIR = pathlib.Path(__file__).parent / "include"
_MEMORY_CACHE_SIZE = 512


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
    super().__init__(message)


@dataclasses.dataclass
class CompileStats:
  nvrtc_compiles: int = 0
  memory_hits: int = 0
  disk_hits: int = 0


_stats = CompileStats()
_lock = threading.Lock()
_memory: collections.OrderedDict[str, module_format.Module] = collections.OrderedDict()


def stats() -> CompileStats:
  with _lock:
    return dataclasses.replace(_stats)


def clear_memory_cache() -> None:
  with _lock:
    _memory.clear()


def _nvrtc():
  try:
    from cuda.bindings import nvrtc
  except ImportError as e:
    raise RuntimeError(
        "jax_mosaic_ffi compiles CUDA C++ with NVRTC through cuda-python; install "
        "it with `pip install cuda-bindings nvidia-cuda-nvrtc`") from e
  return nvrtc


@functools.cache
def nvrtc_version() -> tuple[int, int]:
  nvrtc = _nvrtc()
  err, major, minor = nvrtc.nvrtcVersion()
  _check(nvrtc, err, "nvrtcVersion")
  return int(major), int(minor)


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
  """Where <cuda_fp16.h> and friends live: the CUDA runtime wheel, else CUDA_HOME."""
  found = []
  try:
    import nvidia
    for base in nvidia.__path__:
      for sub in ("cu13/include", "cuda_runtime/include"):
        candidate = pathlib.Path(base) / sub
        if (candidate / "cuda_fp16.h").exists():
          found.append(str(candidate))
  except ImportError:
    pass
  for env in ("CUDA_HOME", "CUDA_PATH"):
    if os.environ.get(env):
      found.append(os.path.join(os.environ[env], "include"))
  found.append("/usr/local/cuda/include")
  return tuple(d for d in dict.fromkeys(found) if os.path.isdir(d))


def _check(nvrtc, err, what: str) -> None:
  if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
    _, text = nvrtc.nvrtcGetErrorString(err)
    raise RuntimeError(f"{what} failed: {text.decode() if isinstance(text, bytes) else text}")


def _has_option(options, *prefixes) -> bool:
  return any(str(o).startswith(p) for o in options for p in prefixes)


def compile_cuda(source: str, name: str, *, options=(), headers=None,
                 targets: tuple[Arch, ...]) -> module_format.Module:
  """Compiles ``source`` for each target and returns the module's contents.

  The result holds one cubin per target and the PTX of the first one, the
  portable form a newer GPU can still JIT.
  """
  options = tuple(str(o) for o in options)
  if _has_option(options, "-arch", "--gpu-architecture", "-gencode"):
    raise ValueError(
        "set the GPU architecture with targets=('sm_90', ...), not with NVRTC options")
  headers = dict(sorted((headers or {}).items()))
  version = nvrtc_version()
  entry_key = disk_cache.key(
      f"format{module_format.FORMAT_VERSION}", f"nvrtc{version[0]}.{version[1]}",
      source, name, *options, *(f"{k}\0{v}" for k, v in headers.items()),
      *(t.sm for t in targets))
  with _lock:
    if entry_key in _memory:
      _memory.move_to_end(entry_key)
      _stats.memory_hits += 1
      return _memory[entry_key]
  module = None
  cached = disk_cache.load(entry_key)
  if cached is not None:
    try:
      module = module_format.parse(cached)
      with _lock:
        _stats.disk_hits += 1
    except module_format.ModuleFormatError:
      module = None
  if module is None:
    module = _compile_with_nvrtc(source, name, options, headers, targets)
    disk_cache.store(entry_key, module_format.serialize(module))
  with _lock:
    _memory[entry_key] = module
    while len(_memory) > _MEMORY_CACHE_SIZE:
      _memory.popitem(last=False)
  return module


def _compile_with_nvrtc(source, name, options, headers, targets) -> module_format.Module:
  nvrtc = _nvrtc()
  filename = re.sub(r"\W", "_", name.split("<")[0]) + ".cu"
  base_options = list(options)
  if not _has_option(options, "-std", "--std"):
    base_options.append("-std=c++17")
  base_options.append(f"-I{DEVICE_INCLUDE_DIR}")
  base_options.extend(f"-I{d}" for d in cuda_include_dirs())
  images = []
  symbol = None
  for index, target in enumerate(targets):
    err, prog = nvrtc.nvrtcCreateProgram(
        source.encode(), filename.encode(), len(headers),
        [v.encode() for v in headers.values()], [k.encode() for k in headers])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
      _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, name.encode())[0],
             "nvrtcAddNameExpression")
      opts = [o.encode() for o in base_options] + [f"--gpu-architecture={target.sm}".encode()]
      with _lock:
        _stats.nvrtc_compiles += 1
      (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
      log = _program_log(nvrtc, prog)
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(name, log or str(err), source, filename)
      err, lowered = nvrtc.nvrtcGetLoweredName(prog, name.encode())
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or not lowered:
        raise CompileError(
            name, f"'{name}' does not name a __global__ function in {filename}", source, filename)
      symbol = lowered.decode()
      err, size = nvrtc.nvrtcGetCUBINSize(prog)
      _check(nvrtc, err, "nvrtcGetCUBINSize")
      cubin = b" " * size
      _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
      images.append(Image(ImageKind.CUBIN, target, cubin))
      if index == 0:
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _check(nvrtc, err, "nvrtcGetPTXSize")
        ptx = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx)[0], "nvrtcGetPTX")
        ptx_image = Image(ImageKind.PTX, target, ptx.rstrip(b"\0"))
    finally:
      nvrtc.nvrtcDestroyProgram(prog)
  images.append(ptx_image)
  return module_format.Module(symbol, tuple(images))


def _program_log(nvrtc, prog) -> str:
  err, size = nvrtc.nvrtcGetProgramLogSize(prog)
  if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
    return ""
  log = b" " * size
  nvrtc.nvrtcGetProgramLog(prog, log)
  return log.rstrip(b"\0").decode(errors="replace")


def param_sizes(module: module_format.Module) -> tuple[int, ...] | None:
  """The kernel's parameter sizes, read from the module's PTX when it has one."""
  for image in module.images:
    if image.kind == ImageKind.PTX:
      return ptx_info.entries(image.data.decode(errors="replace")).get(module.symbol)
  return None
