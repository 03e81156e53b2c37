"""The cuTile front end (cuTile Python, ``cuda.tile``): a wing beside cuda/, triton/ and cute/ (imports cuTile only
when it compiles or reads a kernel's annotations).

    front_end.py          FRONT_END: this wing as mosaic_kernel picks it (call/front_end.py's protocol)
    kernel.py             cutile_kernel, and CutileFunction (what it returns)
    launch_options.py     CutileOptions: its keywords of mosaic_kernel (grid, scalars, param_order, uses_pdl)
    launch.py             a kernel's launch: per trace its Plan, its cubins, the launch record in cuTile's calling
                          convention
    compiler/             the compiler room: export_kernel per specialization and target into a CutileKernel,
                          through the compile cache; imports nothing of the launch half (compiler/__init__.py)

cuda.tile.jax's API (``cutile_call``), which runs on this wing, is the drop-in module jax_mosaic_ffi.cutile_jax.
"""
