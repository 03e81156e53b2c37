// Small kernels of the runtime itself: the collective device barrier and the
// output fill used for poisoning. Written in PTX, so the runtime needs no
// compiler; the driver JITs each once per CUDA context.
#ifndef JAX_MOSAIC_FFI_RUNTIME_KERNELS_H_
#define JAX_MOSAIC_FFI_RUNTIME_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "driver/cuda_driver.h"

namespace jmf {

enum class RuntimeKernel {
  // jmf_runtime_barrier(u64 areas, u32 rank, u32 peers, u64 timeout_ns):
  // thread t signals rank t and waits for it; traps after the timeout.
  kBarrier,
  // jmf_runtime_fill(u64 ptr, u64 bytes, u32 word): [ptr, ptr + bytes) gets
  // the 4-byte pattern `word` (the tail bytes its low byte); ptr is 4-byte aligned.
  kFill,
};

struct RuntimeKernelSource {
  const char* symbol;
  const char* ptx;
  size_t size;  // with the terminating NUL, as the record API takes PTX
};
RuntimeKernelSource Source(RuntimeKernel kernel);

// The kernel loaded into `context`, loaded on first use and kept for the process;
// null with `*error` set when the driver refuses it.
CUfunction LoadRuntimeKernel(const Driver& driver, CUcontext context, RuntimeKernel kernel, std::string* error);

// The barrier kernel reads a barrier area's runtime generation word at byte 512.
inline constexpr int kRuntimeGeneration = 64;

// Launch dimensions of the fill kernel for `bytes`: 256 threads a block.
inline uint32_t FillBlocks(uint64_t bytes) {
  const uint64_t blocks = (bytes / 4 + 255) / 256;
  return static_cast<uint32_t>(blocks < 1 ? 1 : blocks > 4096 ? 4096 : blocks);
}
inline constexpr uint32_t kFillThreads = 256;

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_RUNTIME_KERNELS_H_
