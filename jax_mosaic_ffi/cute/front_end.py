"""The CuTe DSL front end as `mosaic_kernel` picks it (call/front_end.py): a `CuteFunction` (a ``@cute.jit``
launcher, compiled per specialization), with no options of its own (`CuteOptions`)."""

from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.call.front_end import FrontEnd
from jax_mosaic_ffi.cute import launch
from jax_mosaic_ffi.cute.kernel import CuteFunction
from jax_mosaic_ffi.cute.options import HINTS, CuteOptions

FRONT_END = FrontEnd(
    name="a CuTe DSL launcher",
    kernel_types=(CuteFunction,),
    makers=("cute_kernel",),
    options=CuteOptions,
    image_kinds=(ImageKind.CUTE,),
    launcher=launch.launcher,
    hints=HINTS,
)
