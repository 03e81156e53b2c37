"""cuTile's JAX API (``cuda.tile.jax``), run by jax_mosaic_ffi: switching is one import line.

    import cuda.tile.jax as ctj                     # before
    import jax_mosaic_ffi.cutile_jax as ctj         # after: the same calls

It holds what ``cuda.tile.jax.__all__`` holds: `cutile_call`, `OutputPlaceholder` and `InputOutput`, with their
signatures and behaviour; underneath, each call is a `cutile_kernel` launched by `mosaic_kernel`.
:doc:`cuTile kernels </guides/cutile_kernels>` has the mapping and the differences.
"""

from jax_mosaic_ffi.adapters.cutile_call import InputOutput, OutputPlaceholder, cutile_call

__all__ = ["cutile_call", "OutputPlaceholder", "InputOutput"]
