"""The CUDA front end: CUDA C++ compiled by NVRTC, PTX and cubin, as one wing beside triton/ and cute/.

    kernel.py    cuda_kernel, ptx_kernel, cubin_kernel: a `Kernel` from source, PTX or cubins
    nvrtc/       the CUDA C++ compiler: NVRTC in a bounded worker process, through the compile cache
"""
