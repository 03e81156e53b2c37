"""The CUDA front end as `mosaic_kernel` picks it (call/front_end.py): a `CudaKernel` from `cuda_kernel`,
`ptx_kernel` or `cubin_kernel`, launched with `CudaOptions`."""

from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.call.front_end import FrontEnd
from jax_mosaic_ffi.cuda import launch
from jax_mosaic_ffi.cuda.launch_options import CudaOptions
from jax_mosaic_ffi.cuda.kernel import CudaKernel

FRONT_END = FrontEnd(
    name="a CUDA kernel",
    kernel_types=(CudaKernel,),
    makers=("cuda_kernel", "ptx_kernel", "cubin_kernel"),
    options=CudaOptions,
    image_kinds=(ImageKind.CUBIN, ImageKind.PTX),
    launcher=launch.launcher,
    compilers=("nvrtc",),
)
