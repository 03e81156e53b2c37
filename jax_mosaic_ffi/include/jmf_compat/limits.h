// jax_mosaic_ffi NVRTC compatibility header: <limits.h>.
//
// Why it exists: NVRTC ships no <limits.h>, so INT_MAX, CHAR_BIT, ... are
// undefined. CCCL's <cuda/std/climits> defines them too under NVRTC, and any
// CCCL header pulls it in, so each macro here is spelled token for token as
// CCCL 13.0 spells it: its definitions are then the same macros again, which
// the preprocessor accepts silently (tests/test_nvrtc_compat.py checks it).
// Defined here, not taken from CCCL: CCCL's configuration headers cost an
// NVRTC compile a third of a small kernel's time, and the prelude includes
// this header into every kernel.
#ifndef JMF_COMPAT_LIMITS_H_
#define JMF_COMPAT_LIMITS_H_
#define CHAR_BIT 8
#define SCHAR_MIN (-128)
#define SCHAR_MAX 127
#define UCHAR_MAX 255
#if '\xff' > 0
#define CHAR_MIN 0
#define CHAR_MAX UCHAR_MAX
#else
#define CHAR_MIN SCHAR_MIN
#define CHAR_MAX SCHAR_MAX
#endif
#define SHRT_MIN (-SHRT_MAX - 1)
#define SHRT_MAX 0x7fff
#define USHRT_MAX 0xffff
#define INT_MIN (-INT_MAX - 1)
#define INT_MAX 0x7fffffff
#define UINT_MAX 0xffffffff
#define LONG_MIN (-LONG_MAX - 1)
#ifdef __LP64__
#define LONG_MAX LLONG_MAX
#define ULONG_MAX ULLONG_MAX
#else
#define LONG_MAX INT_MAX
#define ULONG_MAX UINT_MAX
#endif
#define LLONG_MIN (-LLONG_MAX - 1)
#define LLONG_MAX 0x7fffffffffffffffLL
#define ULLONG_MAX 0xffffffffffffffffUL
#endif  // JMF_COMPAT_LIMITS_H_
