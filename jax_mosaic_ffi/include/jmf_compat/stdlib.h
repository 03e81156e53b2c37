// jax_mosaic_ffi NVRTC compatibility header: <stdlib.h>.
//
// Why it exists: NVRTC ships no <stdlib.h>, though device malloc, free and abs
// are built in. This adds the macros glibc's <stdlib.h> has (nvcc code gets
// them from cuda_runtime.h without including anything).
#ifndef JMF_COMPAT_STDLIB_H_
#define JMF_COMPAT_STDLIB_H_
#include <stddef.h>
#ifndef EXIT_SUCCESS
#define EXIT_SUCCESS 0
#endif
#ifndef EXIT_FAILURE
#define EXIT_FAILURE 1
#endif
#ifndef RAND_MAX
#define RAND_MAX 2147483647
#endif
#endif  // JMF_COMPAT_STDLIB_H_
