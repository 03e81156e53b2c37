"""The GPU kernels jax 0.11 shipped in ``jax.experimental.pallas.ops.gpu`` (and jax 0.12 removed), with their
names, arguments and results, run by our own Triton kernels: `attention` (``mha``), `decode_attention` (``mqa``,
``gqa``), `paged_attention`, `layer_norm`, `rms_norm` and `softmax`, each with its ``*_reference``. Changing the
import is the whole switch::

    from jax_mosaic_ffi.ops.gpu import attention      # was: from jax.experimental.pallas.ops.gpu import attention
    out = attention.mha(q, k, v, segment_ids=None, causal=True)

They need Triton (the ``triton`` extra); without a GPU each runs its reference math (its kernels' fallbacks),
and every kernel lowers and exports for CUDA anywhere (:doc:`coming from Pallas </guides/coming_from_pallas>`).
"""

from jax_mosaic_ffi.ops.gpu import attention
from jax_mosaic_ffi.ops.gpu import decode_attention
from jax_mosaic_ffi.ops.gpu import layer_norm
from jax_mosaic_ffi.ops.gpu import paged_attention
from jax_mosaic_ffi.ops.gpu import rms_norm
from jax_mosaic_ffi.ops.gpu import softmax

__all__ = ["attention", "decode_attention", "layer_norm", "paged_attention", "rms_norm", "softmax"]
