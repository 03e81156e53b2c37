"""Sources that nvcc accepts, compiled by NVRTC unchanged: the compat headers, and advice for the rest.

nvcc puts the host C and C++ libraries in front of every ``.cu`` file
(``cuda_runtime.h`` pulls in ``<cmath>``, ``<stdlib.h>``, ``<sys/types.h>``),
so real kernels use ``INFINITY``, ``M_PI``, ``uint``, ``std::exp`` and
``#include <cassert>`` without a second thought. NVRTC has none of those
files. ``include/jmf_compat`` has one small header per name that kernels use
(each says why it exists), and ``jmf_compat_prelude.h``, which NVRTC includes
before every source (``--pre-include``) to give what nvcc gives without any
include. The compat directory comes first on the include path, so its
``<cub/cub.cuh>`` (the block/warp-level CUB only) wins over CCCL's.

What still fails (host code, a header we do not have) keeps NVRTC's log, and
:func:`advice` adds one line saying what to do.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re

from jax_mosaic_ffi.base.paths import DEVICE_INCLUDE_DIR

INCLUDE_DIR = DEVICE_INCLUDE_DIR / "jmf_compat"
PRELUDE = INCLUDE_DIR / "jmf_compat_prelude.h"


def _headers_hash() -> str:
  digest = hashlib.sha256()
  for path in sorted(p for p in INCLUDE_DIR.rglob("*") if p.is_file()):
    digest.update(path.relative_to(INCLUDE_DIR).as_posix().encode() + b"\0")
    digest.update(path.read_bytes() + b"\0")
  return digest.hexdigest()[:16]


# Part of the compile cache key: compiled kernels are kept on disk, and any
# change to the compat headers (an edit, a new file) may change what they
# compile to.
HEADERS_HASH = _headers_hash()


def include_dirs() -> tuple[str, ...]:
  return (str(INCLUDE_DIR),)


def nvrtc_options() -> list[str]:
  """The NVRTC options that put the compat headers in force: the include
  directory (to go before CCCL's and the toolkit's) and the prelude."""
  return [f"-I{d}" for d in include_dirs()] + [f"--pre-include={PRELUDE}"]


# --- advice -----------------------------------------------------------------

# Host-only parts of the C++ library: no device equivalent to point at.
_HOST_ONLY_HEADERS = {
    "iostream", "istream", "ostream", "fstream", "sstream", "iomanip", "ios", "streambuf", "string",
    "string_view", "vector", "map", "set", "unordered_map", "unordered_set", "list", "forward_list",
    "deque", "queue", "stack", "memory", "thread", "mutex", "condition_variable", "future", "regex",
    "filesystem", "random", "stdexcept", "exception", "locale", "codecvt", "typeinfo", "any",
}

# Headers of other CUDA libraries and header-only projects, not on our include path.
_CUDA_LIBRARY_HEADER = re.compile(r"^(curand|cublas|cufft|cusparse|cusolver|nccl|nvshmem|cudnn|nvtx|cutlass|cute)",
                                  re.IGNORECASE)

# Names whose header the source forgot; nvcc code often gets them through
# another include. name -> header that declares them under NVRTC.
_HEADER_OF = {}
for _names, _header in (
    ("half half2 __half __half2 __half_raw __float2half __half2float __float2half_rn __floats2half2_rn "
     "__hadd __hmul __hadd2 __hmul2 __hfma2 __low2half __high2half __half22float2 __float22half2_rn", "<cuda_fp16.h>"),
    ("nv_bfloat16 nv_bfloat162 __nv_bfloat16 __nv_bfloat162 __float2bfloat16 __bfloat162float "
     "__float22bfloat162_rn __bfloat1622float2 __floats2bfloat162_rn", "<cuda_bf16.h>"),
    ("__nv_fp8_e4m3 __nv_fp8_e5m2 __nv_fp8x2_e4m3 __nv_fp8x4_e4m3", "<cuda_fp8.h>"),
    ("FLT_MAX FLT_MIN FLT_EPSILON FLT_TRUE_MIN FLT_MANT_DIG FLT_DIG DBL_MAX DBL_MIN DBL_EPSILON "
     "DBL_TRUE_MIN DBL_MANT_DIG DBL_DIG", "<cfloat>"),
    ("CUDART_INF_F CUDART_NAN_F CUDART_PI_F CUDART_INF CUDART_NAN CUDART_PI CUDART_MAX_NORMAL_F",
     "<math_constants.h>"),
    ("__pipeline_memcpy_async __pipeline_commit __pipeline_wait_prior", "<cuda_pipeline.h>"),
):
  for _name in _names.split():
    _HEADER_OF[_name] = _header

# std:: names that a compat header gives, by header.
_STD_HEADER_OF = {}
for _names, _header in (
    ("is_same is_same_v enable_if enable_if_t conditional conditional_t is_floating_point is_integral "
     "is_signed is_unsigned is_pointer is_const remove_cv remove_cv_t remove_reference remove_reference_t "
     "decay decay_t integral_constant true_type false_type is_arithmetic is_convertible common_type "
     "underlying_type make_unsigned make_signed void_t is_trivially_copyable remove_const "
     "remove_pointer add_const is_base_of is_void is_array is_class is_enum invoke_result", "<type_traits>"),
    ("numeric_limits", "<limits>"),
    ("swap exchange pair make_pair declval integer_sequence index_sequence make_index_sequence get",
     "<utility>"),
    ("min max clamp", "<algorithm>"),
    ("int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t intptr_t uintptr_t", "<cstdint>"),
    ("size_t ptrdiff_t nullptr_t byte", "<cstddef>"),
    ("printf", "<cstdio>"),
    ("memcpy memset", "<cstring>"),
    ("malloc free", "<cstdlib>"),
):
  for _name in _names.split():
    _STD_HEADER_OF[_name] = _header

_HOST_ONLY_STD = set(
    "vector string string_view map set unordered_map unordered_set list deque queue stack cout cerr "
    "endl ostream istream ifstream ofstream stringstream unique_ptr shared_ptr make_unique make_shared "
    "thread mutex function runtime_error exception".split())

_HOST_ONLY_CALLS = set(
    "fprintf fputs puts fflush fopen fclose fwrite fread stderr stdout exit abort getenv atexit "
    "cudaMalloc cudaFree cudaMemcpy cudaMemset cudaDeviceSynchronize cudaStreamSynchronize "
    "cudaGetLastError cudaFuncSetAttribute cudaLaunchKernel cudaStreamCreate".split())

_OLD_WARP_INTRINSICS = {"__shfl": "__shfl_sync", "__shfl_up": "__shfl_up_sync",
                        "__shfl_down": "__shfl_down_sync", "__shfl_xor": "__shfl_xor_sync",
                        "__any": "__any_sync", "__all": "__all_sync", "__ballot": "__ballot_sync"}

_NAMESPACE_HEADERS = (("nvcuda", "<mma.h>"), ("wmma", "<mma.h>"), ("cub", "<cub/cub.cuh>"),
                      ("cooperative_groups", "<cooperative_groups.h>"),
                      ("cg", "<cooperative_groups.h> (and namespace cg = cooperative_groups;)"))

_DEVICE_WIDE = ("CUB's device-wide algorithms (cub::Device*) and Thrust launch kernels from the host, which "
                "NVRTC cannot compile: use block/warp-level CUB in the kernel (<cub/cub.cuh> gives just "
                "that under jax_mosaic_ffi) and do device-wide steps in jax.numpy around it")

_HOST_CODE = ("NVRTC compiles device code only: mark helper functions __device__ (or __host__ __device__) "
              "and leave launchers, main() and host-side API calls out of the kernel source "
              "(jmf.mosaic_kernel launches it); options=('-default-device',) makes unannotated functions "
              "and variables device ones")


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
  """Where <cuda_fp16.h> and CCCL (cuda/std/..., which cooperative_groups
  needs) live, as cuda-python's pathfinder finds them: the CUDA wheels, else
  CUDA_HOME or the system toolkit."""
  found = []
  try:
    from cuda import pathfinder  # noqa: PLC0415  (optional: older cuda-python has no pathfinder)
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
def _cccl_std_headers() -> frozenset[str]:
  """The <cuda/std/...> headers of the CCCL we compile against."""
  names = set()
  for directory in cuda_include_dirs():
    std = os.path.join(directory, "cuda", "std")
    if os.path.isdir(std):
      names.update(n for n in os.listdir(std) if not n.startswith("_") and "." not in n)
  return frozenset(names)


_ERROR_LINE = re.compile(r"^(.*?)\((\d+)\): (?:catastrophic )?error: (.*)$", re.MULTILINE)


def _errors(log: str) -> list[tuple[str, str]]:
  """(file, message) of each error in an NVRTC log."""
  return [(m.group(1), m.group(3)) for m in _ERROR_LINE.finditer(log)]


def _missing_header(header: str, included_from: str) -> str:
  if re.search(r"(^|/)(cub/(device|agent|dispatch)|thrust)/", included_from):
    return _DEVICE_WIDE
  base = header.rsplit("/", 1)[-1]
  if base in _HOST_ONLY_HEADERS or header.startswith("thrust/"):
    return (f"<{header}> is host-side C++, and NVRTC compiles device code only: keep host code "
            "(launchers, containers, I/O) out of the kernel source; jmf.mosaic_kernel does the launch")
  if "/" not in header and base in _cccl_std_headers():
    return (f"NVRTC has no C++ standard library: in device code use <cuda/std/{base}> and cuda::std:: "
            f"instead of <{header}> and std::")
  if _CUDA_LIBRARY_HEADER.match(header):
    return (f"<{header}> belongs to a CUDA library that is not on jax_mosaic_ffi's include path "
            "(the CUDA runtime's and CCCL's headers are): pass its directory with "
            "options=('-I/path/to/include',)")
  return (f"'{header}' was not found: NVRTC sees only the source text, the CUDA and CCCL headers and "
          f"what you pass; give it as headers={{'{header}': text}} or its directory as options=('-I<dir>',)")


def advice(log: str) -> str | None:
  """One line of advice for an NVRTC log, or None when it has none to give.

  Rules go from the most specific to the most general; the first that
  matches wins, so a knock-on error (a missing type makes NVRTC report a
  'host variable' too) does not hide the cause. (Long on purpose: one short
  rule per branch, and their order is the logic, read top to bottom.)
  """
  if not log:
    return None
  errors = _errors(log)
  # NVRTC checks the kernel's name last, in a file of its own; when the
  # source itself has errors, that check fails too, as a knock-on.
  own = [message for where, message in errors if where != "__nv_name_map"]
  text = "\n".join(own)

  m = re.search(r'^(.*?)\(\d+\): catastrophic error: cannot open source file "([^"]+)"', log, re.MULTILINE)
  if m:
    return _missing_header(m.group(2), m.group(1))

  if errors and not own:
    if any("cannot determine which instance of function template" in message for _, message in errors):
      return ("name a template kernel with all its template arguments, as C++ would instantiate it: "
              "e.g. 'kernels::scale<float, 4>'")
    return ("the name must be the kernel's C++ name, with its namespaces and template arguments "
            "(e.g. 'ns::kernel<float>'), or the plain name of an extern \"C\" __global__ function")
  if "does not name a __global__ function" in log:
    return ("check that the kernel is __global__ and spelled as in the source; a C++ kernel is named "
            "with its namespaces and template arguments (e.g. 'ns::kernel<float>')")

  m = re.search(r"uses too much shared data \((0x[0-9a-fA-F]+) bytes", log)
  if m:
    return (f"static __shared__ arrays are limited to 48 KiB per block ({int(m.group(1), 16)} bytes asked): "
            "declare `extern __shared__ T smem[];` and pass smem_bytes= to jmf.mosaic_kernel, which may go "
            "above 48 KiB (up to 227 KiB on H100/H200)")

  for name in re.findall(r'identifier "(\w+)" is undefined', text):
    if name in _OLD_WARP_INTRINSICS:
      return (f"{name} without a lane mask was removed in CUDA 9: use {_OLD_WARP_INTRINSICS[name]}"
              "(0xffffffff, ...) (or the mask of the lanes taking part)")
  if re.search(r"Instruction '(vote|shfl)' without '\.sync'", log):
    return ("warp vote/shuffle without .sync is not supported on sm_70 and newer: use the *_sync "
            "intrinsics (__ballot_sync, __shfl_sync, ...) with a lane mask")

  for name in re.findall(r'identifier "(\w+)" is undefined', text):
    if name in _HEADER_OF:
      return f"'{name}' is declared in {_HEADER_OF[name]}: add #include {_HEADER_OF[name]}"
  if re.search(r'name followed by "::" must be a class or namespace name|name must be a namespace name', text):
    for namespace, header in _NAMESPACE_HEADERS:
      if re.search(rf"(?<![\w:]){namespace}::|=\s*{namespace}\s*;", log):
        return f"namespace '{namespace}' is declared in {header}: add #include {header.split(' ')[0]}"

  m = re.search(r'namespace "std" has no member "(\w+)"', text)
  if m:
    name = m.group(1)
    if name in _STD_HEADER_OF:
      return (f"add #include {_STD_HEADER_OF[name]}: jax_mosaic_ffi provides it to NVRTC "
              f"(nvcc code often gets std::{name} through another header)")
    if name in ("sort", "stable_sort"):
      return (f"std::{name} is not available in device code: sort a block's items with cub::BlockRadixSort "
              "or cub::BlockMergeSort (<cub/cub.cuh>), or sort outside the kernel with jax.numpy")
    if name in _HOST_ONLY_STD:
      return (f"std::{name} is host-side C++, and NVRTC compiles device code only: keep it out of the "
              "kernel source")
    return (f"NVRTC has no C++ standard library beyond jax_mosaic_ffi's compat headers (<cmath>, <cstdint>, "
            f"<type_traits>, <utility>, <limits>, std::min/max/clamp): use cuda::std::{name} from "
            "<cuda/std/...> where CCCL has it")

  m = re.search(r'namespace "cub" has no member "(Sum|Max|Min)"', text)
  if m:
    replacement = {"Sum": "cuda::std::plus<>{}", "Max": "cuda::maximum<>{}", "Min": "cuda::minimum<>{}"}
    return (f"CCCL 3 removed cub::{m.group(1)}: use {replacement[m.group(1)]} "
            "(#include <cuda/functional>)")

  for name in re.findall(r'identifier "(\w+)" is undefined', text):
    if name in _HOST_ONLY_CALLS or (name.startswith("cuda") and name[4:5].isupper()):
      return (f"'{name}' is host-side, and NVRTC compiles device code only: in a kernel use printf to "
              "report, assert or __trap() to stop; call the CUDA runtime from the host")

  if re.search(r"texture is not a template|identifier \"texture\" is undefined", text):
    return ("texture references were removed in CUDA 12: pass the array as an input (read it through a "
            "const __restrict__ pointer or __ldg)")
  if "explicitly marked as a __host__ function is not allowed in JIT mode" in text:
    if any(re.search(r"(^|/)(cub/(device|agent|dispatch)|thrust)/", where) for where, _ in errors):
      return _DEVICE_WIDE
    return _HOST_CODE
  if "host functions are not allowed in JIT mode" in text:
    return _HOST_CODE
  if "host variables are not allowed in JIT mode" in text:
    return ("a namespace-scope variable without __device__ or __constant__ is host data, which NVRTC "
            "cannot compile: make it __constant__ (read-only tables), __device__ or constexpr, or pass "
            "options=('-default-device',)")
  if re.search(r"calling a (constexpr )?__host__ function.*from a __(global|device)__ function", text):
    return ("a host function is called from device code: mark it __host__ __device__, or for constexpr "
            "functions pass options=('--expt-relaxed-constexpr',)")
  if "does not support exception handling" in text:
    return "device code has no exceptions: use assert(...) or __trap() to stop a kernel"
  return None
