// jax_mosaic_ffi NVRTC compatibility header: <stddef.h>.
//
// Why it exists: NVRTC ships no <stddef.h>. size_t, ptrdiff_t and NULL are
// built in, offsetof is not; CCCL's <cuda/std/cstddef> defines it for NVRTC.
// It is not a constant expression there (NVRTC has no __builtin_offsetof),
// so it cannot go in a static_assert as it can under nvcc.
#ifndef JMF_COMPAT_STDDEF_H_
#define JMF_COMPAT_STDDEF_H_
#include <cuda/std/cstddef>
#endif  // JMF_COMPAT_STDDEF_H_
