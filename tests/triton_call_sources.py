"""Triton kernels for tests/test_triton_call.py, written as jax-triton users write them (outputs after inputs,
sizes as arguments). @triton.jit functions must live in a file."""

import triton
import triton.language as tl


@triton.jit
def add(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def add_defaults(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr = 64):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def scaled_add_late_constexpr(x_ptr, BLOCK: tl.constexpr, y_ptr, scale, n, out_ptr):
  """A constexpr between operands, a scalar before the size."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + scale * tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def plus_scalar(x_ptr, s, out_ptr):
  """out[0] = x[0] + s, for the scalar types a call's Python numbers get."""
  tl.store(out_ptr, tl.load(x_ptr) + s)


@triton.jit
def increment(x_ptr, n, BLOCK: tl.constexpr):
  """x += 1 in place."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


@triton.jit
def accumulate(x_ptr, acc_ptr, n, out_ptr, BLOCK: tl.constexpr):
  """out = 2 x + acc, then acc += x in place."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  acc = tl.load(acc_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, 2 * x + acc, mask=mask)
  tl.store(acc_ptr + offsets, acc + x, mask=mask)


@triton.jit
def sum_tuple(x_ptr, pair, n, out_ptr, BLOCK: tl.constexpr):
  """out = x + pair[0] + pair[1][0] * pair[1][1]: a tuple parameter holding a nested tuple and a scalar."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  inner = pair[1]
  total = tl.load(x_ptr + offsets, mask=mask) + tl.load(pair[0] + offsets, mask=mask)
  total += tl.load(inner[0] + offsets, mask=mask).to(tl.float32) * inner[1]
  tl.store(out_ptr + offsets, total, mask=mask)


@triton.jit
def two_outputs(x_ptr, n, pos_ptr, neg_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(pos_ptr + offsets, x, mask=mask)
  tl.store(neg_ptr + offsets, -x, mask=mask)


@triton.jit
def row_sums(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
  """out[row] += a block of the row, with atomics: the output must start at zero."""
  row = tl.program_id(0)
  offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
  values = tl.load(x_ptr + row * cols + offsets, mask=offsets < cols, other=0.0)
  tl.atomic_add(out_ptr + row, tl.sum(values, axis=0))


@triton.jit
def add_into(x_ptr, acc_ptr, n, BLOCK: tl.constexpr):
  """acc += x in place (acc aliased to the output)."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(acc_ptr + offsets, tl.load(acc_ptr + offsets, mask=mask) + tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def unary(x_ptr, out_ptr, n, BLOCK: tl.constexpr, OP: tl.constexpr):
  """out = OP(x): a @triton.jit function as a constexpr."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, OP(tl.load(x_ptr + offsets, mask=mask)), mask=mask)


@triton.jit
def negate(x):
  return -x


@triton.jit
def square(x):
  return x * x


@triton.jit
def copy_tile(in_desc, out_ptr, M: tl.constexpr, N: tl.constexpr):
  """A host tensor descriptor's one block, stored row-major."""
  block = in_desc.load([0, 0])
  offsets = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
  tl.store(out_ptr + offsets, block)


@triton.jit
def copy_through_device_descriptors(in_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr):
  """Device-side descriptors: Triton asks for global scratch."""
  src = tl.make_tensor_descriptor(in_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N])
  dst = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N])
  dst.store([0, 0], src.load([0, 0]))


@triton.jit
def copy4(x_ptr, out_ptr):
  offsets = tl.program_id(0) * 4 + tl.arange(0, 4)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


# The decorated kernels wrap the undecorated ones, as a user decorates a kernel of their own in place.
add_tuned = triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2),
                                     triton.Config({"BLOCK": 128}, num_warps=4),
                                     triton.Config({"BLOCK": 256}, num_warps=4)], key=["n"])(add)


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def add_even(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  if EVEN:
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))
  else:
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


add_with_pre_hook = triton.autotune(configs=[triton.Config({"BLOCK": 64}, pre_hook=lambda args: None)], key=["n"])(add)


row_sums_tuned = triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
                                 key=["cols"])(row_sums)


@triton.jit
def increment_size_first(n, x_ptr, BLOCK: tl.constexpr):
  """x += 1 in place, the size before the buffer: operands are counted with the scalar."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)
