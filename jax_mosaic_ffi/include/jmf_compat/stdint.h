// jax_mosaic_ffi NVRTC compatibility header: <stdint.h>.
//
// Why it exists: NVRTC ships no <stdint.h>, so int32_t, uint64_t, UINT32_MAX,
// ... are undefined. CCCL defines them for NVRTC in <cuda/std/cstdint> (with
// int64_t = long long); we take its definitions rather than our own, because
// two different typedefs of one name would not compile once CUB or any
// <cuda/std/...> header is included as well.
#ifndef JMF_COMPAT_STDINT_H_
#define JMF_COMPAT_STDINT_H_
#include <cuda/std/cstdint>
#endif  // JMF_COMPAT_STDINT_H_
