"""The CUDA front end's kernels: `cuda_kernel` (CUDA C++ through NVRTC), `ptx_kernel` and `cubin_kernel`."""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import ptx_info
from jax_mosaic_ffi.base.module_format import Arch, Image, ImageKind, ParsedModule
from jax_mosaic_ffi.cuda.nvrtc import compiler
from jax_mosaic_ffi.cuda.nvrtc import program
from jax_mosaic_ffi.store import compile_cache
from jax_mosaic_ffi.toolchain import dump
from jax_mosaic_ffi.toolchain import param_types as param_types_lib
from jax_mosaic_ffi.toolchain.compiled import Compiled
from jax_mosaic_ffi.toolchain.kernel import DEFAULT_ARCH, Kernel, parse_targets


class CudaKernel(Kernel):
  """A compiled CUDA kernel: what `cuda_kernel`, `ptx_kernel` and `cubin_kernel` return, launched by
  `mosaic_kernel` with ``grid=``, ``block=`` and the CUDA options. Its own type, so that `mosaic_kernel` launches
  only the kernels of the CUDA front end as CUDA kernels (another front end's compiled kernel is refused by name):

    >>> kernel = jmf.cuda_kernel('extern "C" __global__ void fill(float* y) {}', "fill")
    >>> isinstance(kernel, jmf.CudaKernel), isinstance(kernel, jmf.Kernel)
    (True, True)
  """


# NVRTC options whose output is LTO IR (NVVM), which only a device link reads: the compile would succeed and its
# module fail to load.
_NOT_A_LOADABLE_MODULE = frozenset({"-dlto", "--dlink-time-opt", "-dlink-time-opt"})


def _check_text(text: str, what: str) -> None:
  """Refuses text that is not UTF-8 (a lone surrogate, as a bad decode leaves): NVRTC reads bytes."""
  try:
    text.encode()
  except UnicodeEncodeError as e:
    raise ValueError(f"cuda_kernel: {what} holds {text[e.start:e.end]!r} at character {e.start}, a lone surrogate "
                     "that is no UTF-8 character (left by decoding bytes with errors='surrogateescape'); decode the "
                     "text as UTF-8, or replace the character") from None


def _check_name(name, what: str) -> str:
  if not isinstance(name, str) or not name.strip():
    raise ValueError(f"{what} needs the name of the kernel's entry point as a non-empty string, got {name!r}")
  name = name.strip()
  try:
    name.encode()
  except UnicodeEncodeError:
    raise ValueError(f"{what}: the kernel name {name!r} holds a lone surrogate, no UTF-8 character; pass the entry "
                     "point's name as written in the source") from None
  if any(ord(c) < 0x20 or ord(c) == 0x7f for c in name):
    raise ValueError(f"{what}: the kernel name {name!r} holds control characters (a NUL, a newline); "
                     "pass the entry point's name as written in the source")
  if len(name.encode()) > module_format.LIMITS["max_symbol_length"]:
    raise ValueError(f"{what}: the kernel name is longer than {module_format.LIMITS['max_symbol_length']} bytes")
  return name


# `#include <nvshmem.h>` or <nvshmemx.h>, in the source or an in-memory header: the kernel calls NVSHMEM.
_NVSHMEM_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]nvshmemx?\.h[>"]', re.MULTILINE)


def includes_nvshmem(source: str, headers: Mapping[str, str] | None) -> bool:
  return any(_NVSHMEM_INCLUDE.search(text) for text in (source, *(headers or {}).values()))


def cuda_kernel(source: str, name: str, *, options: Sequence[str] = (),
                headers: Mapping[str, str] | None = None,
                targets: Sequence[str | int] | str | None = None, pdl: bool = True,
                nvshmem: bool | None = None) -> CudaKernel:
  """Compiles CUDA C++ with NVRTC, in this process: no GPU, nvcc or host compiler needed.

  The compile is cached in memory and on disk (the same source, options and targets never compile twice),
  and each parameter's C++ type is kept for `mosaic_kernel`'s checks. Templates are instantiated by name::

    >>> source = '''
    ... template <typename T, int ITEMS>
    ... __global__ void scale(const T* x, T* y, T a, int n) {
    ...   int i = (blockIdx.x * blockDim.x + threadIdx.x) * ITEMS;
    ...   for (int k = 0; k < ITEMS && i + k < n; ++k) y[i + k] = a * x[i + k];
    ... }'''
    >>> kernel = jmf.cuda_kernel(source, "scale<float, 4>", options=["--use_fast_math"])
    >>> [t.text for t in kernel.param_types]
    ['const float*', 'float*', 'float', 'int']

  :doc:`CUDA C++, PTX and cubin kernels </guides/cuda_kernels>` has more: the headers on the include
  path, kernels written for nvcc, TMA descriptors. Inside ``with jmf.compile_ahead():`` it returns at once and
  the program's kernels compile side by side (`compile_ahead`).

  Args:
    source: the CUDA C++ text.
    name: the ``__global__`` function to launch: an ``extern "C"`` name, or a
      C++ name such as ``"ns::add<float>"``, which NVRTC resolves.
    options: extra NVRTC options (``"-DBLOCK=128"``, ``"--use_fast_math"``).
    headers: in-memory headers, ``{"include name": "text"}``.
    targets: archs to build cubins for (``"sm_90a"``, ``"sm_100"``). Default:
      the visible GPUs, or sm_90 without one. The PTX of the first target is
      kept too, as the portable form.
    pdl: make the kernel safe for programmatic dependent launch (sm_90 and
      newer): its first instruction waits for the previous kernel on the
      stream, so the launch overlaps that kernel's tail. ``mosaic_kernel``
      then launches it with PDL unless ``uses_pdl=False``. A kernel that uses
      ``griddepcontrol`` itself is left as written.
    nvshmem: the kernel calls NVSHMEM (``nvshmem_*``, ``nvshmemx_*``): it is
      compiled as relocatable code and linked with NVSHMEM's device library
      (``pip install 'jax_mosaic_ffi[nvshmem]'``), and launched by calls with
      ``Collective(..., transport="nvshmem")``. Default: whether the source or
      a header includes ``<nvshmem.h>`` or ``<nvshmemx.h>``.

  Raises:
    CompileError: with NVRTC's log and the source lines it names (inside `compile_ahead`: where the kernel is
      first needed, or at the block's end).
  """
  if not isinstance(source, str) or not source.strip():
    raise ValueError("cuda_kernel needs the CUDA C++ source text")
  _check_text(source, "the source")
  name = _check_name(name, "cuda_kernel")
  if isinstance(options, (str, bytes)):
    raise TypeError(f"cuda_kernel: options must be a sequence of NVRTC options, like ['-DTILE=64'], got {options!r}")
  for option in options:
    _check_text(str(option), f"the option {option!r}")
    if str(option).split("=")[0] in _NOT_A_LOADABLE_MODULE:
      raise ValueError(f"cuda_kernel '{name}': the option {option!r} makes NVRTC emit LTO IR for a later device link, "
                       "not a module a GPU can load; leave it out (link-time optimization is not supported)")
  if headers is not None and not (isinstance(headers, Mapping) and
                                  all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
    raise TypeError("cuda_kernel: headers must map include names to header text, both strings")
  for include, text in (headers or {}).items():
    _check_text(include, f"the header name {include!r}")
    _check_text(text, f"the header {include!r}")
  if nvshmem is None:
    nvshmem = includes_nvshmem(source, headers)
  elif not isinstance(nvshmem, bool):
    raise TypeError(f"cuda_kernel: nvshmem must be True, False or None (detect it from the includes), got {nvshmem!r}")
  compiled = compiler.compile_cuda(source, name, options=options, headers=headers,
                                   targets=parse_targets(targets), pdl=bool(pdl), nvshmem=nvshmem)
  return _made(CudaKernel(name, compiled))


def _signature(signature, name: str, sizes: tuple[int, ...] | None, what: str) -> tuple[str, ...] | None:
  """The parameter types of a PTX or cubin kernel: ``signature=`` checked against the PTX's sizes, else
  what a mangled symbol says, else None (sizes alone are checked)."""
  if signature is None:
    return param_types_lib.of_symbol(name)
  types = param_types_lib.of_signature(signature, what)
  if sizes is not None:
    if len(types) != len(sizes):
      raise ValueError(f"{what} '{name}': signature= lists {len(types)} parameters, but the PTX entry has "
                       f"{len(sizes)} of {list(sizes)} bytes")
    for index, (text, size) in enumerate(zip(types, sizes)):
      declared = param_types_lib.parsed(text)
      width = 8 if declared.pointer else param_types_lib.builtin_size(declared.element)
      if width is not None and width != size:
        raise ValueError(f"{what} '{name}': signature[{index}] = {text!r} is {width} bytes, but the PTX "
                         f"entry's parameter {index} is {size}")
  return types


def ptx_kernel(ptx: str | bytes, name: str, *, pdl: bool = True, signature=None) -> CudaKernel:
  """Wraps PTX text; the driver compiles it for the GPU when it is loaded.

  ``name`` is the entry's symbol as it appears in the PTX (``.entry name``).
  The PTX's ISA version must be one the installed driver can compile. With
  ``pdl`` and a ``.target`` of sm_90 or newer, the entry waits for the
  previous kernel first, as `cuda_kernel` does. ``signature``: each
  parameter's type (``["const float*", "float*", "int"]``, or numpy names
  ``"bfloat16*"`` and dtypes for scalars), checked against each call's
  arrays and scalars as `cuda_kernel`'s are; without it only sizes are
  checked (unless ``name`` is a mangled C++ symbol, which carries them).
  Here the PTX NVRTC made stands in for PTX from elsewhere::

    >>> source = 'extern "C" __global__ void add(const float* x, float* y, int n) {}'
    >>> made = jmf.cuda_kernel(source, "add", targets=["sm_90"])
    >>> ptx = next(image.data for image in made.images if image.kind.name == "PTX")
    >>> jmf.ptx_kernel(ptx, "add", signature=["const float*", "float*", np.int32])
    CudaKernel('add', images=[ptx:sm_90])
  """
  name = _check_name(name, "ptx_kernel")
  if not isinstance(ptx, (str, bytes)):
    raise TypeError(f"ptx_kernel needs the PTX text as str or bytes, got {type(ptx).__name__}")
  text = ptx.decode(errors="replace") if isinstance(ptx, bytes) else ptx
  entries = ptx_info.entries(text)
  if name not in entries:
    raise ValueError(
        f"PTX has no entry named '{name}'; its entries are: {', '.join(entries) or 'none'}")
  arch = Arch.parse(ptx_info.target_arch(text) or DEFAULT_ARCH.sm)
  safe = False
  if pdl and arch.number >= program.PDL_MIN_ARCH:
    text, safe = program.wait_at_entry(text, name)
  types = _signature(signature, name, entries[name], "ptx_kernel")
  parsed = ParsedModule(name, (Image(ImageKind.PTX, arch, text.encode()),),
                        module_format.FLAG_PDL_WAIT if safe else 0)
  compile_cache.driver_compiled(
      lambda: {"front_end": "PTX", "kernel": name, "targets": [arch.sm], "specialization": "ptx_kernel"},
      "the driver compiles PTX on each node at its first launch",
      "Ship it compiled: jmf.cubin_kernel with a cubin per arch (ptxas -arch=sm_XX, or nvcc -cubin), or CUDA C++ "
      "(jmf.cuda_kernel), whose cubins a pack holds.")
  return _made(CudaKernel(name, Compiled.of(parsed, entries[name], param_types=types)))


def cubin_kernel(images: Mapping[str | int, bytes] | bytes, name: str, *,
                 arch: str | int | None = None, signature=None) -> CudaKernel:
  """Wraps prebuilt cubins, e.g. from ``nvcc -cubin``.

  Args:
    images: ``{"sm_90": cubin_bytes, ...}``, or one cubin's bytes with ``arch``.
    name: the entry symbol in the cubin (mangled for C++ kernels).
    arch: the arch of a single cubin passed as bytes (default sm_90).
    signature: each parameter's type, as for `ptx_kernel`; a cubin has no
      PTX to check sizes against at trace time, so this is the only
      trace-time check of its parameters (a mangled ``name`` gives them too).

  Here the cubins NVRTC made stand in for ``nvcc -cubin`` output::

    >>> source = 'extern "C" __global__ void add(const float* x, float* y, int n) {}'
    >>> made = jmf.cuda_kernel(source, "add", targets=["sm_90"])
    >>> cubins = {image.arch.sm: image.data for image in made.images if image.kind.name == "CUBIN"}
    >>> jmf.cubin_kernel(cubins, "add", signature=["const float*", "float*", "int"])
    CudaKernel('add', images=[cubin:sm_90])
  """
  name = _check_name(name, "cubin_kernel")
  types = _signature(signature, name, None, "cubin_kernel")
  if isinstance(images, (bytes, bytearray, memoryview)):
    images = {arch if arch is not None else DEFAULT_ARCH.sm: bytes(images)}
  elif arch is not None:
    raise ValueError("pass arch only with a single cubin; a mapping names each arch")
  if not isinstance(images, Mapping) or not images:
    raise ValueError("cubin_kernel needs at least one cubin: {'sm_90': cubin_bytes}")
  built = []
  for target, data in images.items():
    if not isinstance(data, (bytes, bytearray, memoryview)):
      raise TypeError(f"cubin_kernel: the image for {target!r} must be the cubin's bytes, got {type(data).__name__}")
    data = bytes(data)
    if data[:4] != b"\x7fELF":
      raise ValueError(f"the image for {target} is not a cubin (no ELF header)")
    built.append(Image(ImageKind.CUBIN, Arch.parse(target), data))
  return _made(CudaKernel(name, Compiled.of(ParsedModule(name, tuple(built)), None, param_types=types)))


def _made(kernel: CudaKernel) -> CudaKernel:
  dump.maybe_dump(kernel)
  return kernel
