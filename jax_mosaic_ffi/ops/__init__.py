"""Ready-made kernels built on jax_mosaic_ffi, usable as they are and as examples.

One-shot collectives written as collective kernels (`jax_mosaic_ffi/ops/collectives.py` shows how), called
inside ``shard_map``; ``transport="nvshmem"`` for their NVSHMEM versions
(:doc:`collectives and NVSHMEM </guides/collectives>`)::

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    all_reduce = jax.jit(jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x"),
                                       mesh=mesh, in_specs=P("x"), out_specs=P("x")))
"""

from jax_mosaic_ffi.ops.collectives import all_gather, all_reduce

__all__ = ["all_gather", "all_reduce"]
