"""The Triton front end as `mosaic_kernel` picks it (call/front_end.py): a `TritonFunction` (compiled per call
signature, under its decorators if it has any) or a compiled `TritonKernel`, launched with `TritonLaunchOptions`.

Its launcher is also `triton_call`'s, and what a front end built on Triton's compiler takes whole (gluon/: the
specialization, the launch from Triton's metadata, the decorators and the scratch).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from typing import Any, Callable, Mapping

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.call.front_end import FrontEnd
from jax_mosaic_ffi.call.launch_options import LaunchOptions
from jax_mosaic_ffi.triton import decorated
from jax_mosaic_ffi.triton import launch
from jax_mosaic_ffi.triton.compiler import keys as triton_keys
from jax_mosaic_ffi.triton.compiler.compile import TritonKernel
from jax_mosaic_ffi.triton.kernel import TritonFunction
from jax_mosaic_ffi.triton.launch_options import HINTS, TritonLaunchOptions


def launcher(kernel: TritonFunction | TritonKernel, out_shape, launch_options: LaunchOptions,
             options: TritonLaunchOptions, meta: Mapping[str, Any] | None = None) -> Callable[..., Any]:
  """The call of a Triton kernel: its decorators applied per traced call if it has any, else one launch from
  Triton's metadata; ``meta``: an autotuning config's constexprs and launch options."""
  if options.grid is None:
    raise LaunchError(f"mosaic_kernel '{kernel.name}': grid= is required")
  if meta is not None:
    kernel = kernel.with_meta(meta)
  if isinstance(kernel, TritonFunction) and kernel.decorators:  # @triton.autotune / @triton.heuristics
    return decorated.launcher(kernel, out_shape, launch_options, options)
  return launch.launcher(kernel, out_shape, launch_options, options)


def check_tunable(kernel: TritonFunction | TritonKernel, made: str, configs) -> None:
  if isinstance(kernel, TritonFunction) and kernel.decorators:
    raise ValueError(f"{made}: the kernel's @triton.autotune/@triton.heuristics choose its configs; configs=, "
                     "autotune_key=, autotune_default= and autotune_inputs= are for an undecorated kernel")
  if isinstance(kernel, TritonKernel) and configs is not None:
    raise ValueError(f"{made}: configs= needs the kernel uncompiled; make it with jmf.{kernel.language.maker}(fn) "
                     "without signature=, so each config compiles its own")


@functools.cache
def toolchains() -> dict[str, str]:
  """The installed Triton's release, read from its metadata (importing Triton takes seconds, and it may be
  absent): an autotuning timing's environment holds it."""
  try:
    return {"triton": importlib.metadata.version("triton")}
  except importlib.metadata.PackageNotFoundError:
    return {"triton": "none"}


def settings(language: str = "Triton") -> dict[str, list[str]]:
  """The keyed knobs' variables set here, under ``language`` (its entries' front end), where Triton is installed."""
  if importlib.util.find_spec("triton") is None:
    return {}
  return {language: triton_keys.settings_environment()}


FRONT_END = FrontEnd(
    name="a Triton kernel",
    kernel_types=(TritonFunction, TritonKernel),
    makers=("triton_kernel",),
    options=TritonLaunchOptions,
    image_kinds=(ImageKind.CUBIN, ImageKind.PTX),
    launcher=launcher,
    check_tunable=check_tunable,
    hints=HINTS,
    toolchains=toolchains,
    compilers=("triton",),
    settings=settings,
)
