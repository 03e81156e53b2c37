// The buffers of one call as the FFI stages pass them around: call sites,
// collectives and the record stage all read this, and it needs nothing but
// the contract's limits.
#ifndef JAX_MOSAIC_FFI_BUFFERS_H_
#define JAX_MOSAIC_FFI_BUFFERS_H_

#include <cstddef>
#include <cstdint>

#include "contract/contract.h"

namespace jmf {

// The buffers of one call, inputs then outputs. One more pointer slot holds
// the collective metadata pointer for the launch.
struct Buffers {
  void* ptrs[kMaxBuffers + 1];
  size_t bytes[kMaxBuffers];  // filled only when outputs are filled, tensor maps are built or a clique spans processes
  // Each buffer's shape as XLA passes it: filled only for CuTe calls, whose host function takes dimensions.
  const int64_t* dims[kMaxBuffers];
  int64_t ranks[kMaxBuffers];
  int count = 0;
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_BUFFERS_H_
