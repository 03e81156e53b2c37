"""jax-triton's public API, run by jax_mosaic_ffi: switching is one import line.

    import jax_triton as jt                   # before
    import jax_mosaic_ffi.jax_triton as jt    # after: the same calls

It holds what jax-triton 0.4's ``__all__`` holds: `triton_call` (also ``jax_mosaic_ffi.triton_call``),
`strides_from_shape`, `TensorDescriptor` (jax-triton's, with an array for ``base``; ``jax_mosaic_ffi``'s own
`TensorDescriptor` names an operand of ``mosaic_kernel``), ``CUSTOM_CALL_TARGET_NAME`` (the custom call these
calls lower to), and ``__version__`` / ``__version_info__``: the jax-triton release whose API this mirrors.
:doc:`Coming from jax-triton </coming_from_jax_triton>` has the mapping and the differences.
"""

from jax_mosaic_ffi.adapters.triton_call import CUSTOM_CALL_TARGET_NAME, triton_call
from jax_mosaic_ffi.adapters.triton_call_operands import TensorDescriptor, strides_from_shape

__version_info__ = (0, 4, 1)
__version__ = ".".join(str(v) for v in __version_info__)

__all__ = ["triton_call", "strides_from_shape", "CUSTOM_CALL_TARGET_NAME", "TensorDescriptor", "__version__",
           "__version_info__"]
