"""The C++ extension (`base/_core`, csrc/python/): this module is its one importer.

Everything else reaches the runtime as ``native.core``, so the package's dependency on the extension is
one line, and the import order (jax's extensions before ours) is kept in one place. The extension is built
into this folder, the bottom layer, so that the import graph sees it where it belongs (import-linter cannot
see into a compiled module, and takes one at the package's top for the package itself).
"""

from __future__ import annotations

import jax  # noqa: F401  (jaxlib's extensions load before ours)

from jax_mosaic_ffi.base import _core as core

__all__ = ["core"]
