"""The C++ extension (`_core`, csrc/python/): this module is its one importer.

Everything else reaches the runtime as ``native.core``, so the package's dependency on the extension is
one line, and the import order (jax's extensions before ours) is kept in one place.
"""

from __future__ import annotations

import jax  # noqa: F401  (jaxlib's extensions load before ours)

from jax_mosaic_ffi import _core as core

__all__ = ["core"]
