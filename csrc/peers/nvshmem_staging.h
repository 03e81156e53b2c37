// An NVSHMEM call's buffers on NVSHMEM's symmetric heap: the buffers the call
// marks symmetric live there for the launch, where peers' puts and gets can
// reach them. As the IPC path does with its shared workspace
// (collective_workspace.cc), inputs are copied in before the launch and
// outputs out after it, on the call's stream; the kernel gets the symmetric
// addresses. One per NVSHMEM call site (NVSHMEM runs one device per process,
// so one set of buffers serves it), built from what it needs, not the call site.
#ifndef JAX_MOSAIC_FFI_NVSHMEM_STAGING_H_
#define JAX_MOSAIC_FFI_NVSHMEM_STAGING_H_

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "driver/cuda_driver.h"
#include "ffi/buffers.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

namespace ffi = xla::ffi;

struct NvshmemStagingInputs {
  const Driver* driver = nullptr;
  std::string who;
  int num_inputs = 0;
  std::vector<bool> symmetric;  // per buffer (inputs, then outputs): staged through the symmetric heap
  // Outputs the runtime fills before the launch (zero_outputs, the debug poison): copied in like inputs, so the
  // fill reaches the buffer the kernel writes.
  std::vector<int> filled_outputs;
};

class NvshmemStaging {
 public:
  explicit NvshmemStaging(NvshmemStagingInputs inputs) : in_(std::move(inputs)) {}
  ~NvshmemStaging();

  // Whether the buffers are allocated (the initialize stage ran, or a launch did it).
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // Allocates the symmetric buffers for these buffers' sizes, once. Every PE allocates in the same order (one
  // SPMD program, each call site's initialize stage before its first launch), so the collective nvshmem_malloc
  // calls line up.
  ffi::Error Allocate(const Buffers& buffers);
  // Before the launch: points `buffers` at the symmetric heap (the caller's pointers saved in `originals`) and
  // copies the inputs and filled outputs there. After it: the outputs back, and the caller's pointers restored.
  ffi::Error StageIn(CUstream stream, Buffers& buffers, void** originals);
  ffi::Error StageOut(CUstream stream, Buffers& buffers, void* const* originals) const;

 private:
  NvshmemStagingInputs in_;
  // Per buffer, its home on the symmetric heap (null: not staged), allocated once (sizes known then).
  std::vector<void*> homes_;
  std::vector<size_t> bytes_;
  std::vector<bool> copy_in_;
  std::atomic<bool> ready_{false};
  std::mutex mutex_;
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_NVSHMEM_STAGING_H_
