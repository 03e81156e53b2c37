"""The Gluon front end as `mosaic_kernel` picks it (call/front_end.py): a `GluonFunction` (compiled per call
signature, under its decorators if it has any) or a compiled `GluonKernel`.

Built on the Triton wing (docs/architecture.md, "A wing built on another"): its launcher, its launch options
(`TritonLaunchOptions`: grid, scalars, uses_pdl, param_order), its configs' rules and its toolchain are the Triton
front end's, which launches any `TritonFunction` by its own compile (a Gluon function's is Gluon's source) and any
`TritonKernel` from Triton's metadata.
"""

from __future__ import annotations

from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.call.front_end import FrontEnd
from jax_mosaic_ffi.gluon.kernel import GluonFunction, GluonKernel
from jax_mosaic_ffi.triton import front_end as triton_front_end
from jax_mosaic_ffi.triton.launch_options import HINTS as TRITON_HINTS
from jax_mosaic_ffi.triton.launch_options import TritonLaunchOptions

# What a Gluon kernel's user gives instead of another front end's keyword: a Triton kernel's answers, with Gluon's
# maker and its warp-specialized warps.
HINTS = {
    **TRITON_HINTS,
    "block": "Triton's metadata sets it (32 x num_warps, a warp-specialized kernel's workers included); pass "
             "num_warps= to jmf.gluon_kernel",
    "cluster": "Triton's metadata sets it (num_ctas); pass num_ctas= to jmf.gluon_kernel",
}

FRONT_END = FrontEnd(
    name="a Gluon kernel",
    kernel_types=(GluonFunction, GluonKernel),
    makers=("gluon_kernel",),
    options=TritonLaunchOptions,
    image_kinds=(ImageKind.CUBIN, ImageKind.PTX),
    launcher=triton_front_end.launcher,
    check_tunable=triton_front_end.check_tunable,
    hints=HINTS,
    toolchains=triton_front_end.toolchains,
    settings=lambda: triton_front_end.settings("Gluon"),
)
