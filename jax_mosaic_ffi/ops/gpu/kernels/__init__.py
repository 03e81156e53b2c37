"""The Triton kernels of `jax_mosaic_ffi.ops.gpu`, written for it (FlashAttention-2 style online softmax,
split-K decoding, one-pass norms), imported only when an op builds its call: Triton is an optional package, so
``import jax_mosaic_ffi`` never imports these modules.

    attention_forward.py    mha's forward: one program per block of queries, keys streamed with an online softmax
    attention_backward.py   mha's backward: delta, then dK/dV per block of keys and dQ per block of queries
    decode.py               mqa / gqa: each split of the keys its own program, then the splits combined
    paged.py                paged_attention: the same split-K decode, keys gathered page by page
    norms.py                layer_norm and rms_norm, forward and backward (one kernel each)
    softmax.py              softmax over the last axis

Each kernel takes the arrays as they come from XLA (row-major, contiguous) and computes its strides from the
sizes it is given, so every pointer keeps the alignment our launcher tells Triton about. The small per-row
arrays (lengths, segment ids, softmax statistics) are marked ``do_not_specialize_on_alignment``: under ``vmap``
each batch element of them starts wherever the last ended, and nothing of them is read in vectors that matter.
"""
