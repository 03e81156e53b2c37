// jax_mosaic_ffi NVRTC compatibility header: <stddef.h>.
//
// Why it exists: NVRTC ships no <stddef.h>. size_t, ptrdiff_t and NULL are
// built in, offsetof is not; CCCL's <cuda/std/cstddef> defines it for NVRTC.
#ifndef JMF_COMPAT_STDDEF_H_
#define JMF_COMPAT_STDDEF_H_
#include <cuda/std/cstddef>
#endif  // JMF_COMPAT_STDDEF_H_
