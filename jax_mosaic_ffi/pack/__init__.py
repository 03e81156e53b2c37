"""Kernel packs' command line: ``python -m jax_mosaic_ffi.pack`` records a program's kernels and builds, lists,
merges and prunes packs (docs/guides/deploying.md). The format is base/pack_file.py's; loading is
store/packs.py's (`jmf.load_pack`, ``JAX_MOSAIC_FFI_PACKS``)."""
