"""The toolchain layer: kernels from CUDA C++ (NVRTC), PTX, cubin and Triton, behind one compile cache.

Imports only from `base`.
"""
