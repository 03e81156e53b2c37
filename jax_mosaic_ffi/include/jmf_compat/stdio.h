// jax_mosaic_ffi NVRTC compatibility header: <stdio.h>.
//
// Why it exists: device printf is built into NVRTC, but `#include <stdio.h>`
// (which nvcc code needs for printf) fails because NVRTC ships no such file.
// Files, streams and fprintf are host-only and stay undefined.
#ifndef JMF_COMPAT_STDIO_H_
#define JMF_COMPAT_STDIO_H_
#include <stddef.h>
#endif  // JMF_COMPAT_STDIO_H_
