"""The transforms layer: what wraps a launch (autotuning, sharding, derivatives), for every front end alike.

Imports only from `call`, `toolchain` and `base`.
"""
