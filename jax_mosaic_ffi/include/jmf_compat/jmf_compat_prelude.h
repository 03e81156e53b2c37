// jax_mosaic_ffi NVRTC compatibility prelude, included before every source
// (NVRTC's --pre-include).
//
// Why it exists: nvcc includes cuda_runtime.h before every .cu file, and with
// it (through glibc and libstdc++) <math.h>/<cmath>, <stdlib.h>,
// <sys/types.h>, <limits.h> and <stddef.h>. So nvcc code uses INFINITY, M_PI,
// std::exp, uint, int64_t, INT_MAX, offsetof, ... without including
// anything, and NVRTC, which includes nothing, rejects it. This gives the
// same names, from the shims next to it. It is kept light: none of them
// includes a CCCL header (CCCL's configuration alone cost a small kernel's
// compile a third more), so a kernel pays for no header it does not use.
//
// -DJMF_COMPAT_NO_PRELUDE turns it off, for a source that defines these names
// itself in a way that clashes.
#ifndef JMF_COMPAT_NO_PRELUDE
#include <math.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/types.h>
#endif
