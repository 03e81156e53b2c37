// NVSHMEM calls: the buffers the call marks symmetric live, for the launch,
// on NVSHMEM's symmetric heap, where peers' puts and gets can reach them. As
// the IPC path does with its shared workspace (collective_workspace.cc),
// inputs are copied in before the launch and outputs out after it, on the
// call's stream; the kernel gets the symmetric addresses.
#include <string>

#include "runtime/call_site.h"
#include "runtime/nvshmem_runtime.h"
#include "runtime/status.h"

namespace jmf {

ffi::Error CallSite::AllocateSymmetricBuffers(const Buffers& buffers) {
  // Every PE allocates in the same order (one SPMD program, each call site's
  // initialize stage before its first launch), so the collective
  // nvshmem_malloc calls line up.
  std::lock_guard<std::mutex> lock(mutex_);
  if (symmetric_ready_.load(std::memory_order_relaxed)) return ffi::Error::Success();
  std::vector<void*> homes(buffers.count, nullptr);
  for (int i = 0; i < buffers.count; ++i) {
    if (!spec_.nvshmem_symmetric[i] || buffers.bytes[i] == 0) continue;
    auto ptr = NvshmemAlloc(buffers.bytes[i], who() + " (buffer " + std::to_string(i) + ")");
    if (!ptr.has_value()) {
      for (int j = 0; j < i; ++j) NvshmemFree(homes[j], buffers.bytes[j]);
      return ptr.error();
    }
    homes[i] = *ptr;
  }
  symmetric_bytes_.assign(buffers.bytes, buffers.bytes + buffers.count);
  // Inputs are copied in, and so are outputs the runtime fills before the launch (zero_outputs, and
  // the debug poison, which must reach the buffer the kernel writes).
  symmetric_copy_in_.assign(buffers.count, false);
  for (int i = 0; i < buffers.count; ++i) symmetric_copy_in_[i] = i < spec_.num_inputs;
  for (int b : spec_.zero_buffers) symmetric_copy_in_[b] = true;
  for (int b : spec_.poison_buffers) symmetric_copy_in_[b] = true;
  symmetric_ = std::move(homes);
  symmetric_ready_.store(true, std::memory_order_release);
  return ffi::Error::Success();
}

ffi::Error CallSite::StageIntoSymmetricHeap(CUstream stream, Buffers& buffers, void** originals) {
  if (!symmetric_ready()) [[unlikely]]  // the initialize stage did not run: a plain execute
    JMF_RETURN_IF_ERROR(AllocateSymmetricBuffers(buffers));
  for (int i = 0; i < buffers.count; ++i) {
    originals[i] = buffers.ptrs[i];
    if (symmetric_[i] == nullptr) continue;
    if (symmetric_copy_in_[i]) {  // other outputs are written by the kernel (aliasing is refused at trace time)
      JMF_RETURN_IF_ERROR(CudaCheck(
          *driver_,
          driver_->cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(symmetric_[i]),
                                     reinterpret_cast<CUdeviceptr>(buffers.ptrs[i]), buffers.bytes[i], stream),
          who(), "copying a buffer onto NVSHMEM's symmetric heap"));
    }
    buffers.ptrs[i] = symmetric_[i];
  }
  return ffi::Error::Success();
}

ffi::Error CallSite::StageOutOfSymmetricHeap(CUstream stream, Buffers& buffers, void* const* originals) const {
  for (int i = 0; i < buffers.count; ++i) {
    buffers.ptrs[i] = originals[i];
    if (symmetric_[i] == nullptr || i < spec_.num_inputs) continue;
    JMF_RETURN_IF_ERROR(
        CudaCheck(*driver_,
                  driver_->cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(originals[i]),
                                             reinterpret_cast<CUdeviceptr>(symmetric_[i]), buffers.bytes[i], stream),
                  who(), "copying a result off NVSHMEM's symmetric heap"));
  }
  return ffi::Error::Success();
}

void CallSite::FreeSymmetricBuffers() {
  // nvshmem_free is collective: with peers, call sites die at different times
  // on different PEs, so the buffers stay until NVSHMEM is finalized. With one
  // PE there is no one to wait for.
  if (!symmetric_ready() || GetNvshmemJob().npes != 1) return;
  for (size_t i = 0; i < symmetric_.size(); ++i) NvshmemFree(symmetric_[i], symmetric_bytes_[i]);
  symmetric_.clear();
}

}  // namespace jmf
