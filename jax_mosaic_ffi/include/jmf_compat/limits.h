// jax_mosaic_ffi NVRTC compatibility header: <limits.h>.
//
// Why it exists: NVRTC ships no <limits.h>, so INT_MAX, CHAR_BIT, ... are
// undefined. CCCL defines them for NVRTC in <cuda/std/climits>; we take its
// definitions rather than our own, so the two can be included together.
#ifndef JMF_COMPAT_LIMITS_H_
#define JMF_COMPAT_LIMITS_H_
#include <cuda/std/climits>
#endif  // JMF_COMPAT_LIMITS_H_
