"""Launching a CUDA C++, PTX or cubin kernel: its options (`CudaOptions`) checked once into the launch record.

`checked` checks the options given to `mosaic_kernel` once, when the wrapper is made (types, names, aliases, a
kernel that calls NVSHMEM), into the `CheckedLaunch` (call/launch_options.py) that evaluates the callables among
them per trace; `launcher` is this front end's part of `mosaic_kernel`: the call of arrays, one
`mosaic_kernel_p` per trace.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call import primitive
from jax_mosaic_ffi.call.collective import Collective
from jax_mosaic_ffi.call.launch_options import CheckedLaunch, LaunchOptions
from jax_mosaic_ffi.call.tensor_map import TensorMap
from jax_mosaic_ffi.cuda.launch_options import CudaOptions
from jax_mosaic_ffi.toolchain.kernel import Kernel
from jax_mosaic_ffi.transforms import sharding as sharding_lib


def launcher(kernel: Kernel, out_shape, launch: LaunchOptions, options: CudaOptions,
             meta: Mapping[str, Any] | None = None) -> Callable[..., Any]:
  """The call of one CUDA kernel (the sharding is `mosaic_kernel`'s, applied around it); ``meta``: an
  autotuning config's values, which the launch's callables get first."""
  where = who(kernel, source_location.current())
  if options.grid is None:
    raise LaunchError(f"{where}: grid= is required")
  if options.block is None:
    raise LaunchError(f"{where}: block (threads per block) is required")
  record = checked(kernel, out_shape, launch, options, where, meta)
  if launch.sharding is not None:
    sharding_lib.check_per_shard(record, where)
  return primitive.kernel_call(record, fallback_lib.create(launch.fallback, where))


def checked(kernel: Kernel, out_shape, launch: LaunchOptions, options: CudaOptions, where: str,
            meta: Mapping[str, Any] | None = None) -> CheckedLaunch:
  """``options`` (and the shared ``launch``) checked for ``kernel``: the launch record (its fallback and
  sharding are the caller's); ``meta``: a config's values, which the callables among grid, block, smem_bytes and
  scalars get first."""
  grid, block, cluster, smem_bytes, scalars = (options.grid, options.block, options.cluster, options.smem_bytes,
                                               options.scalars)
  uses_pdl, collective = options.uses_pdl, options.collective
  batch_grid_axis, scratch_bytes = options.batch_grid_axis, options.scratch_bytes
  if collective is not None and not isinstance(collective, Collective):
    raise TypeError(f"{where}: collective must be a jax_mosaic_ffi.Collective")
  if uses_pdl is None:
    uses_pdl = kernel.pdl_safe
  if not isinstance(uses_pdl, (bool, np.bool_)):
    raise LaunchError(f"{where}: uses_pdl must be True, False or None (PDL when the kernel is safe for it), "
                      f"got {uses_pdl!r}")
  param_order = _param_order(options.param_order, where)
  if not callable(out_shape):
    launch_values.out_avals(out_shape, where)  # checked now; kept as given, to be read per trace
  if batch_grid_axis is not None and batch_grid_axis not in ("x", "y", "z"):
    raise LaunchError(f"{where}: batch_grid_axis must be 'x', 'y', 'z' or None, got {batch_grid_axis!r}")
  if batch_grid_axis is not None and collective is not None:
    raise LaunchError(f"{where}: a collective kernel cannot take a batch on a grid axis")
  if callable(launch.zero_outputs):  # a callable of a compiled kernel's meta is another front end's
    launch_values.zero_outputs_option(launch.zero_outputs, where)
  shared = launch.checked(where)
  _check_nvshmem(kernel, collective, bool(uses_pdl), shared.aliases, where)
  fixed = lambda value, normalise: value if callable(value) else normalise(value)  # noqa: E731
  for what, value in (("block", block), ("smem_bytes", smem_bytes), ("scratch_bytes", scratch_bytes)):
    if not callable(value) and launch_values.has_symbolic_dim(value):
      raise LaunchError(launch_values.constant_refusal(what, (), where))

  def keep_scalars(values):
    checked = launch_values.scalars(values, where)
    # Scalars computed from symbolic sizes (jmf.dim_scalar) stay as given, to be encoded per trace.
    return tuple(values) if launch_values.has_symbolic_dim(values) else checked
  return CheckedLaunch(
      kernel=kernel,
      out_shape=out_shape,
      grid=fixed(grid, lambda v: launch_values.dims(v, "grid", where, symbolic=True)),
      block=fixed(block, lambda v: launch_values.dims(v, "block", where)),
      cluster=launch_values.dims(cluster, "cluster", where) if cluster is not None else (1, 1, 1),
      smem_bytes=fixed(smem_bytes, lambda v: launch_values.integer(v, "smem_bytes", where)),
      uses_pdl=bool(uses_pdl),
      scalars=fixed(scalars, keep_scalars),
      aliases=shared.aliases,
      param_order=param_order,
      collective=collective,
      batch_grid_axis=None if batch_grid_axis is None else "xyz".index(batch_grid_axis),
      scratch_bytes=fixed(scratch_bytes, lambda v: launch_values.scratch_bytes(v, where)),
      zero_scratch=launch_values.flag(options.zero_scratch, "zero_scratch", where),
      zero_outputs=shared.zero_outputs,
      has_side_effect=shared.has_side_effect,
      cost_estimate=shared.cost_estimate,
      meta=None if meta is None else dict(meta),
  )


def _param_order(param_order, where: str) -> tuple[operands.Operand | TensorMap, ...] | None:
  """``param_order`` read once: each name as the operand it refers to, `TensorMap` declarations as they are."""
  if param_order is None:
    return None
  foreign = next((e for e in param_order if getattr(e, "front_end", None)), None) \
      if isinstance(param_order, Sequence) and not isinstance(param_order, str) else None
  if foreign is not None:  # another front end's declaration (a Triton kernel's host tensor descriptor)
    raise LaunchError(f"{where}: jmf.{type(foreign).__name__} is {foreign.front_end}'s parameter; a CUDA kernel "
                      "takes a TMA descriptor as jmf.TensorMap(operand, box=...)")
  if isinstance(param_order, str) or not isinstance(param_order, Sequence) or \
      not all(isinstance(n, (str, TensorMap, operands.Operand)) for n in param_order):
    raise LaunchError(f"{where}: param_order must be a sequence of names like ('in0', 'out0', 'scalar0') "
                      f"or jmf.TensorMap(...) declarations (a CUDA kernel's TMA descriptors), got {param_order!r}")
  order = []
  for entry in param_order:
    ref = entry if isinstance(entry, (TensorMap, operands.Operand)) else operands.parse(entry)
    if ref is None:
      raise LaunchError(f"{where}: param_order entry {entry!r} names nothing; use inN, outN, scalarN (inputs, "
                        "outputs and scalars by index) or 'scratch'")
    order.append(ref)
  return tuple(order)


def _check_nvshmem(kernel: Kernel, collective: Collective | None, uses_pdl: bool, aliases, where: str) -> None:
  """A kernel that calls NVSHMEM runs only as an NVSHMEM collective, which is launched cooperatively."""
  nvshmem_call = collective is not None and collective.nvshmem
  if kernel.uses_nvshmem and not nvshmem_call:
    raise LaunchError(
        f"{where}: the kernel uses NVSHMEM, so it must run as an NVSHMEM collective: pass "
        f"collective=jmf.Collective(axis, transport='nvshmem') and call it inside shard_map"
        + (f" (it has transport={collective.transport!r})" if collective is not None else ""))
  if not nvshmem_call:
    return
  if uses_pdl:
    raise LaunchError(f"{where}: an NVSHMEM collective is launched cooperatively (nvshmemx_collective_launch), "
                      "not with programmatic dependent launch; leave uses_pdl unset")
  if aliases:
    raise LaunchError(f"{where}: input_output_aliases is not supported with transport='nvshmem' yet (symmetric "
                      "buffers are staged through NVSHMEM's heap); return a new output instead")
