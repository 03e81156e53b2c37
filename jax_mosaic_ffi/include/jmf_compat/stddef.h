// jax_mosaic_ffi NVRTC compatibility header: <stddef.h>.
//
// Why it exists: NVRTC ships no <stddef.h>. size_t, ptrdiff_t and NULL are
// built in, offsetof is not. CCCL's <cuda/std/cstddef> defines it under NVRTC
// only where it is not defined yet, so this one (the same expression) serves
// both. It is not a constant expression (NVRTC has no __builtin_offsetof), so
// it cannot go in a static_assert as it can under nvcc. Not taken from CCCL,
// whose configuration headers cost every kernel (the prelude includes this
// one) a third of a small kernel's compile.
#ifndef JMF_COMPAT_STDDEF_H_
#define JMF_COMPAT_STDDEF_H_
#ifndef offsetof
#define offsetof(type, member) (::size_t) ((char*) &(((type*) 0)->member) - (char*) 0)
#endif
#endif  // JMF_COMPAT_STDDEF_H_
