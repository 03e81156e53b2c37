"""The cuTile front end as `mosaic_kernel` picks it (call/front_end.py): a `CutileFunction` (a ``@ct.kernel`` with
its constants, compiled per specialization into cubins), launched with `CutileOptions`. Imports no cuTile: the
package's import reaches it."""

from __future__ import annotations

import functools
import importlib.metadata

from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.call.front_end import FrontEnd
from jax_mosaic_ffi.cutile import launch
from jax_mosaic_ffi.cutile.compiler import keys as cutile_keys
from jax_mosaic_ffi.cutile.compiler.compile import COMPILER
from jax_mosaic_ffi.cutile.kernel import CutileFunction
from jax_mosaic_ffi.cutile.launch_options import HINTS, CutileOptions


@functools.cache
def toolchains() -> dict[str, str]:
  """The releases of cuTile and of pip's tileiras, read from their metadata: an autotuning timing's environment."""
  found = {}
  for name in ("cuda-tile", "nvidia-cuda-tileiras"):
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = "none"
  return found


FRONT_END = FrontEnd(
    name="a cuTile kernel",
    kernel_types=(CutileFunction,),
    makers=("cutile_kernel",),
    options=CutileOptions,
    image_kinds=(ImageKind.CUBIN,),
    launcher=launch.launcher,
    hints=HINTS,
    toolchains=toolchains,
    settings=lambda: {COMPILER: cutile_keys.settings_environment()},
    compilers=("cutile",),
)
