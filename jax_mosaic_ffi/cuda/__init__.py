"""The CUDA front end: CUDA C++ compiled by NVRTC, PTX and cubin, as one wing beside triton/ and cute/.

    front_end.py       FRONT_END: this wing as mosaic_kernel picks it (call/front_end.py's protocol)
    kernel.py          CudaKernel, and its makers cuda_kernel, ptx_kernel, cubin_kernel: from source, PTX or cubins
    launch_options.py  CudaOptions: its keywords of mosaic_kernel (grid, block, cluster, smem_bytes, scalars, ...)
    launch.py          its launch: the options checked once into the launch record, one primitive per trace
    nvrtc/             the CUDA C++ compiler: NVRTC in a bounded worker process, through the compile cache
"""
