// jax_mosaic_ffi NVRTC compatibility header: included before a kernel that calls NVSHMEM.
//
// Why it exists: NVSHMEM 3.4's device headers use std::is_integral and friends
// without including <type_traits> (under nvcc the host headers bring it in),
// and NVRTC has no C++ standard library. Our <type_traits> names CCCL's device
// traits in std. (Its one host-only constructor is handled by NVRTC's
// -default-device, which jax_mosaic_ffi passes with this header.)
#ifndef JMF_COMPAT_NVSHMEM_PRELUDE_H_
#define JMF_COMPAT_NVSHMEM_PRELUDE_H_
#include <type_traits>
#endif  // JMF_COMPAT_NVSHMEM_PRELUDE_H_
