"""The call layer: one `mosaic_kernel` launch as a JAX primitive, its lowering to the typed-FFI custom call,
and the runtime's registration with XLA.

Imports only from `toolchain` and `base`.
"""
