"""The CUDA lowering of `mosaic_kernel`: one typed-FFI custom call (docs/contract.md).

The attributes come from `LaunchSpec.attributes`, already checked by the
runtime's validator when the primitive was bound; collective calls add
their clique attributes here, where the mesh is known, and are checked again.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax._src import core
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import native
from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.call import collective as collective_lib
from jax_mosaic_ffi.call.peers import cross_process
from jax_mosaic_ffi.call import export_stability
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call import front_end
from jax_mosaic_ffi.call import launch_spec
from jax_mosaic_ffi.call.peers import nvshmem
from jax_mosaic_ffi.call import registration
from jax_mosaic_ffi.call import runtime_libraries
from jax_mosaic_ffi.call.comparison import shadow
from jax_mosaic_ffi.call.launch_spec import LaunchSpec
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p
from jax_mosaic_ffi.toolchain.kernel import Kernel

# Debug switch: fill every (non-aliased) output with 0xFF bytes before the
# launch, so elements a kernel forgets to write read as NaN or -1.
POISON_ENV = flags.POISON_OUTPUTS


def _mesh_devices(ctx, kernel: Kernel, spec: LaunchSpec):
  where = who(kernel, spec.call_site)
  axis_context = ctx.module_context.axis_context
  mesh = getattr(axis_context, "mesh", None)
  devices = getattr(mesh, "devices", None)
  if devices is None:
    raise LaunchError(
        f"{where}: a collective kernel must run inside shard_map (or pmap) over a mesh "
        f"that has axis {spec.collective.axes[0]!r}")
  return mesh, devices


def _check_nvshmem_clique(ctx, kernel: Kernel, spec: LaunchSpec) -> None:
  """NVSHMEM's PEs are the processes of the job, in process order: the collective's clique must be them."""
  where = who(kernel, spec.call_site)
  mesh, devices = _mesh_devices(ctx, kernel, spec)
  ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(devices)
  processes = {int(d.id): int(d.process_index) for d in devices.flat}
  for group in collective_lib.cliques(ids, mesh.axis_names, spec.collective.axes):
    order = [processes[d] for d in group]
    if order != list(range(jax.process_count())):
      raise LaunchError(
          f"{where}: with transport='nvshmem' the devices along {spec.collective.axes} must be one per process, "
          f"in process order (NVSHMEM's PEs are the {jax.process_count()} processes of the job); this clique's "
          f"devices are in processes {order}. Teams over part of the job are not supported yet")


def _collective_attributes(ctx, kernel: Kernel, spec: LaunchSpec) -> dict:
  mesh, devices = _mesh_devices(ctx, kernel, spec)
  if jax.process_count() > 1:  # peers in other processes: docs/collectives.md, "Across processes"
    cross_process.install()
  ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(devices)
  if getattr(ctx.module_context.lowering_parameters, "for_export", False) and not np.array_equal(
      ids.ravel(), np.arange(ids.size)):
    # The cliques name device ids, and the runtime finds a device's rank by its id: an exported program called on
    # devices 0..n-1 (jax's default) would get ranks in this mesh's order, not the caller's.
    raise LaunchError(
        f"{who(kernel, spec.call_site)}: jax.export of a collective kernel needs a mesh of devices 0..{ids.size - 1} "
        f"in row-major order (its cliques name device ids, and the exported program runs on them in that order); "
        f"this mesh's devices are {ids.ravel().tolist()}. Export over Mesh(np.array(jax.devices()[:{ids.size}])"
        f".reshape({', '.join(map(str, ids.shape))}), ...) and call the program on those devices")
  groups = collective_lib.cliques(ids, mesh.axis_names, spec.collective.axes)
  symmetric = spec.collective.symmetric or (False,) * (spec.num_inputs + spec.num_outputs)
  return {
      "xla_replica_ids": collective_lib.format_replica_ids(groups),
      "symmetric_memory_parameters": ",".join("1" if s else "0" for s in symmetric),
      "skip_device_barrier": bool(spec.collective.skip_device_barrier),
  }


# Integers are i32 in the contract, but for these (docs/contract.md); the
# validator has bounded each value.
_I64_ARRAYS = frozenset({"batch_strides", "tensor_maps", "launch_programs"})


def _ir_attribute(name: str, value) -> ir.Attribute:
  if isinstance(value, bool):
    return ir.BoolAttr.get(value)
  if isinstance(value, int):
    return mlir.ir_attribute(np.int32(value))
  if isinstance(value, list):
    if name in _I64_ARRAYS:
      return ir.DenseI64ArrayAttr.get([int(v) for v in value])
    return ir.DenseI32ArrayAttr.get([int(v) for v in value])
  return mlir.ir_attribute(value)


def _cuda_lowering(ctx, *operands, kernel: Kernel, out_avals, spec: LaunchSpec):
  if fallback_lib.reference_mode():  # read per lowering: a debugging switch
    if spec.fallback is not None:
      shadow.stood_in(kernel, spec, f"{fallback_lib.REFERENCE_ENV}=1 runs each kernel's fallback in its place")
      return fallback_lib.lower(ctx, operands, spec.fallback)
    fallback_lib.warn_no_reference(who(kernel, spec.call_site), spec.call_site)
  registration.ensure_registered()
  if getattr(ctx.module_context.lowering_parameters, "for_export", False):
    export_stability.warn_if_refused(who(kernel, spec.call_site))
  front_end.check_images(kernel, kernel.parsed, who(kernel, spec.call_site))
  front_end.check_defines(kernel, who(kernel, spec.call_site))
  runtime_libraries.check(kernel.parsed, who(kernel, spec.call_site))
  if kernel.parsed.host_code:
    # Host code this process made: JAX_MOSAIC_FFI_HOST_CODE=lowered runs only such images.
    native.core.note_lowered_host_code(kernel.hash)
  attributes = spec.attributes(kernel)
  if os.environ.get(POISON_ENV, "") not in ("", "0"):
    aliased = {o for _, o in spec.aliases}
    attributes["poison_outputs"] = [o for o in range(len(out_avals)) if o not in aliased]
  if spec.collective_target:
    attributes.update(_collective_attributes(ctx, kernel, spec))
    launch_spec.validate(kernel, spec, attributes)
  elif spec.collective is not None:  # NVSHMEM: started by the runtime when the kernel first loads
    _check_nvshmem_clique(ctx, kernel, spec)
  result_shapes = None
  if not all(core.is_constant_shape(a.shape) for a in out_avals):
    # jax.export with shape polymorphism: the output shapes as values, for jax to refine when the export is
    # called (a grid or scalars that depend on them are launch programs, computed by the runtime).
    result_shapes = [mlir.shape_tensor(ctx.module_context, mlir.eval_dynamic_shape_as_ivals(ctx, a.shape))
                     for a in out_avals]
  layouts = spec.minor_to_major([len(a.shape) for a in (*ctx.avals_in, *out_avals)])
  op = mlir.custom_call(
      spec.target,
      result_types=[mlir.aval_to_ir_type(ctx.module_context, a) for a in out_avals],
      operands=list(operands),
      backend_config={name: _ir_attribute(name, value) for name, value in attributes.items()},
      api_version=4,
      operand_output_aliases=dict(spec.aliases) or None,
      result_shapes=result_shapes,
      operand_layouts=layouts[:len(operands)],
      result_layouts=layouts[len(operands):],
      has_side_effect=spec.has_side_effect,
  )
  verification = shadow.active()  # JAX_MOSAIC_FFI_VERIFY or jmf.verify: None (nothing more emitted) when off
  if verification is not None:
    shadow.lower(ctx, operands, op.results, kernel, spec, verification)
  return op.results


def _other_platform_lowering(ctx, *operands, kernel: Kernel, spec: LaunchSpec, **_):
  """Every platform but CUDA runs the call's fallback, if it has one."""
  if spec.fallback is not None:
    platforms = ", ".join(ctx.module_context.platforms)
    shadow.stood_in(kernel, spec, f"the program ran on {platforms}, where each kernel's fallback runs in its place")
    return fallback_lib.lower(ctx, operands, spec.fallback)
  platforms = ", ".join(ctx.module_context.platforms)
  raise NotImplementedError(fallback_lib.missing_message(who(kernel, spec.call_site), platforms, spec.call_site))


# The runtime starts NVSHMEM through this when it first loads a kernel that uses it, in a program lowered
# here or loaded from a jax.export artifact.
nvshmem.install()
mlir.register_lowering(mosaic_kernel_p, _other_platform_lowering)
mlir.register_lowering(mosaic_kernel_p, _cuda_lowering, platform="cuda")
