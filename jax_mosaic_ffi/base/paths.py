"""Where the installed package's files are.

One constant instead of paths rebuilt from each module's ``__file__``, which break as modules move between
folders. These keep their own ``__file__``: `disk_cache` (loaded on its own, from its file, by a test
that must not import jax) and the program that runs as a child process: NVRTC's worker (cuda/nvrtc/program.py).
"""

from __future__ import annotations

import os
import pathlib

# The folder of `jax_mosaic_ffi`: frames and warnings from below it are ours, not the user's.
PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__))
# The device headers that kernels include (<jax_mosaic_ffi/collective.cuh>, <jax_mosaic_ffi/tma.cuh>)
# and the nvcc-compatibility shims (jmf_compat/).
DEVICE_INCLUDE_DIR = pathlib.Path(PACKAGE_DIR) / "include"
