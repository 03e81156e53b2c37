"""The toolchain layer: what every front end's compile makes and shares: the `Kernel`, the module as the caches keep
it, the dumps, the bounded forked compile, the parameters' C++ types. Where a compile's result is kept and found
again is the store's (jax_mosaic_ffi/store/).

Imports only from `base`.
"""
