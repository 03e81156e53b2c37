"""The transforms layer: what wraps a launch (autotuning, sharding, derivatives, Triton's launch from its metadata).

Imports only from `call`, `toolchain` and `base`.
"""
