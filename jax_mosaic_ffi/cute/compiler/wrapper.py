"""The host function we compile around a user's launcher: raw arguments in, `cute.Tensor`s out.

``cute.compile(host_entry, stream, *placeholders, launcher=fn, plan=plan)`` compiles a host function taking,
after the stream, per buffer a typed global-memory pointer and (for a dynamic tensor) its dimensions as
int64 (plan.py). It builds each tensor as cutlass_call's TensorSpec describes it (a compact layout in the
spec's stride order, shapes as int32 and strides as int64 with their divisibility assumed, the spec's mode
selected, or a static layout), drops outputs that alias inputs, restores the pytrees and calls the launcher
``(stream, *inputs, *outputs, **constexprs)``. Only the DSL's public API is used, so the arguments' layout
(one 8-byte slot each) is ours, not an internal of ``cutlass.jax`` that changes between releases.

Imported only when the DSL is installed (cute/compiler/dsl.py imports it on first use).
"""

from __future__ import annotations

import math

import jax

from jax_mosaic_ffi.cute.compiler import dsl

cutlass, cute, cuda = dsl.modules()


def _assume(value, divby: int):
  return value if divby <= 1 else cute.assume(value, divby=divby)


def _dynamic_layout(dims, t):
  """The compact layout of ``t`` over run-time dimensions ``dims`` (int64 values), as cutlass_call builds it."""
  divs = t.dim_divisibility()
  by_order = sorted(zip(dims, t.order), key=lambda pair: pair[1])
  strides = [1]
  if t.rank > 1:
    strides.append(by_order[0][0])
  for i in range(t.rank - 2):
    strides.append(by_order[i + 1][0] * strides[-1])
  ordered = [strides[t.order[i]] for i in range(t.rank)]
  # A compact stride is the product of the dimensions of lower stride order, so it inherits their divisors.
  stride_divs = [math.prod(divs[j] for j in range(t.rank) if t.order[j] < t.order[i]) for i in range(t.rank)]
  ordered = [_assume(s, d) for s, d in zip(ordered, stride_divs)]
  shape = [_assume(cutlass.Int32(d), div) for d, div in zip(dims, divs)]
  return cute.make_layout(tuple(shape), stride=tuple(ordered))


def tensors(args, plan):
  """The plan's tensors, built from the host function's arguments."""
  out, k = [], 0
  for t in plan.tensors:
    pointer = args[k]
    k += 1
    if t.static:
      layout = cute.make_ordered_layout(tuple(int(d) for d in t.shape), order=t.order)
    else:
      layout = _dynamic_layout(args[k:k + t.rank], t)
      k += t.rank
    if t.mode != tuple(range(t.rank)):
      layout = cute.select(layout, list(t.mode))
    out.append(cute.make_tensor(pointer, layout))
  return out


def call_launcher(stream, args, launcher, plan):
  built = tensors(args, plan)
  present = iter(built[:plan.num_inputs])
  inputs = [next(present) if p else None for p in plan.input_present]
  outputs = [o for k, o in enumerate(built[plan.num_inputs:]) if k not in plan.aliased_outputs]
  ins = jax.tree_util.tree_unflatten(plan.input_tree, inputs)
  outs = jax.tree_util.tree_unflatten(plan.output_tree, outputs)
  launcher(stream, *ins, *outs, **dict(plan.constexprs))


@cute.jit
def host_entry(stream: cuda.CUstream, *args, launcher: cutlass.Constexpr, plan: cutlass.Constexpr):
  """The compiled host function (the work is in `call_launcher`, plain Python run while the DSL traces)."""
  call_launcher(stream, args, launcher, plan)


def placeholders(plan):
  """The example arguments `cute.compile` takes for the plan's host-function arguments."""
  values = []
  for t in plan.tensors:
    values.append(cute.runtime.make_ptr(dsl.cutlass_dtype(t.dtype), 0, cute.AddressSpace.gmem, assumed_align=t.align))
    if not t.static:
      values += [cutlass.Int64(0)] * t.rank
  return values
