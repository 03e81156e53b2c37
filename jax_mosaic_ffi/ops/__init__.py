"""Ready-made kernels built on jax_mosaic_ffi, usable as they are and as examples.

One-shot collectives written as collective kernels (`jax_mosaic_ffi/ops/collectives.py` shows how), called
inside ``shard_map``; ``transport="nvshmem"`` for their NVSHMEM versions
(:doc:`collectives and NVSHMEM </guides/collectives>`)::

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    all_reduce = jax.jit(jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x"),
                                       mesh=mesh, in_specs=P("x"), out_specs=P("x")))

The GPU kernels jax 0.11's Pallas shipped (attention, decoding, paged attention, norms, softmax), with their
names and arguments: `jax_mosaic_ffi.ops.gpu` (:doc:`coming from Pallas </guides/coming_from_pallas>`).
"""

from jax_mosaic_ffi.ops import gpu
from jax_mosaic_ffi.ops.collectives import all_gather, all_reduce

__all__ = ["all_gather", "all_reduce", "gpu"]
