"""A cold compile per front end against its native compiler alone, in one process, on the CPU or a GPU.

The cold_start benchmark's "compilers" run. Each row compiles the same kernel, alternating round by round, with
every cache empty (ours, Triton's, a new source for NVRTC):

- CUDA C++: ``jmf.cuda_kernel`` against NVRTC alone, as CuPy's ``RawKernel`` calls it (the source, the arch,
  ``-std=c++17`` and the CUDA include folders, the cubin read back); a small kernel and one including
  ``cuda_fp16.h``, ``cuda_bf16.h`` and cooperative groups. Ours runs in its compile worker (started before the
  rounds; the first compile of a process starts it, reported apart), with its prelude, the type probe, the include
  trace, the PDL wait at the entry (nvJitLink) and the disk cache's write.
- Triton: a call of ``jmf.triton_kernel`` built and lowered for CUDA (JAX's trace and lowering included) against
  ``triton.compile`` of the same specialization.
- CuTe DSL: a ``jmf.cute_call`` built and lowered for CUDA against ``cute.compile`` on the DSL's fake tensors.
- A program: six corpus kernels of similar cost (`PROGRAM`: 0.2-0.7 s each here) made inside ``jmf.compile_ahead()``
  and lowered as one program (each call traced and lowered for CUDA), against the same six compiled one by one by
  ``jmf.cuda_kernel`` (the sum of six single compiles, nothing lowered).

The goals (issue 76): a cold NVRTC compile at most 1.25x NVRTC alone; six kernels of one program at most 0.75x six
single compiles. Medians; ratios of numbers of the same run.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from benchmarks.markdown import fmt, last_line, table

SMALL = r'''
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
'''

HALVES = r'''
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void mix(const __half* x, __nv_bfloat16* y, int n) {
  cg::thread_block block = cg::this_thread_block();
  int i = block.group_index().x * block.size() + block.thread_rank();
  if (i < n) y[i] = __float2bfloat16(__half2float(x[i]) * 2.0f);
}
'''

ROUNDS = {"nvrtc_small": 15, "nvrtc_halves": 3, "triton": 5, "cute": 5, "program": 3}
# Six corpus kernels (benchmarks/kernels/cuda_corpus.py) of similar cost: with one much slower than the rest, a
# program's time is that one's, whatever runs beside it.
PROGRAM = ("gelu_forward_bf16", "softmax_forward_online", "sgemm_smem<128, 128, 64, 8, 8>", "wmma_gemm_bias",
           "attention_forward<64, 8, 32>", "rmsnorm_half2")
N = 1 << 16


def _arch() -> str:
  from jax_mosaic_ffi.base import gpu_info
  gpus = gpu_info.visible_gpus()
  number = gpus[0].arch if gpus else 90
  return f"sm_{number}a" if number in (90, 100, 103, 120, 121) else f"sm_{number}"


_ROOT: list[str] = []  # the run's folder, which every cache folder is made in (and removed with)


def _fresh_caches() -> None:
  import jax_mosaic_ffi as jmf
  os.environ["JAX_MOSAIC_FFI_CACHE_DIR"] = tempfile.mkdtemp(prefix="cache-", dir=_ROOT[0])
  os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-", dir=_ROOT[0])
  jmf.clear_kernel_cache()


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def _alternating(ours, native, rounds: int) -> dict:
  """Medians of ``ours(round)`` and ``native(round)``, each round in the other order than the one before."""
  times = {"ours": [], "native": []}
  for index in range(rounds):
    pair = [("ours", ours), ("native", native)]
    for side, fn in pair if index % 2 == 0 else pair[::-1]:
      _fresh_caches()
      times[side].append(_timed(lambda fn=fn: fn(index)))
  ours_s, native_s = statistics.median(times["ours"]), statistics.median(times["native"])
  return {"ours_s": ours_s, "native_s": native_s, "ratio": ours_s / native_s, "rounds": rounds}


def _nvrtc_alone(source: str, arch: str) -> None:
  """What CuPy's RawKernel asks of NVRTC: the source, the arch, C++17, the CUDA headers; the cubin back."""
  from cuda.bindings import nvrtc
  from jax_mosaic_ffi.cuda.nvrtc import compat
  err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
  try:
    options = [f"--gpu-architecture={arch}", "-std=c++17", *(f"-I{d}" for d in compat.cuda_include_dirs())]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
      raise RuntimeError(f"NVRTC alone failed: {err}")
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    nvrtc.nvrtcGetCUBIN(prog, b" " * size)
  finally:
    nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_rows(arch: str) -> dict:
  import jax_mosaic_ffi as jmf
  rows = {}
  _fresh_caches()
  first = _timed(lambda: jmf.cuda_kernel(SMALL + "// the process's first\n", "scale", targets=[arch]))
  for row, source, name in (("nvrtc_small", SMALL, "scale"), ("nvrtc_halves", HALVES, "mix")):
    fresh = lambda index, source=source: f"{source}// round {index}\n"  # noqa: E731  (a new key, the same work)
    rows[row] = _alternating(lambda i, name=name, fresh=fresh: jmf.cuda_kernel(fresh(i), name, targets=[arch]),
                             lambda i, fresh=fresh: _nvrtc_alone(fresh(i), arch), ROUNDS[row])
  rows["nvrtc_small"]["first_in_process_s"] = first
  return rows


def _program_row(arch: str) -> dict:
  import jax
  import numpy as np
  import jax_mosaic_ffi as jmf
  from benchmarks.kernels import cuda_corpus
  cases = [next(c for c in cuda_corpus.CASES if c.name == name) for name in PROGRAM]
  rng = np.random.default_rng(0)
  avals = [[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in case.inputs(rng)] for case in cases]

  def fresh(case, index: int) -> str:
    return f"{cuda_corpus.source_of(case)}\n// round {index}\n"  # a new key, the same work

  def program(index):
    with jmf.compile_ahead():
      kernels = [jmf.cuda_kernel(fresh(case, index), case.name, targets=[arch]) for case in cases]
    for case, kernel, args in zip(cases, kernels, avals):
      jax.jit(case.call(kernel)).trace(*args).lower(lowering_platforms=("cuda",))

  def singly(index):
    for case in cases:
      jmf.cuda_kernel(fresh(case, index), case.name, targets=[arch])

  row = _alternating(program, singly, ROUNDS["program"])
  from benchmarks import machine
  row["capacity"] = machine.parallel_capacity()  # measured in the same run: what side by side could gain here
  return row


def _triton_row(arch: str) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import triton
  import triton.language as tl
  from triton.backends.compiler import GPUTarget
  from triton.compiler import ASTSource
  import jax_mosaic_ffi as jmf

  @triton.jit
  def add_scaled(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=mask) * 2.0, mask=mask)

  number = int("".join(c for c in arch if c.isdigit()))
  x = jax.ShapeDtypeStruct((N,), jnp.float32)

  def ours(_):
    call = jmf.mosaic_kernel(jmf.triton_kernel(add_scaled, constexprs={"BLOCK": 1024}, num_warps=4), lambda x: x,
                             grid=lambda meta, x: jmf.cdiv(x.size, 1024), scalars=lambda meta, x: (np.int32(x.size),))
    jax.jit(call).trace(x).lower(lowering_platforms=("cuda",))

  def native(_):
    source = ASTSource(fn=add_scaled, signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                                                 "BLOCK": "constexpr"}, constexprs={(3,): 1024})
    triton.compile(source, target=GPUTarget("cuda", number, 32), options={"num_warps": 4})

  native(0)  # Triton's lazy imports and backend set-up: neither side's compile
  return _alternating(ours, native, ROUNDS["triton"])


def _cute_row() -> dict:
  import jax
  import jax.numpy as jnp
  import cutlass
  import cutlass.cute as cute
  from cutlass.cute import runtime
  import jax_mosaic_ffi as jmf
  from benchmarks.kernels import cute_elementwise

  x = jax.ShapeDtypeStruct((N,), jnp.float32)

  def ours(_):
    jax.jit(jmf.cute_call(cute_elementwise.add_one, output_shape_dtype=x)).trace(x).lower(
        lowering_platforms=("cuda",))

  def native(_):
    tensors = [runtime.make_fake_compact_tensor(cutlass.Float32, (N,)) for _ in range(2)]
    cute.compile(cute_elementwise.add_one, runtime.make_fake_stream(), *tensors)

  return _alternating(ours, native, ROUNDS["cute"])


def run() -> dict:
  """Every row this machine can measure; a front end whose package is missing (or fails) is its row's reason."""
  arch = _arch()
  if arch == "sm_90a":
    os.environ.setdefault("CUTE_DSL_ARCH", arch)  # the DSL compiles for the arch it runs on: without a GPU, this one
  out = {"arch": arch, "rows": {}, "errors": {}}
  _ROOT[:] = [tempfile.mkdtemp(prefix="jmf-cold-compile-")]
  try:
    _measure_all(arch, out)
  finally:
    shutil.rmtree(_ROOT[0], ignore_errors=True)
  out["measured"] = bool(out["rows"])
  return out


def _measure_all(arch: str, out: dict) -> None:
  for name, measure in (("nvrtc", lambda: _nvrtc_rows(arch)), ("program", lambda: {"program": _program_row(arch)}),
                        ("triton", lambda: {"triton": _triton_row(arch)}),
                        ("cute", lambda: {"cute": _cute_row()})):
    try:
      out["rows"].update(measure())
    except ImportError as e:
      out["errors"][name] = f"not installed: {last_line(str(e))}"
    except Exception as e:  # one front end's failure is its row
      out["errors"][name] = last_line(f"{type(e).__name__}: {e}")


_ROWS = (("nvrtc_small", "nvrtc", "CUDA C++, a small kernel", "`jmf.cuda_kernel`", "NVRTC alone"),
         ("nvrtc_halves", "nvrtc", "CUDA C++, `cuda_fp16.h` + `cuda_bf16.h` + cooperative groups",
          "`jmf.cuda_kernel`", "NVRTC alone"),
         ("triton", "triton", "Triton, an elementwise kernel", "`jmf.triton_kernel` call, built and lowered",
          "`triton.compile`"),
         ("cute", "cute", "CuTe DSL, the corpus's add_one", "`jmf.cute_call`, built and lowered", "`cute.compile`"),
         ("program", "program", "CUDA C++, six corpus kernels of one program",
          "made in `jmf.compile_ahead()`, lowered", "six single `jmf.cuda_kernel` compiles"))


def table_of(result: dict) -> str:
  """The rows of `run`'s result, with the method above them."""
  rows = []
  for key, front_end, what, ours, native in _ROWS:
    r = result.get("rows", {}).get(key)
    if r is None:
      rows.append([what, ours, native, "n/a", "n/a", result.get("errors", {}).get(front_end, "not run")[:80]])
      continue
    rows.append([what, ours, native, f"{fmt(r['ours_s'] * 1e3, 1)} ms", f"{fmt(r['native_s'] * 1e3, 1)} ms",
                 f"**{fmt(r['ratio'])}x**"])
  first = result.get("rows", {}).get("nvrtc_small", {}).get("first_in_process_s")
  capacity = result.get("rows", {}).get("program", {}).get("capacity")
  method = (f"A cold compile per front end against its native compiler alone, for {result.get('arch', '?')}, in one "
            "process, alternating round by round with every cache empty (medians): NVRTC alone as CuPy's RawKernel "
            "calls it (the source, the arch, `-std=c++17`, the CUDA include folders); Triton's and the CuTe DSL's "
            "own compile of the same specialization, against our call built and lowered for CUDA (JAX's trace and "
            "lowering included). Ours for CUDA C++ runs in its compile worker, started before the rounds"
            + (f" (the process's first compile, which starts it, took {fmt(first * 1e3, 1)} ms)" if first else "")
            + f". The program row: six corpus kernels of similar cost ({', '.join(f'`{n}`' for n in PROGRAM)}) made "
            "inside `jmf.compile_ahead()` and each call lowered, against the six compiled one by one, on "
            f"{os.cpu_count()} CPUs"
            + (f" (the CPUs' work the machine gave a run then: {fmt(capacity, 2)}, two busy processes at once "
               "against one; shared with other users)" if capacity else "")
            + ". Goals: a cold NVRTC compile at most 1.25x NVRTC alone; the program at most "
            "0.75x six single compiles.")
  return method + "\n\n" + table(["kernel", "ours", "native", "ours, cold", "native, cold", "ours / native"], rows,
                                 "lllrrr")
