"""The toolchain layer: what every front end's compile shares: the `Kernel` it makes, the module as the caches keep
it, the one compile cache, the dumps, the parameters' C++ types.

Imports only from `base`.
"""
