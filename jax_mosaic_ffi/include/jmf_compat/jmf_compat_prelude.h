// jax_mosaic_ffi NVRTC compatibility prelude, included before every source
// (NVRTC's --pre-include).
//
// Why it exists: nvcc includes cuda_runtime.h before every .cu file, and with
// it (through glibc and libstdc++) <math.h>/<cmath>, <stdlib.h>,
// <sys/types.h>, <limits.h> and <stddef.h>. So nvcc code uses INFINITY, M_PI,
// std::exp, uint, int64_t, INT_MAX, offsetof, ... without including
// anything, and NVRTC, which includes nothing, rejects it. This gives the
// same names, from the shims next to it. It is kept light (no <type_traits>,
// no CUB): it adds some 30 ms to an NVRTC compile.
//
// -DJMF_COMPAT_NO_PRELUDE turns it off, for a source that defines these names
// itself in a way that clashes.
#ifndef JMF_COMPAT_NO_PRELUDE
#include <math.h>
// These take their definitions from CCCL, a dependency of jax_mosaic_ffi; were
// it missing, kernels that need none of them should still compile.
#if __has_include(<cuda/std/climits>)
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/types.h>
#endif
#endif
