// jax_mosaic_ffi NVRTC compatibility header: <string.h>.
// Why it exists: device memcpy and memset are built into NVRTC, but
// `#include <string.h>` fails because NVRTC ships no such file.
#ifndef JMF_COMPAT_STRING_H_
#define JMF_COMPAT_STRING_H_
#include <stddef.h>
#endif  // JMF_COMPAT_STRING_H_
