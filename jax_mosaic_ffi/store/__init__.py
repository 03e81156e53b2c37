"""The store layer: where what the package makes is kept and found again: compiles (every front end's), Triton's
specializations, autotuning timings and decisions. One tier stack (memory, kernel packs, the disk cache, a
``jax.distributed`` job's peers) answers each lookup, in order, before anything is made; every entry says the tier
it came from. The key audit, pack recording, the counts and the cold-start log watch what was served or made.

Imports only from `toolchain` and `base`.
"""
