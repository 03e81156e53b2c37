"""What one `mosaic_kernel` call launches (`LaunchSpec`), and the checks of a launch against the runtime's
validator (csrc/contract/contract.cc, the one owner of the contract), the GPU and the kernel's PTX signature.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.call import param_types
from jax_mosaic_ffi.call.collective import Collective
from jax_mosaic_ffi.call.launch_extension import LaunchExtension
from jax_mosaic_ffi.call.tensor_map import TensorMap
from jax_mosaic_ffi.toolchain.kernel import Kernel

TENSOR_MAP_CODE = core.LIMITS["tensor_map_code"]


def _not_launched(**kwargs):
  """A field that is not part of what is launched (a message's context, what runs off CUDA): left out of
  `LaunchSpec.identity`."""
  return dataclasses.field(metadata={"launched": False}, **kwargs)


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
  """Everything about one call site that is not the kernel's code. Every field is part of the launch (and of
  `identity`) unless it is marked `_not_launched`."""

  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  cluster: tuple[int, int, int]
  smem_bytes: int
  uses_pdl: bool
  num_inputs: int
  num_outputs: int
  param_order: tuple[int, ...]  # buffer index >= 0 (inputs, then outputs); scalar k as -(k + 1)
  scalar_data: bytes            # 8 bytes per scalar, little-endian
  scalar_sizes: tuple[int, ...]
  aliases: tuple[tuple[int, int], ...]  # (input, output)
  collective: Collective | None
  call_site: str = _not_launched()
  # vmap: the primitive's buffers hold batch_size elements each, batch_strides
  # bytes apart (0: an input shared by all). Launched once per element by the
  # runtime, or, with batch_grid_axis (0, 1, 2), as one launch with that grid
  # axis multiplied (see `attributes`).
  batch_size: int = 1
  batch_strides: tuple[int, ...] = ()
  batch_grid_axis: int | None = None
  # TMA descriptors the runtime builds (tensor_map.py): kTensorMapFields ints
  # each, flat, and their declarations (for messages). Scratch: the last
  # `num_scratch` outputs are the call's scratch buffer, not returned;
  # `zero_outputs` are zeroed before every launch.
  tensor_maps: tuple[int, ...] = ()
  tensor_map_decls: tuple[TensorMap, ...] = _not_launched(default=())
  num_scratch: int = 0
  zero_outputs: tuple[int, ...] = ()
  # Each scalar's dtype name, for the typed check of the kernel's parameters (param_types.py); not lowered.
  scalar_dtypes: tuple[str, ...] = _not_launched(default=())
  # jax.export with shape polymorphism: the grid axes and integer scalars computed at run time from the
  # buffers' shapes (launch_programs.py; contract v2). `grid` and `scalar_data` then hold placeholders.
  launch_programs: tuple[int, ...] = ()
  # What a front end adds to the launch, for a module whose entry is not a kernel launched with parameters
  # (launch_extension.py): its custom-call target and the attributes only that target reads. None: a kernel.
  extension: LaunchExtension | None = None
  # Each buffer's physical layout (inputs, then outputs) as XLA's minor-to-major dimension list, of the buffer
  # as bound (a CuTe DSL tensor's TensorSpec.layout); the lowering asks XLA for it, which inserts any copies.
  # None: every buffer row-major, the common case. Part of the lowered call, not of the contract's attributes.
  layouts: tuple[tuple[int, ...], ...] | None = None
  # Not part of the launch: the jax.numpy function lowered instead of the
  # kernel off CUDA (fallback.py). Compared by identity.
  fallback: Any = _not_launched(default=None)
  # Not part of the launch: the derivative rule this call was made in (jmf.differentiable's), so that a
  # second derivative is refused as such (primitive.py).
  derivative_rule: str | None = _not_launched(default=None)
  # The custom call's own has_side_effect flag (XLA and jaxpr DCE then keep it with unused results), and the
  # cost estimate it carries for profilers (`cost_estimate_json`, JSON; bounded by the contract, not read by the
  # runtime). Both are part of the lowered call, so of its identity too.
  has_side_effect: bool = False
  cost_estimate: str | None = None

  def identity(self) -> dict[str, Any]:
    """What this call launches besides the kernel's code, as plain values: every field not marked
    `_not_launched` (bytes as hex). The autotuner keys a config's timing by it, with the kernel's hash, so a
    field added to the launch is in the key without more ado."""
    launch = {}
    for field in dataclasses.fields(self):
      if field.metadata.get("launched", True):
        value = getattr(self, field.name)
        if isinstance(value, LaunchExtension):
          value = {"kind": type(value).__name__, **value.identity()}
        launch[field.name] = value.hex() if isinstance(value, bytes) else value
    return launch

  def minor_to_major(self, ranks) -> list[list[int]]:
    """The layout of each buffer of these ranks (inputs, then outputs), as the lowering asks XLA for it:
    `layouts`, or row-major. A buffer with more dimensions than its layout has leading batch axes (vmap's,
    `_batching_rule` in primitive.py): they are the major-most, so each batch element stays one compact block,
    `batch_strides` apart."""
    out = []
    for b, rank in enumerate(ranks):
      layout = self.layouts[b] if self.layouts is not None else tuple(reversed(range(rank)))
      extra = rank - len(layout)
      out.append([d + extra for d in layout] + list(reversed(range(extra))))
    return out

  @property
  def target(self) -> str:
    """The custom-call target this call is lowered to (base/contract.py)."""
    if self.extension is not None:
      return self.extension.target()
    return contract.target_name(collective=self.collective_target,
                                nvshmem=self.collective is not None and self.collective.nvshmem,
                                programs=bool(self.launch_programs))

  @property
  def collective_target(self) -> bool:
    """Lowered to the collective target (cliques, metadata pointer): collective over IPC, not NVSHMEM."""
    return self.collective is not None and not self.collective.nvshmem

  def attributes(self, kernel: Kernel) -> dict[str, Any]:
    """The contract attributes of the custom call (docs/contract.md), as Python values.

    Collective calls get their clique attributes at lowering, from the mesh.
    A kernel written for a batch on a grid axis (``batch_grid_axis``) always
    gets, after its scalars, a `u32`: the axis's length for one element (its
    element is blockIdx / that), and one `u64` per buffer (inputs, then
    outputs): the bytes between elements, 0 for a shared input (all 0 when
    the call is not batched). A batch is then one launch, the axis
    `batch_size` times longer.
    """
    grid, order = list(self.grid), list(self.param_order)
    sizes, data = list(self.scalar_sizes), self.scalar_data
    if self.batch_grid_axis is not None:
      grid[self.batch_grid_axis] *= self.batch_size
      strides = self.batch_strides or (0,) * (self.num_inputs + self.num_outputs)
      extra = [np.uint32(self.grid[self.batch_grid_axis])] + [np.uint64(s) for s in strides]
      order += [-(len(sizes) + k + 1) for k in range(len(extra))]
      sizes += [v.dtype.itemsize for v in extra]
      data += b"".join(v.tobytes().ljust(8, b"\0") for v in extra)
    attributes = {
        "module": kernel.module,
        "kernel_hash": kernel.hash,
        "kernel_name": kernel.name,
        "call_site": self.call_site,
        "use_custom_barrier": False,
        "uses_xla_collective_metadata": self.collective_target,
        "grid": grid,
        "block": list(self.block),
        "cluster": list(self.cluster),
        "smem_bytes": self.smem_bytes,
        "uses_pdl": self.uses_pdl,
        "num_inputs": self.num_inputs,
        "num_outputs": self.num_outputs,
        "param_order": order,
    }
    if sizes:
      attributes["scalar_sizes"] = sizes
      attributes["scalar_data"] = data
    if self.tensor_maps:
      attributes["tensor_maps"] = list(self.tensor_maps)
    if self.zero_outputs:
      attributes["zero_outputs"] = list(self.zero_outputs)
    if self.launch_programs:
      attributes["launch_programs"] = list(self.launch_programs)
    if self.cost_estimate is not None:
      attributes["cost_estimate_json"] = self.cost_estimate
    if self.extension is not None:
      attributes.update(self.extension.attributes())
    if self.batch_size > 1 and self.batch_grid_axis is None:
      attributes["batch_size"] = self.batch_size
      attributes["batch_strides"] = list(self.batch_strides)
    if self.collective is not None and self.collective.nvshmem:
      # Every buffer by default; the scratch buffer (past the declared ones) is symmetric too: signal flags
      # and partials that peers write belong there.
      symmetric = tuple(self.collective.symmetric or ())
      symmetric += (True,) * (self.num_inputs + self.num_outputs - len(symmetric))
      attributes["nvshmem_symmetric"] = ",".join("1" if s else "0" for s in symmetric)
    return attributes


def validate(kernel: Kernel, spec: LaunchSpec, attributes: dict | None = None) -> dict:
  """The runtime's own checks of these attributes: {"param_sizes", "num_buffers"}.

  Without ``attributes``, a collective call is checked with a one-device
  clique standing in for its mesh, which only the lowering knows (and checks).
  """
  if attributes is None:
    attributes = spec.attributes(kernel)
    if spec.collective_target:
      attributes["xla_replica_ids"] = "0"
  try:
    return core.validate_launch(attributes, spec.collective_target)
  except ValueError as e:
    text = str(e)
    for m, decl in enumerate(spec.tensor_map_decls):  # the runtime knows maps by index; name the declaration
      text = text.replace(f"tensor map {m} (", f"param_order entry {decl} (tensor map {m}, ")
    raise LaunchError(f"{who(kernel, spec.call_site)}: {text}") from None


def _describe_param(code: int, in_avals, out_avals, scalar_sizes) -> str:
  n_in = len(in_avals)
  if code >= TENSOR_MAP_CODE:
    return f"tensor map {code - TENSOR_MAP_CODE} (CUtensorMap, 128 bytes)"
  if code >= n_in:
    aval = out_avals[code - n_in]
    return f"out{code - n_in} ({aval.dtype}{list(aval.shape)} pointer, 8 bytes)"
  if code >= 0:
    aval = in_avals[code]
    return f"in{code} ({aval.dtype}{list(aval.shape)} pointer, 8 bytes)"
  return f"scalar{-code - 1} ({scalar_sizes[-code - 1]} bytes)"


def check_launch(kernel: Kernel, spec: LaunchSpec, in_avals, out_avals) -> None:
  """The runtime's validator, then what only this machine or the PTX knows."""
  where = who(kernel, spec.call_site)
  checked = validate(kernel, spec)
  gpus = gpu_info.visible_gpus()
  if gpus:
    limit = min(g.max_shared_memory_per_block_optin for g in gpus)
    if spec.smem_bytes > limit:
      raise LaunchError(
          f"{where}: smem_bytes = {spec.smem_bytes} is over the {limit} bytes of dynamic shared "
          f"memory a block may have on {gpus[0].name}; use less shared memory per block")
  # The declared types first, where known: a wrong width is then named by its parameter and type.
  param_types.check(kernel, spec, in_avals, out_avals, where)
  expected = kernel.param_sizes
  if expected is None or list(expected) == list(checked["param_sizes"]):
    return  # a cubin is checked against the binary when it is loaded
  described = [_describe_param(c, in_avals, out_avals, spec.scalar_sizes) for c in spec.param_order]
  if spec.batch_grid_axis is not None:
    described += ["the element's grid length (4 bytes)"] + [
        f"batch stride of buffer {b} (8 bytes)" for b in range(spec.num_inputs + spec.num_outputs)]
  if spec.collective_target:
    described.append("collective metadata (pointer, 8 bytes)")
  raise LaunchError(
      f"{where}: the kernel takes {len(expected)} parameters of {list(expected)} bytes, but the call passes "
      f"{len(checked['param_sizes'])}: {'; '.join(described) or 'none'}. The order is inputs, outputs, then "
      "scalars" + (", then the batch parameters of batch_grid_axis" if spec.batch_grid_axis is not None else "") +
      (", then the collective metadata pointer" if spec.collective_target else "") +
      "; fix the kernel's signature, the scalars' dtypes, or param_order")


def empty_outputs(out_avals) -> bool:
  return all(math.prod(a.shape) == 0 for a in out_avals)
