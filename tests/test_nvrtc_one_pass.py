"""One NVRTC pass per compile and target: the headers that key a build come from the compile's own include trace.

The cache entry of an NVRTC compile lists the headers it read (base/file_deps.py), and a hit counts only while
they are unchanged. That list is NVRTC's include trace of the compile whose code is kept (program.py): the trace
must change no byte of the code, name every header (those a target alone includes too), and stay apart from the
program log the user reads on an error.
"""

import hashlib

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base.paths import DEVICE_INCLUDE_DIR
from jax_mosaic_ffi.cuda.nvrtc import compat as nvrtc_compat
from jax_mosaic_ffi.cuda.nvrtc import program

# Templates, CCCL and CUB: internal-linkage names and a deep include tree, where a trace could change the code.
TEMPLATED = r'''
#include <cub/block/block_reduce.cuh>
#include <cuda/std/limits>
#include <cuda_bf16.h>
template <typename T, int THREADS>
__global__ void block_max(const T* x, T* out) {
  using Reduce = cub::BlockReduce<T, THREADS>;
  __shared__ typename Reduce::TempStorage scratch;
  T v = x[blockIdx.x * THREADS + threadIdx.x];
  T m = Reduce(scratch).Reduce(v, [](T a, T b) { return a > b ? a : b; });
  if (threadIdx.x == 0) out[blockIdx.x] = m > cuda::std::numeric_limits<T>::lowest() ? m : T(0);
}
template __global__ void block_max<float, 128>(const float*, float*);
'''


def _nvrtc(source: str, arch: str, extra=()) -> tuple[int, bytes, bytes, str]:
  """(NVRTC's result, PTX, cubin, log) of one compile with this package's include path and prelude."""
  nvrtc = program.load_nvrtc()
  err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
  program.check(nvrtc, err, "nvrtcCreateProgram")
  try:
    options = ["-std=c++17", "--frandom-seed=k.cu", f"--gpu-architecture={arch}", *nvrtc_compat.nvrtc_options(),
               f"-I{DEVICE_INCLUDE_DIR}", *(f"-I{d}" for d in nvrtc_compat.cuda_include_dirs()), *extra]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b""
    if size > 1:  # NVRTC writes into the buffer: b" " * 1 would be Python's shared one-byte object
      log = b" " * size
      nvrtc.nvrtcGetProgramLog(prog, log)
    ptx = cubin = b""
    if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
      _, size = nvrtc.nvrtcGetPTXSize(prog)
      ptx = b" " * size
      nvrtc.nvrtcGetPTX(prog, ptx)
      _, size = nvrtc.nvrtcGetCUBINSize(prog)
      cubin = b" " * size
      nvrtc.nvrtcGetCUBIN(prog, cubin)
    return int(err), ptx, cubin, log.rstrip(b"\0").decode(errors="replace")
  finally:
    nvrtc.nvrtcDestroyProgram(prog)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_120a"])
def test_the_include_trace_changes_no_byte_of_the_code(tmp_path, arch):
  # What makes one pass enough: the kept compile is the traced one. (NVRTC's time trace, used before, changed
  # sm_100 and sm_120 code from one process to the next.)
  plain = _nvrtc(TEMPLATED, arch)
  traced = _nvrtc(TEMPLATED, arch, program.trace_options(str(tmp_path / "trace.txt")))
  assert plain[0] == 0 and plain[2], plain[3]
  digest = lambda result: [hashlib.sha256(part).hexdigest() for part in result[1:3]]  # noqa: E731
  assert digest(traced) == digest(plain)
  read = program.headers_read(str(tmp_path / "trace.txt"))
  assert any(path.endswith("/cub/block/block_reduce.cuh") for path, _ in read)


def test_the_trace_stays_out_of_the_log_the_user_reads(tmp_path):
  source = '#include <cuda_fp16.h>\nextern "C" __global__ void k(float* y) { int unused; y[0] = missing_name; }\n'
  plain = _nvrtc(source, "sm_90a")
  traced = _nvrtc(source, "sm_90a", program.trace_options(str(tmp_path / "trace.txt")))
  assert plain[0] != 0 and 'identifier "missing_name" is undefined' in plain[3]
  assert traced[3] == plain[3]
  assert any(path.endswith("/cuda_fp16.h") for path, _ in program.headers_read(str(tmp_path / "trace.txt")))


def test_the_trace_is_read_as_a_tree_and_anything_else_is_no_trace(tmp_path):
  trace = tmp_path / "trace.txt"
  trace.write_bytes(b"__nv_nvrtc_builtin_header.h\n/p/prelude.h\n /p/math.h\n/u/a.h\n /u/b.h\n  /u/c.h\n /u/d.h\n"
                    b"  /u/c.h\n__nv_name_map\n")
  assert program.headers_read(str(trace)) == [
      ("/p/prelude.h", None), ("/p/math.h", "/p/prelude.h"), ("/u/a.h", None), ("/u/b.h", "/u/a.h"),
      ("/u/c.h", "/u/b.h"), ("/u/d.h", "/u/a.h"), ("/u/c.h", "/u/d.h")]
  trace.write_bytes(b"/u/a.h\n   /u/too_deep.h\n")
  assert program.headers_read(str(trace)) is None  # not the trace NVRTC writes: the compile is cached nowhere
  assert program.headers_read(str(tmp_path / "absent.txt")) is None


def test_a_header_only_one_target_includes_keys_the_build(isolated_disk_cache, tmp_path):
  # Includes may depend on __CUDA_ARCH__: each target's compile names its own, with no pass of its own.
  (tmp_path / "blackwell.h").write_text("#define SCALE 3.0f\n")
  source = ('#if __CUDA_ARCH__ >= 1000\n#include "blackwell.h"\n#else\n#define SCALE 2.0f\n#endif\n'
            'extern "C" __global__ void k(float* y) { y[0] *= SCALE; }\n')
  options = [f"-I{tmp_path}"]
  made = jmf.cuda_kernel(source, "k", targets=["sm_90a", "sm_100a"], options=options)
  assert str(tmp_path / "blackwell.h") in {path for path, digest in made.compiled.deps if digest is not None}
  alone = jmf.cuda_kernel(source, "k", targets=["sm_90a"], options=options)
  assert str(tmp_path / "blackwell.h") not in {path for path, _ in alone.compiled.deps}
  # An edit of it is a new compile, in this process and from the disk cache.
  (tmp_path / "blackwell.h").write_text("#define SCALE 4.0f\n")
  before = jmf.kernel_cache_stats().compiles.get("nvrtc", 0)
  again = jmf.cuda_kernel(source, "k", targets=["sm_90a", "sm_100a"], options=options)
  assert jmf.kernel_cache_stats().compiles.get("nvrtc", 0) == before + 2
  assert again.compiled.parsed.images != made.compiled.parsed.images


def test_the_prelude_reads_no_cccl_header(isolated_disk_cache):
  # A kernel pays for no header it does not use: the prelude's names are its own headers', none CCCL's.
  made = jmf.cuda_kernel('extern "C" __global__ void k(uint* y) { y[0] = INT_MAX + offsetof(uint2, y); }', "k")
  read = {path for path, digest in made.compiled.deps if digest is not None}
  assert str(nvrtc_compat.PRELUDE) in read
  assert all(path.startswith(str(nvrtc_compat.INCLUDE_DIR)) for path in read), sorted(read)


@pytest.mark.parametrize("order", ["prelude, CCCL, compat", "CCCL, compat", "compat, CCCL"])
def test_the_prelude_and_cccl_define_the_same_names_without_a_word(order):
  # The compat headers define what CCCL's <cuda/std/climits>, <cstdint> and <cstddef> define under NVRTC, token
  # for token, so either may come first: NVRTC says nothing (an incompatible macro would log warning #47).
  cccl = "".join(f"#include <{h}>\n" for h in ("cuda/std/climits", "cuda/std/cstdint", "cuda/std/cstddef",
                                               "cub/cub.cuh", "cooperative_groups.h", "cuda_bf16.h"))
  compat = "".join(f"#include <{h}>\n" for h in ("climits", "cstdint", "cstddef", "sys/types.h", "cstdlib"))
  kernel = ('struct S { int a; double b; };\nextern "C" __global__ void k(long long* y) {\n'
            '  y[0] = (uint)INT_MAX + INT64_MAX / 4 + (long long)(SIZE_MAX / 8) + CHAR_MIN + LONG_MIN / 4;\n'
            '  y[1] = (long long)offsetof(S, b) + (long long)UINT64_C(3) + INTPTR_MAX / 8\n'
            '       + (long long)(ULONG_MAX / 8);\n'
            '}\n')
  source = {"prelude, CCCL, compat": cccl + compat, "CCCL, compat": cccl + compat,
            "compat, CCCL": compat + cccl}[order] + kernel
  extra = [] if order.startswith("prelude") else ["-DJMF_COMPAT_NO_PRELUDE"]
  err, _, _, log = _nvrtc(source, "compute_90a", extra)
  assert err == 0 and log == "", log
