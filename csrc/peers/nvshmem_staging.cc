#include "peers/nvshmem_staging.h"

#include <string>

#include "ffi/status.h"
#include "peers/nvshmem_runtime.h"

namespace jmf {

ffi::Error NvshmemStaging::Allocate(const Buffers& buffers) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ready_.load(std::memory_order_relaxed)) return ffi::Error::Success();
  std::vector<void*> homes(buffers.count, nullptr);
  for (int i = 0; i < buffers.count; ++i) {
    if (!in_.symmetric[i] || buffers.bytes[i] == 0) continue;
    auto ptr = NvshmemAlloc(buffers.bytes[i], in_.who + " (buffer " + std::to_string(i) + ")");
    if (!ptr.has_value()) {
      for (int j = 0; j < i; ++j) NvshmemFree(homes[j], buffers.bytes[j]);
      return ptr.error();
    }
    homes[i] = *ptr;
  }
  bytes_.assign(buffers.bytes, buffers.bytes + buffers.count);
  copy_in_.assign(buffers.count, false);
  for (int i = 0; i < buffers.count; ++i) copy_in_[i] = i < in_.num_inputs;
  for (int b : in_.filled_outputs) copy_in_[b] = true;
  homes_ = std::move(homes);
  ready_.store(true, std::memory_order_release);
  return ffi::Error::Success();
}

ffi::Error NvshmemStaging::StageIn(CUstream stream, Buffers& buffers, void** originals) {
  if (!ready()) [[unlikely]]  // the initialize stage did not run: a plain execute
    JMF_RETURN_IF_ERROR(Allocate(buffers));
  const Driver& driver = *in_.driver;
  for (int i = 0; i < buffers.count; ++i) {
    originals[i] = buffers.ptrs[i];
    if (homes_[i] == nullptr) continue;
    if (copy_in_[i]) {  // other outputs are written by the kernel (aliasing is refused at trace time)
      JMF_RETURN_IF_ERROR(
          CudaCheck(driver,
                    driver.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(homes_[i]),
                                             reinterpret_cast<CUdeviceptr>(buffers.ptrs[i]), buffers.bytes[i], stream),
                    in_.who, "copying a buffer onto NVSHMEM's symmetric heap"));
    }
    buffers.ptrs[i] = homes_[i];
  }
  return ffi::Error::Success();
}

ffi::Error NvshmemStaging::StageOut(CUstream stream, Buffers& buffers, void* const* originals) const {
  const Driver& driver = *in_.driver;
  for (int i = 0; i < buffers.count; ++i) {
    buffers.ptrs[i] = originals[i];
    if (homes_[i] == nullptr || i < in_.num_inputs) continue;
    JMF_RETURN_IF_ERROR(
        CudaCheck(driver,
                  driver.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(originals[i]),
                                           reinterpret_cast<CUdeviceptr>(homes_[i]), buffers.bytes[i], stream),
                  in_.who, "copying a result off NVSHMEM's symmetric heap"));
  }
  return ffi::Error::Success();
}

NvshmemStaging::~NvshmemStaging() {
  // nvshmem_free is collective: with peers, call sites die at different times
  // on different PEs, so the buffers stay until NVSHMEM is finalized. With one
  // PE there is no one to wait for.
  if (!ready() || GetNvshmemJob().npes != 1) return;
  for (size_t i = 0; i < homes_.size(); ++i) NvshmemFree(homes_[i], bytes_[i]);
  homes_.clear();
}

}  // namespace jmf
