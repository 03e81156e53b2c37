"""Triton kernels for the tests (@triton.jit functions must live in a file); the ones the benchmarks run too come
from the kernel corpus (benchmarks/kernels/), written once."""

import os
import time  # noqa: F401  (_slept reaches it through globals())

import triton
import triton.language as tl

import benchmarks_package

# C = A @ B in the style of Triton's matmul tutorial: every operand by its strides, program ids grouped along M.
grouped_matmul = benchmarks_package.kernels("triton_user").grouped_matmul


@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
  pid = tl.program_id(0)
  offsets = pid * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, a * x + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def add_entry_of(x_ptr, out_ptr, n, TABLE: tl.constexpr, BLOCK: tl.constexpr):
  """out = x + TABLE[1000], for a table given as a constexpr (a numpy array): the entry is compiled in."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + TABLE[1000], mask=mask)


# The same under @triton.autotune: each config's meta holds the table too.
add_entry_of_tuned = triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})],
                                     key=["n"])(add_entry_of)


@triton.jit
def scale_in_place(x_ptr, n, factor, BLOCK: tl.constexpr):
  """x *= factor, for input_output_aliases (one pointer: param_order names out0 only)."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


@triton.jit
def row_sums_atomic(x_ptr, out_ptr, rows, cols, BLOCK: tl.constexpr):
  """Each program adds one block of a row into out[row] with atomics: needs a zeroed output."""
  row = tl.program_id(0)
  start = tl.program_id(1) * BLOCK
  offsets = start + tl.arange(0, BLOCK)
  values = tl.load(x_ptr + row * cols + offsets, mask=offsets < cols, other=0.0)
  tl.atomic_add(out_ptr + row, tl.sum(values, axis=0))


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
  """C = A @ B, row-major, any M, N, K."""
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  rm = pid_m * BM + tl.arange(0, BM)
  rn = pid_n * BN + tl.arange(0, BN)
  rk = tl.arange(0, BK)
  acc = tl.zeros((BM, BN), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BK)):
    kk = k * BK + rk
    a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
    b = tl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
    acc = tl.dot(a, b, acc)
  mask = (rm[:, None] < M) & (rn[None, :] < N)
  tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def descriptor_copy(x_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
  """A copy through device-side tensor descriptors (TMA): Triton asks for global scratch."""
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  src = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
  dst = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
  dst.store([pid_m * BM, pid_n * BN], src.load([pid_m * BM, pid_n * BN]))


@triton.jit
def copy_2d(x_ptr, out_ptr, rows, cols, stride_xr, stride_xc, BR: tl.constexpr, BC: tl.constexpr):
  """out[r, c] = x[r * stride_xr + c * stride_xc]: a strided view (transposed, padded) copied out row-major."""
  r = tl.program_id(0) * BR + tl.arange(0, BR)
  c = tl.program_id(1) * BC + tl.arange(0, BC)
  mask = (r[:, None] < rows) & (c[None, :] < cols)
  x = tl.load(x_ptr + r[:, None] * stride_xr + c[None, :] * stride_xc, mask=mask)
  tl.store(out_ptr + r[:, None] * cols + c[None, :], x, mask=mask)


@triton.jit(do_not_specialize=["stride_xr", "stride_xc"])
def copy_2d_unspecialized(x_ptr, out_ptr, rows, cols, stride_xr, stride_xc, BR: tl.constexpr, BC: tl.constexpr):
  """copy_2d with its strides never specialized (Triton's do_not_specialize)."""
  r = tl.program_id(0) * BR + tl.arange(0, BR)
  c = tl.program_id(1) * BC + tl.arange(0, BC)
  mask = (r[:, None] < rows) & (c[None, :] < cols)
  x = tl.load(x_ptr + r[:, None] * stride_xr + c[None, :] * stride_xc, mask=mask)
  tl.store(out_ptr + r[:, None] * cols + c[None, :], x, mask=mask)


@triton.jit(do_not_specialize_on_alignment=["x_ptr"])
def copy_2d_unaligned(x_ptr, out_ptr, rows, cols, stride_xr, stride_xc, BR: tl.constexpr, BC: tl.constexpr):
  """copy_2d without the input pointer's alignment (Triton's do_not_specialize_on_alignment)."""
  r = tl.program_id(0) * BR + tl.arange(0, BR)
  c = tl.program_id(1) * BC + tl.arange(0, BC)
  mask = (r[:, None] < rows) & (c[None, :] < cols)
  x = tl.load(x_ptr + r[:, None] * stride_xr + c[None, :] * stride_xc, mask=mask)
  tl.store(out_ptr + r[:, None] * cols + c[None, :], x, mask=mask)


@triton.jit
def add_after_wait(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
  """add, safe for programmatic dependent launch: it waits for the previous kernel before its first load, then
  lets the next kernel launch."""
  tl.extra.cuda.gdc_wait()
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.extra.cuda.gdc_launch_dependents()
  tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def bogus_asm(x_ptr, y_ptr, BLOCK: tl.constexpr):
  """Inline PTX that ptxas refuses: a compile failure inside Triton's own backend."""
  offsets = tl.arange(0, BLOCK)
  y = tl.inline_asm_elementwise("bogus.instr.f32 $0, $1;", "=r,r", [tl.load(x_ptr + offsets)], dtype=tl.float32,
                                is_pure=True, pack=1)
  tl.store(y_ptr + offsets, y)


@triton.jit
def fill_warps(out_ptr, n, num_warps: tl.constexpr, BLOCK: tl.constexpr):
  """out[i] = the num_warps it was compiled with: a parameter named like the launch option takes its value, as
  Triton's launcher binds `kernel[grid](..., num_warps=8)` to both (Gluon's tutorials build layouts of it)."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.full((BLOCK,), num_warps, tl.int32), mask=offsets < n)


@triton.jit
def unrolled_sum(x_ptr, out_ptr, STEPS: tl.constexpr):
  """Slow to compile by construction for a large STEPS: Triton's frontend unrolls the loop, a load and an add each."""
  acc = tl.load(x_ptr)
  for i in tl.static_range(STEPS):
    acc += tl.load(x_ptr + i)
  tl.store(out_ptr, acc)


@triton.jit
def steps_from_memory(x_ptr, steps_ptr, out_ptr, n, BLOCK: tl.constexpr):
  """out = x iterated ``steps`` times through acc * 0.5 + x (a dependent chain the compiler cannot fold): its time
  grows with the int32 read from memory, as a decode kernel's with its lengths."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
  acc = tl.zeros([BLOCK], dtype=tl.float32)
  for _ in range(0, tl.load(steps_ptr)):
    acc = acc * 0.5 + x
  tl.store(out_ptr + offsets, acc, mask=mask)


@triton.constexpr_function
def _slept():
  globals()["time"].sleep(float(os.environ["JMF_TEST_TRACE_SLEEP_S"]))  # (Triton refuses a function it names)
  return 1.0


@triton.jit
def sleeps_in_its_frontend(x_ptr, out_ptr):
  """Each frontend run of it sleeps for JMF_TEST_TRACE_SLEEP_S seconds; it reads the environment, so the key reader
  refuses it and its key is its TTIR's: a frontend run for the key, then the compile's."""
  tl.store(out_ptr, tl.load(x_ptr) + _slept())
