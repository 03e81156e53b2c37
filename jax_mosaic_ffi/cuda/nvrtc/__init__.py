"""CUDA C++ with NVRTC: the compile, its worker process, and the nvcc-compatibility headers."""
