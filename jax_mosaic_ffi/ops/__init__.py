"""Ready-made kernels built on jax_mosaic_ffi, usable as they are and as examples."""

from jax_mosaic_ffi.ops.collectives import all_gather, all_reduce

__all__ = ["all_gather", "all_reduce"]
