// jax_mosaic_ffi NVRTC compatibility header: <sys/types.h>.
//
// Why it exists: glibc's <sys/types.h> gives nvcc code `uint`, `ushort`,
// `ulong`, `u_int8_t`, `ssize_t`, ... (cuda_runtime.h includes it, so nvcc
// code uses them without including anything); NVRTC has none of them. The
// fixed-width u_intN_t are the same types as CCCL's uintN_t (stdint.h), so the
// two mix.
#ifndef JMF_COMPAT_SYS_TYPES_H_
#define JMF_COMPAT_SYS_TYPES_H_
#include <stddef.h>
#include <stdint.h>
typedef unsigned char u_char;
typedef unsigned short int u_short;
typedef unsigned int u_int;
typedef unsigned long int u_long;
typedef unsigned short int ushort;
typedef unsigned int uint;
typedef unsigned long int ulong;
typedef uint8_t u_int8_t;
typedef uint16_t u_int16_t;
typedef uint32_t u_int32_t;
typedef uint64_t u_int64_t;
typedef long int ssize_t;
typedef long int off_t;
#endif  // JMF_COMPAT_SYS_TYPES_H_
