"""Small CuTe DSL launchers for the CuTe tests (the DSL reads their source, so they live in a file), and the
corpus's add_one."""

import os
import time

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import numpy as np

import benchmarks_package

# y = x + 1 over a 1-D float32 tensor: the corpus's, as the benchmarks launch it.
add_one = benchmarks_package.kernels("cute_elementwise").add_one


@cute.kernel
def _axpy_kernel(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, alpha: cutlass.Float32):
  tidx, _, _ = cute.arch.thread_idx()
  bidx, _, _ = cute.arch.block_idx()
  bdim, _, _ = cute.arch.block_dim()
  i = bidx * bdim + tidx
  m, n = a.shape
  if i < m * n:
    c[i // n, i % n] = alpha * a[i // n, i % n] + b[i // n, i % n]


@cute.jit
def axpy(stream: cuda.CUstream, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, *, alpha: cutlass.Constexpr = 2.0,
         threads: cutlass.Constexpr = 128):
  """c = alpha * a + b over 2-D float32 tensors; alpha and the block size are compile-time constants."""
  m, n = a.shape
  _axpy_kernel(a, b, c, cutlass.Float32(alpha)).launch(grid=((m * n + threads - 1) // threads, 1, 1),
                                                      block=(threads, 1, 1), stream=stream)


@cute.kernel
def _axpy_batched_kernel(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, alpha: cutlass.Float32):
  tidx, _, _ = cute.arch.thread_idx()
  bidx, _, _ = cute.arch.block_idx()
  bdim, _, _ = cute.arch.block_dim()
  i = bidx * bdim + tidx
  m, n, batch = a.shape
  if i < m * n * batch:
    k, r = i // (m * n), i % (m * n)
    c[r // n, r % n, k] = alpha * a[r // n, r % n, k] + b[r // n, r % n, k]


@cute.jit
def axpy_batched(stream: cuda.CUstream, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, *,
                 alpha: cutlass.Constexpr = 2.0, threads: cutlass.Constexpr = 128):
  """c = alpha * a + b over (M, N, L) float32 tensors: a batch mode L last, as the DSL's GEMM examples take."""
  m, n, batch = a.shape
  _axpy_batched_kernel(a, b, c, cutlass.Float32(alpha)).launch(
      grid=((m * n * batch + threads - 1) // threads, 1, 1), block=(threads, 1, 1), stream=stream)


@cute.jit
def scale_in_place(stream: cuda.CUstream, x: cute.Tensor):
  """x = x + 1 in place (an aliased output: the launcher gets only the input)."""
  add_one(stream, x, x)


@cute.jit
def broken(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor):
  """Does not compile: a tensor has no attribute 'nope'."""
  x.nope()


@cute.jit
def step_state(stream: cuda.CUstream, state, new_state):
  """A pytree in place: state["m"] = state["m"] + 1 (aliased by key path: its output leaf is None here), and
  new_state["v"] = state["v"] + 1."""
  add_one(stream, state["m"], state["m"])
  add_one(stream, state["v"], new_state["v"])


# A module-level table a launcher reads while the DSL traces it (tests/test_cute_keys.py edits entries of it):
# 2000 entries, so numpy prints it shortened, and its floats to 8 digits.
TABLE = np.linspace(0.0, 1.0, 2000)
PICK = 1000


@cute.kernel
def _add_constant_kernel(x: cute.Tensor, y: cute.Tensor, c: cutlass.Float32):
  tidx, _, _ = cute.arch.thread_idx()
  bidx, _, _ = cute.arch.block_idx()
  bdim, _, _ = cute.arch.block_dim()
  i = bidx * bdim + tidx
  if i < x.shape[0]:
    y[i] = x[i] + c


@cute.jit
def add_table_entry(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor):
  """y = x + TABLE[PICK] over 1-D float32 tensors: the module-level table's entry compiled in as a constant."""
  n = x.shape[0]
  _add_constant_kernel(x, y, cutlass.Float32(float(TABLE[PICK]))).launch(grid=((n + 127) // 128, 1, 1),
                                                                       block=(128, 1, 1), stream=stream)


@cute.jit
def add_entry_of(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor, *, table: cutlass.Constexpr,
                 index: cutlass.Constexpr = 1000):
  """y = x + table[index], for a table given as a constexpr (a numpy array)."""
  n = x.shape[0]
  _add_constant_kernel(x, y, cutlass.Float32(float(table[index]))).launch(grid=((n + 127) // 128, 1, 1),
                                                                        block=(128, 1, 1), stream=stream)


@cute.kernel
def _unrolled_kernel(x: cute.Tensor, y: cute.Tensor, steps: cutlass.Constexpr):
  tidx, _, _ = cute.arch.thread_idx()
  acc = x[tidx]
  for k in cutlass.range_constexpr(steps):
    acc = acc + x[(tidx + k) % 128]
  y[tidx] = acc


@cute.jit
def unrolled(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor, *, steps: cutlass.Constexpr = 4):
  """Slow to compile by construction for a large ``steps``: the trace unrolls the loop, a load and an add each."""
  _unrolled_kernel(x, y, steps).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


@cute.jit
def sleeps_in_its_trace(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor):
  """Each trace of it sleeps for JMF_TEST_TRACE_SLEEP_S seconds; it reads the environment, so the key reader
  refuses it and its key is its IR's: a trace for the key, then one for the compile."""
  time.sleep(float(os.environ["JMF_TEST_TRACE_SLEEP_S"]))
  _unrolled_kernel(x, y, 4).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


@cute.jit
def ends_the_process(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor):
  """Its trace ends the process, as a crash of the DSL's native code would."""
  os._exit(3)
