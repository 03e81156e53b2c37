"""Other libraries' APIs over this package's, for a user who changes one import.

triton_call.py           jax-triton 0.4's ``triton_call``, bound as jax-triton binds it, launched by the Triton wing
triton_call_operands.py  a ``triton_call``'s arguments as operands; jax-triton's ``TensorDescriptor``
triton_call_options.py   a ``triton_call``'s options as jax-triton takes them (``backend_options`` merged)
cute_call.py             NVIDIA's ``cutlass_call``: its signature over `cute_kernel` and the CuTe DSL wing's launcher

A layer of its own above `api` (each adapter reaches into the wing it adapts), below the public modules that
re-export it (``jax_mosaic_ffi.jax_triton``, the package's ``__init__``).
"""
