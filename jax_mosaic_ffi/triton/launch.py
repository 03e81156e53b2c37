"""Launching a Triton kernel with `mosaic_kernel`: its launch options from Triton's metadata.

A Triton kernel needs no block or shared memory: they come from Triton's
metadata (block = 32 x num_warps, shared memory, a cluster of num_ctas; PDL
when the kernel waits with gdc_wait). The entry Triton emits takes the
function's non-constexpr parameters, in order, less those Triton's launcher
specialized to constexprs (integers equal to 1), then scratch pointers (global
and profile in Triton 3.6 to 3.9; their number is read from the PTX): null
when Triton needs none, else an extra output that XLA allocates.

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr): ...

    kernel = jmf.triton_kernel(add, constexprs={"BLOCK": 1024})
    f = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                          scalars=lambda meta, x, y: (np.int32(x.size),))

The parameters map to the call as in `mosaic_kernel`: inputs, outputs, then
scalars (or ``param_order``). A `TritonFunction` (no ``signature=``) is
compiled here per distinct signature, read from the call's avals and scalars.
The launch this resolves (grid, block, shared memory, cluster, the scalars as
passed) goes to the call layer as a `CheckedLaunch` in checked form: the
user's options are checked once, when the launcher is made, and Triton's
metadata needs no checking.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call import primitive
from jax_mosaic_ffi.call.launch_options import CheckedLaunch, LaunchOptions
from jax_mosaic_ffi.call.operands import Kind, Operand
from jax_mosaic_ffi.triton import tensor_descriptor
from jax_mosaic_ffi.triton.compiler.compile import TritonKernel
from jax_mosaic_ffi.triton.kernel import TritonFunction, runtime_params
from jax_mosaic_ffi.triton.launch_options import TritonLaunchOptions
from jax_mosaic_ffi.triton.compiler.specialize import XLA_BUFFER_ALIGN, flat_types


_DTYPES = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "i1",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5",
}


def triton_type(dtype) -> str:
  name = jnp.dtype(dtype).name
  if name not in _DTYPES:
    raise LaunchError(f"dtype {name} has no Triton type here; supported: {', '.join(_DTYPES)}")
  return _DTYPES[name]


def typed_order(param_order, made: str) -> tuple | None:
  """``param_order`` read once: each name as the operand it refers to (a tuple of them for a Triton tuple
  parameter), `TensorDescriptor` declarations as they are."""
  if param_order is None:
    return None
  if isinstance(param_order, str) or not isinstance(param_order, Sequence):
    raise LaunchError(f"{made}: param_order must be a sequence of names like ('in0', 'out0', 'scalar0'), tuples of "
                      f"them (Triton tuple parameters) or jmf.TensorDescriptor(...) declarations, got {param_order!r}")

  def typed(entry):
    if isinstance(entry, (tuple, list)):
      return tuple(typed(e) for e in entry)
    if isinstance(entry, (tensor_descriptor.TensorDescriptor, Operand)):
      return entry
    ref = operands.parse(entry)
    if ref is None or ref.kind is Kind.SCRATCH:
      raise LaunchError(f"{made}: param_order entry {entry!r} names nothing; use in0.., out0.., scalar0.. (a tuple "
                        "of them for a Triton tuple parameter)")
    return ref
  return tuple(typed(entry) for entry in param_order)


def launcher(target: TritonKernel | TritonFunction, out_shape, launch: LaunchOptions, options: TritonLaunchOptions):
  """The function of arrays that launches a Triton kernel (see module doc); sharding is the caller's."""
  made = f"{source_location.api()} '{target.name}'"
  if options.uses_pdl not in (None, True, False):
    raise LaunchError(f"{made}: uses_pdl must be True, False or None (PDL when the kernel waits "
                      f"with tl.extra.cuda.gdc_wait()), got {options.uses_pdl!r}")
  param_order = typed_order(options.param_order, made)
  shared = launch.checked(made)
  fallback = fallback_lib.create(launch.fallback, made)

  def call(*args):
    where = who(target, source_location.current())
    in_avals = tuple(jax.typeof(a) for a in args)
    meta = target.meta
    out_avals, single = launch_values.out_avals(
        launch_values.evaluate(out_shape, "out_shape", in_avals, where, follows_shapes=True), where)
    values = launch_values.evaluate(options.scalars, "scalars", in_avals, where, meta=meta)
    launch_values.scalars(values, where)  # its checks and messages, before the values are typed for Triton
    order = param_order if param_order is not None else operands.default_order(len(in_avals), len(out_avals),
                                                                                len(values))
    descriptors = [tensor_descriptor.bind(e, lambda v, what: launch_values.evaluate(v, what, in_avals, where,
                                                                                    meta=meta),
                                          in_avals, out_avals, where)
                   for e in order if isinstance(e, tensor_descriptor.TensorDescriptor)]
    kernel = _specialize(target, order, in_avals, out_avals, values, where, descriptors)
    record = _resolved(kernel, options, shared, order, values, descriptors, in_avals, out_avals, meta, where)
    scratch_avals = record.out_shape[len(out_avals):]
    inner = primitive.kernel_call(record, _with_triton_scratch(fallback, in_avals, out_avals, scratch_avals, single,
                                                               where))
    results = tuple(inner(*args))[:len(out_avals)]
    return results[0] if single else results

  return call


def _resolved(kernel: TritonKernel, options: TritonLaunchOptions, shared, order, values, descriptors, in_avals,
              out_avals, meta, where: str) -> CheckedLaunch:
  """The launch record of a compiled kernel, from Triton's metadata and the user's checked options, in checked
  form: handed on, not checked again. Triton's scratch pointers are extra outputs (null when it needs none);
  ``meta``: what the grid and zero_outputs callables get."""
  info = kernel.info
  if options.uses_pdl and not kernel.pdl_safe:
    raise LaunchError(
        f"{where}: uses_pdl=True, but the kernel does not wait for the previous kernel: with programmatic "
        "dependent launch it would read inputs that kernel may still be writing. Call "
        "tl.extra.cuda.gdc_wait() in it before its first load (it then launches with PDL by default, on "
        "sm_90 and newer), or leave uses_pdl out")
  # As our own compiled kernels: PDL when the kernel waits (griddepcontrol.wait), unless uses_pdl=False.
  pdl = kernel.pdl_safe if options.uses_pdl is None else bool(options.uses_pdl)
  dims = launch_values.dims(launch_values.evaluate(options.grid, "grid", in_avals, where, meta=meta), "grid", where)
  outs = list(out_avals)
  passed, passed_values = _passed(order, values, info.dropped)
  names, scalar_list = tensor_descriptor.expand(passed, passed_values, descriptors, info, where)
  programs = math.prod(dims) * info.num_ctas
  for k, (size, align) in enumerate(info.scratch):
    if size == 0:
      scalar_list.append(np.uint64(0))
      names.append(operands.scalar(len(scalar_list) - 1))
      continue
    if align > XLA_BUFFER_ALIGN:
      raise LaunchError(f"{where}: Triton asks for {('global', 'profile')[k]} scratch aligned to {align} bytes, "
                        f"more than the {XLA_BUFFER_ALIGN} XLA gives its buffers")
    outs.append(jax.ShapeDtypeStruct((programs * size,), jnp.uint8))
    names.append(operands.output(len(outs) - 1))
  chosen = shared.zero_outputs
  if callable(chosen):  # a callable of the compiled kernel's meta (triton_call's zeroed_outputs), per call
    chosen = launch_values.zero_outputs_option(
        launch_values.evaluate(chosen, "zero_outputs", in_avals, where, meta=meta), where)
  return CheckedLaunch(
      kernel=kernel, out_shape=tuple(outs), grid=(dims[0] * info.num_ctas, dims[1], dims[2]),
      block=(32 * info.num_warps, 1, 1), cluster=(info.num_ctas, 1, 1), smem_bytes=info.shared, uses_pdl=pdl,
      scalars=launch_values.scalars(scalar_list, where), aliases=shared.aliases, param_order=tuple(names),
      collective=None, zero_outputs=_user_outputs(chosen, len(out_avals), shared.aliases),
      has_side_effect=shared.has_side_effect, cost_estimate=shared.cost_estimate)


def _with_triton_scratch(fallback, in_avals, out_avals, scratch_avals, single: bool, where: str):
  """The user's fallback, checked against the call's own outputs, as the primitive runs it: returning a tuple
  of those outputs and zeros for Triton's scratch outputs, which the primitive has and the user's function lacks."""
  if fallback is None:
    return None
  fallback_lib.check(fallback, in_avals, out_avals, single, where)

  def fn(*args):
    out = fallback.fn(*args)
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return out + tuple(jnp.zeros(a.shape, a.dtype) for a in scratch_avals)

  return fallback_lib.Fallback(fn, compared=len(out_avals))


def _passed(order, values, dropped):
  """The parameters the compiled kernel takes, as (param_order, scalars): Triton compiled the integers
  its launcher specializes to constexprs (those equal to 1) into the kernel, so they are not passed."""
  names, scalar_list = [], []
  for k, entry in enumerate(flat_types(order)):
    if k in dropped:
      continue
    if isinstance(entry, Operand) and entry.kind is Kind.SCALAR:
      scalar_list.append(values[entry.index])
      entry = operands.scalar(len(scalar_list) - 1)
    names.append(entry)
  return names, scalar_list


def _user_outputs(zero_outputs, n_out: int, aliases):
  """``zero_outputs=True`` means the call's own unaliased outputs, not Triton's scratch."""
  if zero_outputs is True:
    return tuple(o for o in range(n_out) if o not in {out for _, out in aliases})
  return zero_outputs


def _specialize(target, order, in_avals, out_avals, values, where, descriptors=()) -> TritonKernel:
  """The kernel compiled for the Triton types of ``order``'s entries; a tuple of entries is a Triton tuple
  parameter (its type a tuple), and scalars are known by their index among the leaves (flat_types)."""
  n_in, n_out = len(in_avals), len(out_avals)
  scalar_values = {}
  descriptor_types = iter(d.signature_type for d in descriptors)
  leaf = itertools.count()

  def typed(entry, nested: bool):
    if isinstance(entry, (tuple, list)):
      return tuple(typed(e, True) for e in entry)
    k = next(leaf)
    if isinstance(entry, tensor_descriptor.TensorDescriptor):
      if nested:
        raise LaunchError(f"{where}: param_order entry {entry} is inside a tuple; a Triton kernel takes host "
                          "tensor descriptors as parameters of their own")
      return next(descriptor_types)
    index = entry.index
    if entry.kind is Kind.IN and index < n_in:
      return "*" + triton_type(in_avals[index].dtype)
    if entry.kind is Kind.OUT and index < n_out:
      return "*" + triton_type(out_avals[index].dtype)
    if entry.kind is Kind.SCALAR and index < len(values):
      scalar_values[k] = values[index]
      return triton_type(np.asarray(values[index]).dtype)
    raise LaunchError(f"{where}: param_order entry {str(entry)!r} names nothing; use in0.., out0.., scalar0.. (a "
                      "tuple of them for a Triton tuple parameter)")

  types = [typed(entry, False) for entry in order]
  if isinstance(target, TritonFunction):
    for descriptor in descriptors:  # what the kernel's language checks of them on the host (a Gluon layout)
      target.check_descriptor(descriptor, where)
  if isinstance(target, TritonKernel):
    if tuple(types) != target.info.signature:
      raise LaunchError(f"{where}: the call passes parameters of Triton types {types}, but the kernel was "
                        f"compiled for {list(target.info.signature)}; leave signature= out to have it read "
                        "from the call")
    return target
  params = runtime_params(target.fn)
  if len(types) != len(params):
    raise LaunchError(
        f"{where}: the Triton function takes {len(params)} non-constexpr parameters ({', '.join(params)}) but the "
        f"call passes {len(types)} ({', '.join(map(str, order))}): inputs, outputs, then scalars, or param_order")
  return target.specialize(types, scalar_values)
