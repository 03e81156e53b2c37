"""The cuTile wing's compiler room: a ``@ct.kernel`` and a `Plan` per specialization and targets in, a
`CutileKernel` out, through the one compile cache. It imports only `toolchain` and `base` below it, never the
launch half of its wing (front_end, kernel, launch_options, launch: pyproject.toml's import-linter contract).

    compile.py     export_kernel per target into a module of cubins; CutileKernel, what it compiles to
    plan.py        a specialization (per parameter: array, scalar, constant, tuple) and the cubin's parameters
    signature.py   a plan as cuTile's KernelSignature (cutile_python_v1)
    parameters.py  the kernel's parameters as its annotations declare them; its ct.kernel options
    keys.py        the key's extras: the kernel's code read whole by value_key; cuTile's CUDA_TILE_* settings
    relocate.py    compiles from code naming a fixed folder: cubins that do not depend on where the file is
    cubin.py       what a tile kernel's cubin declares (threads per block, static shared memory)
    release.py     cuTile imported on first use; the supported releases; the tileiras it runs (CutileUnavailable)
"""
