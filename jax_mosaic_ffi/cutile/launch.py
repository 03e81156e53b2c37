"""Launching a cuTile kernel with `mosaic_kernel`: compiled per specialization, launched as a tile kernel.

    kernel = jmf.cutile_kernel(vadd, TILE=1024)        # @ct.kernel vadd(a, b, c, TILE: ct.Constant[int])
    add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), grid=lambda x, y: jmf.cdiv(x.size, 1024))
    z = jax.jit(add)(x, y)

The call's operands fill the kernel's non-constant parameters in order (inputs, outputs not aliased to an input,
then scalars), or as ``param_order`` names them. Each traced call builds the `Plan` of its avals and scalars
(compiler/plan.py), gets the cubins from the compile cache (compiler/compile.py) and binds the `mosaic_kernel`
primitive with the cubin's parameters in cuTile's calling convention: per array its buffer, then its extents and
row-major strides as scalars of the width the kernel indexes with (launch values: under `jax.export` symbolic ones
are computed by the runtime), per scalar its value. A tile kernel is launched with a block of one and no dynamic
shared memory (the driver runs each tile block with the threads and shared memory its cubin declares:
compiler/cubin.py), with clusters as ``ct.kernel(num_ctas=)`` compiled them. vmap launches the kernel once per
batch element in one custom call, or, for a kernel whose arrays take a leading batch axis (``batch_bid=``), once
over the whole batch. The options every front end takes work as for every kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.call import batch_axis
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call import primitive
from jax_mosaic_ffi.call.launch_options import CheckedLaunch, LaunchOptions
from jax_mosaic_ffi.call.launch_programs import DimScalar, dim_scalar
from jax_mosaic_ffi.call.operands import Kind, Operand
from jax_mosaic_ffi.cutile.compiler import keys as cutile_keys
from jax_mosaic_ffi.cutile.compiler.compile import compile_plan
from jax_mosaic_ffi.cutile.compiler.plan import SCALAR_TYPES, ArrayArg, ConstantArg, Plan, ScalarArg, TupleArg
from jax_mosaic_ffi.cutile.compiler.signature import ARRAY_TYPES
from jax_mosaic_ffi.cutile.kernel import CutileFunction, missing_constant
from jax_mosaic_ffi.cutile.launch_options import CutileOptions
from jax_mosaic_ffi.toolchain.kernel import parse_targets


def _order(param_order, made: str):
  """``param_order`` read once: each name as its operand, a tuple of names (a tuple parameter) as a tuple."""
  if param_order is None:
    return None
  if isinstance(param_order, str) or not isinstance(param_order, (tuple, list)):
    raise LaunchError(f"{made}: param_order must be a sequence of names like ('in0', 'out0', 'scalar0') (a tuple of "
                      f"names for a tuple parameter), got {param_order!r}")

  def read(entry):
    if isinstance(entry, (tuple, list)):
      return tuple(read(e) for e in entry)
    ref = entry if isinstance(entry, Operand) else operands.parse(entry)
    if ref is None or ref.kind is Kind.SCRATCH:
      raise LaunchError(f"{made}: param_order entry {entry!r} names nothing; use in0.., out0.., scalar0.. (a tuple "
                        "of them for a tuple parameter)")
    return ref
  return tuple(read(e) for e in param_order)


def _constants(target: CutileFunction, made: str) -> dict[str, Any]:
  given = dict(target.constants)
  out = {}
  for p in target.parameters:
    if not p.constant:
      continue
    if p.name in given:
      out[p.name] = given[p.name]
    elif not missing_constant(p):
      out[p.name] = p.default
    else:
      raise LaunchError(f"{made}: no value for the ct.Constant parameter {p.name!r}; pass "
                        f"jmf.cutile_kernel(kernel, {p.name}=...) or a config that sets it")
  return out


class _Builder:
  """One traced call's plan and the cubin's parameters as the launch passes them."""

  def __init__(self, in_avals, out_avals, values, aliases, where: str):
    self.in_avals, self.out_avals, self.values, self.where = in_avals, out_avals, list(values), where
    self.aliased = {o: i for i, o in aliases}  # output -> the input it is
    self.uses: dict[int, int] = {}  # buffer -> how many parameters it fills

  def buffer(self, ref: Operand) -> int:
    n_in, n_out = len(self.in_avals), len(self.out_avals)
    if ref.kind is Kind.IN and ref.index < n_in:
      return ref.index
    if ref.kind is Kind.OUT and ref.index < n_out:
      return self.aliased.get(ref.index, n_in + ref.index)
    raise LaunchError(f"{self.where}: param_order entry {ref} names nothing: the call has {n_in} inputs and "
                      f"{n_out} outputs")

  def arg(self, param, ref):
    if param.is_tuple:
      if not isinstance(ref, tuple):
        raise LaunchError(f"{self.where}: parameter {param.name!r} is a tuple; name its items as a tuple in "
                          "param_order, e.g. param_order=(('in0', 'in1'), 'out0')")
      if param.items is not None and len(param.items) != len(ref):
        raise LaunchError(f"{self.where}: parameter {param.name!r} is a tuple of {len(param.items)}, given "
                          f"{len(ref)}")
      return TupleArg(tuple(self.arg(param.item(k), r) for k, r in enumerate(ref)))
    if isinstance(ref, tuple):
      raise LaunchError(f"{self.where}: parameter {param.name!r} is not a tuple, given {ref}")
    if param.constant:
      raise LaunchError(f"{self.where}: {param.name!r} is a ct.Constant inside a tuple parameter; pass the "
                        "tuple's constants as a ct.Constant tuple parameter of their own")
    if ref.kind is Kind.SCALAR:
      return self.scalar(param, ref.index)
    b = self.buffer(ref)
    self.uses[b] = self.uses.get(b, 0) + 1
    aval = (self.in_avals + self.out_avals)[b] if b < len(self.in_avals) else self.out_avals[b - len(self.in_avals)]
    dtype = jnp.dtype(aval.dtype).name
    if dtype not in ARRAY_TYPES:
      raise LaunchError(f"{self.where}: {ref} is {dtype}, which cuTile has no array type for; cuTile's: "
                        f"{', '.join(ARRAY_TYPES)}")
    return ArrayArg(b, dtype, tuple(aval.shape), param.index_bits)

  def scalar(self, param, k: int) -> ScalarArg:
    if k >= len(self.values):
      raise LaunchError(f"{self.where}: param_order names scalar{k}, but the call passes {len(self.values)} scalars")
    value = self.values[k]
    dtype = value.dtype if isinstance(value, DimScalar) else np.asarray(value).dtype
    if dtype == np.bool_:  # cuTile passes a bool as an int32, as cuda.tile.jax does
      self.values[k] = value = np.int32(bool(value))
      dtype = np.dtype(np.int32)
    if dtype.name not in SCALAR_TYPES:
      raise LaunchError(f"{self.where}: scalar{k} is {dtype.name}; cuTile's scalars are {', '.join(SCALAR_TYPES)}")
    if param.scalar_bits == 64 and dtype.name not in ("int64", "uint64"):
      raise LaunchError(f"{self.where}: parameter {param.name!r} is ct.ScalarInt64; pass scalar{k} as an np.int64")
    return ScalarArg(k, dtype.name)

  def launched(self, plan: Plan) -> tuple[list[Operand], list]:
    """(param_order, scalars) of the launch: the call's scalars first, then each array's extents and strides."""
    n_in = len(self.in_avals)
    order, values = [], list(self.values)
    arrays = {a.buffer: a for a in plan.arrays()}
    for p in plan.launched():
      if p.kind == "buffer":
        order.append(operands.input_(p.buffer) if p.buffer < n_in else operands.output(p.buffer - n_in))
        continue
      if p.kind == "scalar":
        order.append(operands.scalar(p.index))
        continue
      a = arrays[p.buffer]
      value = a.shape[p.dim] if p.kind == "extent" else a.strides()[p.dim]
      try:
        values.append(dim_scalar(value, np.int64 if p.bits == 64 else np.int32))
      except OverflowError:
        raise LaunchError(f"{self.where}: buffer {p.buffer}'s {p.kind} {value} does not fit the int32 the kernel "
                          "indexes it with; annotate the parameter ct.IndexedWithInt64") from None
      order.append(operands.scalar(len(values) - 1))
    return order, values


def launcher(target: CutileFunction, out_shape, launch: LaunchOptions, options: CutileOptions,
             meta: Mapping[str, Any] | None = None):
  """The function of arrays that compiles and launches a cuTile kernel (see module doc); ``meta``: an autotuning
  config's values."""
  if meta is not None:
    target = target.with_meta(meta)
  name = target.name
  made = f"mosaic_kernel '{name}'"
  if options.grid is None:
    raise LaunchError(f"{made}: grid= is required: the number of tile blocks (ct.bid) on each axis")
  if not isinstance(options.uses_pdl, (bool, np.bool_)):
    raise LaunchError(f"{made}: uses_pdl must be True or False, got {options.uses_pdl!r}")
  order = _order(options.param_order, made)
  if callable(launch.zero_outputs):
    launch_values.zero_outputs_option(launch.zero_outputs, made)
  shared = launch.checked(made)
  fallback = fallback_lib.create(launch.fallback, made)
  constants = _constants(target, made)
  targets = parse_targets(target.targets)
  runtime = [p for p in target.parameters if not p.constant]
  batch_bid = target.batch_bid

  def bind(args, batched: bool):
    site = source_location.current()
    where = f"mosaic_kernel '{name}' at {site}"
    in_avals = tuple(jax.typeof(a) for a in args)
    element_avals = tuple(a.update(shape=a.shape[1:]) for a in in_avals) if batched else in_avals
    shapes = launch_values.evaluate(out_shape, "out_shape", element_avals, where, follows_shapes=True)
    out_avals, single = launch_values.out_avals(shapes, where)
    values = launch_values.evaluate(options.scalars, "scalars", element_avals, where, meta=meta,
                                   follows_shapes=meta is None)
    launch_values.scalars(values, where)  # its checks and messages
    grid = list(launch_values.dims(launch_values.evaluate(options.grid, "grid", element_avals, where, meta=meta,
                                                          follows_shapes=meta is None), "grid", where, symbolic=True))
    if batched:
      if grid[batch_bid] != 1:
        raise LaunchError(f"{where}: grid axis {batch_bid} is the batch's (batch_bid={batch_bid}), so the grid "
                          f"gives 1 there; it gives {grid[batch_bid]}")
      batch = in_avals[0].shape[0]
      grid[batch_bid] = batch
      out_avals = tuple(jax.core.ShapedArray((batch, *a.shape), a.dtype) for a in out_avals)
      shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals)
      shapes = shapes[0] if single else shapes
    aliases = shared.aliases
    unaliased = [o for o in range(len(out_avals)) if o not in {o for _, o in aliases}]
    entries = order if order is not None else (
        tuple(operands.input_(i) for i in range(len(in_avals))) + tuple(operands.output(o) for o in unaliased)
        + tuple(operands.scalar(k) for k in range(len(values))))
    if len(entries) != len(runtime):
      raise LaunchError(
          f"{where}: the kernel takes {len(runtime)} parameters that are not ct.Constant "
          f"({', '.join(p.name for p in runtime) or 'none'}), but the call passes {len(entries)} "
          f"({', '.join(map(str, entries)) or 'none'}): inputs, outputs not aliased to an input, then scalars, or "
          "param_order")
    builder = _Builder(in_avals, out_avals, values, aliases, where)
    args_by_param = iter(builder.arg(p, e) for p, e in zip(runtime, entries))
    plan_args = []
    for p in target.parameters:
      if p.constant:
        plan_args.append(ConstantArg(constants[p.name], cutile_keys.exact_key(constants[p.name], p.name).hex()))
      else:
        plan_args.append(next(args_by_param))
    # A buffer that fills two parameters is one memory under two names: cuTile must not assume they differ.
    plan = Plan(tuple(_alias(a, builder.uses) for a in plan_args))
    for a in plan.arrays():
      if (wide := a.too_wide()) is not None:
        raise LaunchError(f"{where}: buffer {a.buffer}'s {wide} does not fit the int32 the kernel indexes it with; "
                          "annotate the parameter ct.IndexedWithInt64")
    kernel = compile_plan(target.compiled(), plan, name=name, targets=targets, where=site)
    param_order, scalars = builder.launched(plan)
    record = CheckedLaunch(kernel=kernel, out_shape=shapes, grid=tuple(grid), block=(1, 1, 1), cluster=(1, 1, 1),
                           smem_bytes=0, uses_pdl=bool(options.uses_pdl), scalars=tuple(scalars), aliases=aliases,
                           param_order=tuple(param_order), collective=None, zero_outputs=shared.zero_outputs,
                           has_side_effect=shared.has_side_effect, cost_estimate=shared.cost_estimate)
    element_fallback = fallback.vmapped((0,) * len(args)) if batched and fallback is not None else fallback
    return primitive.kernel_call(record, element_fallback)(*args)

  if batch_bid is None:
    return lambda *args: bind(args, False)

  return batch_axis.leading_axis_call(bind, f"{made}: a kernel with batch_bid= needs at least one input array")


def _alias(arg, uses: dict[int, int]):
  if isinstance(arg, TupleArg):
    return TupleArg(tuple(_alias(a, uses) for a in arg.items))
  if isinstance(arg, ArrayArg) and uses.get(arg.buffer, 0) > 1:
    return dataclasses.replace(arg, alias_group=f"buffer{arg.buffer}")
  return arg

