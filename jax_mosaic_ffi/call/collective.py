"""Collective kernels: which devices form each clique, as the lowering sees them.

A collective kernel runs on every device of a ``shard_map`` (``pmap`` lowers
to one too). The devices along the named mesh axes form one clique; the
other axes index the cliques. Each device's runtime finds its own clique in
``xla_replica_ids``, its rank in it, and its peers.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


TRANSPORTS = ("ipc", "nvshmem")


@dataclasses.dataclass(frozen=True)
class Collective:
  """Marks a kernel as collective over one or more mesh axes.

  Args:
    axis_name: the mesh axis (or a tuple of axes) whose devices form a clique.
    symmetric: per input and output, whether the buffer is symmetric memory
      (same offset on every peer). Recorded in ``symmetric_memory_parameters``;
      within one process every buffer is reachable, so the runtime treats both
      kinds alike. Across processes only symmetric parameters reach the peers
      (through a shared workspace); when none is declared, every input is.
    skip_device_barrier: skip the barrier the runtime runs before the launch,
      for kernels that synchronise with their peers themselves.
    transport: ``"ipc"`` (default): peers are reached through pointers in one
      process and CUDA IPC between processes of one host; the kernel gets the
      collective metadata pointer last. ``"nvshmem"``: for kernels that call
      NVSHMEM (``cuda_kernel`` of a source including ``<nvshmem.h>``), on one
      host or many: the PEs are the processes of the ``jax.distributed`` job
      (one GPU each), the ``symmetric`` buffers (default: every one) are
      staged through NVSHMEM's symmetric heap, and the kernel takes no
      metadata pointer.

  The kernel includes ``<jax_mosaic_ffi/collective.cuh>`` and takes ``const jmf::CollectiveMetadata*
  meta`` last (``jmf::rank``, ``jmf::num_peers``, ``jmf::peer_ptr``, ``jmf::exit_barrier``); the call
  runs inside ``shard_map`` (:doc:`collectives and NVSHMEM </guides/collectives>`)::

    call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), grid=128, block=256,
                             scalars=(np.int64(x.size),), collective=jmf.Collective("x"))
    summed = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  """

  axis_name: str | tuple[str, ...]
  symmetric: tuple[bool, ...] | None = None
  skip_device_barrier: bool = False
  transport: str = "ipc"

  def __post_init__(self):
    axes = (self.axis_name,) if isinstance(self.axis_name, str) else tuple(self.axis_name)
    if not axes or not all(isinstance(a, str) for a in axes):
      raise TypeError(f"Collective axis_name must be a mesh axis name or a tuple of them, got {self.axis_name!r}")
    object.__setattr__(self, "axis_name", axes)
    if self.symmetric is not None:
      object.__setattr__(self, "symmetric", tuple(bool(s) for s in self.symmetric))
    if self.transport not in TRANSPORTS:
      raise ValueError(
          f"Collective transport must be one of {', '.join(map(repr, TRANSPORTS))}, got {self.transport!r}")

  @property
  def nvshmem(self) -> bool:
    return self.transport == "nvshmem"

  @property
  def axes(self) -> tuple[str, ...]:
    return self.axis_name  # normalised to a tuple in __post_init__


def cliques(mesh_device_ids: np.ndarray, mesh_axis_names: Sequence[str],
            axes: Sequence[str]) -> list[list[int]]:
  """Splits a mesh of device ids into the cliques along ``axes``.

  Each clique lists device ids in mesh order (row-major over ``axes`` in the
  mesh's own axis order); cliques come in row-major order of the other axes.
  """
  names = list(mesh_axis_names)
  missing = [a for a in axes if a not in names]
  if missing:
    raise ValueError(
        f"collective axis {missing[0]!r} is not an axis of the mesh {tuple(names)}")
  collective_dims = [names.index(a) for a in names if a in axes]
  other_dims = [i for i in range(len(names)) if i not in collective_dims]
  ordered = np.transpose(mesh_device_ids, other_dims + collective_dims)
  clique_size = int(np.prod([mesh_device_ids.shape[d] for d in collective_dims]))
  return [[int(x) for x in row] for row in ordered.reshape(-1, clique_size)]


def format_replica_ids(groups: list[list[int]]) -> str:
  """``"0,1,2,3"`` for one clique (the anchor's form); cliques joined by ';'."""
  return ";".join(",".join(str(d) for d in group) for group in groups)
