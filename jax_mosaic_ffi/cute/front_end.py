"""The CuTe DSL front end as `mosaic_kernel` picks it (call/front_end.py): a `CuteFunction` (a ``@cute.jit``
launcher, compiled per specialization), with no options of its own (`CuteOptions`), whose objects run through
NVIDIA's CuTe DSL runtime library (`RUNTIME_LIBRARY`). Imports no DSL: the package's import reaches it."""

from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.call.front_end import FrontEnd, RuntimeLibrary
from jax_mosaic_ffi.cute import launch
from jax_mosaic_ffi.cute.compiler import keys as cute_keys
from jax_mosaic_ffi.cute.compiler import package
from jax_mosaic_ffi.cute.kernel import CuteFunction
from jax_mosaic_ffi.cute.launch_options import HINTS, CuteOptions

RUNTIME_LIBRARY = RuntimeLibrary(
    name=package.LIBRARY,
    description="NVIDIA's CuTe DSL runtime library",
    kernels="CuTe DSL kernels",
    image_kinds=(ImageKind.CUTE,),
    publish=package.publish,
    refuse=package.refuse,
    remedy=package.REMEDY,
    unavailable=package.CuteUnavailable,
)

FRONT_END = FrontEnd(
    name="a CuTe DSL launcher",
    kernel_types=(CuteFunction,),
    makers=("cute_kernel",),
    options=CuteOptions,
    image_kinds=(ImageKind.CUTE,),
    launcher=launch.launcher,
    hints=HINTS,
    runtime_libraries=(RUNTIME_LIBRARY,),
    toolchains=lambda: {"nvidia-cutlass-dsl": package.compiler_release() or "none"},
    compilers=("cute",),
    settings=lambda: {"CuTe DSL": cute_keys.settings_environment()},
)
