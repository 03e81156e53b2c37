// The per-call-site state XLA keeps for each mosaic_kernel custom call.
//
// Instantiate builds it from the attributes: the compiled kernel (from the
// process-wide cache), the launch configuration and the argument layout, so
// that a launch parses nothing and allocates nothing. One state serves all
// local devices, which call it concurrently: per-device data lives in slots
// indexed by device ordinal, written once under a mutex and read lock-free.
#ifndef JAX_MOSAIC_FFI_CALL_SITE_H_
#define JAX_MOSAIC_FFI_CALL_SITE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "kernel_cache.h"
#include "record.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

inline constexpr int kMaxDevices = 64;
inline constexpr int kMaxParams = 256;  // launch arguments live on the stack
inline constexpr uintptr_t kBufferAlignment = 256;

class CollectiveState;

// Pointers to the buffers of one call, inputs then outputs.
struct Buffers {
  void* ptrs[kMaxParams + 1];
  size_t bytes[kMaxParams + 1];
  int count = 0;
};

class CallSite {
 public:
  static ffi::TypeId id;

  static ffi::ErrorOr<std::unique_ptr<CallSite>> Create(ffi::Dictionary attrs, bool collective);
  ~CallSite();

  // Reads the buffer pointers of a call and checks their alignment.
  ffi::Error GatherBuffers(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets,
                           Buffers* out) const;

  // Makes sure the kernel is loaded and checked for `device`. `context` is
  // the CUDA context launches will use. O(1) once done.
  ffi::Error Prepare(int32_t device, CUcontext context);

  // Prepares in the context of `stream` (for stages that run no prepare).
  ffi::Error PrepareForStream(int32_t device, CUstream stream);

  ffi::Error Launch(CUstream stream, int32_t device, Buffers& buffers);
  ffi::Error Record(const RecordFrame& record, int32_t device, Buffers& buffers);

  CollectiveState* collective() { return collective_.get(); }
  const Driver& driver() const { return *driver_; }
  const std::string& who() const { return who_; }
  int num_buffers() const { return num_buffers_; }

 private:
  CallSite() = default;

  struct DeviceSlot {
    std::atomic<LoadedModule*> ready{nullptr};
    std::shared_ptr<LoadedModule> module;  // written under mutex_
    // Per recorded launch command on this device (one per graph that holds
    // this call site), the buffer addresses it was last given: an update
    // with the same addresses is skipped. Written by the device's own thread.
    std::vector<std::pair<const XLA_FFI_Command*, std::unique_ptr<void*[]>>> recorded;
  };

  // Fills `params` (pointers to each kernel argument) for one launch.
  int BuildParams(Buffers& buffers, void** params) const;
  ffi::Error LaunchError(CUresult result, int32_t device, const LoadedModule& module) const;
  ffi::Error Poison(CUstream stream, const Buffers& buffers) const;
  ffi::Error DeviceOutOfRange(int32_t device) const;
  ffi::Error CheckFits(const LoadedModule& module, int32_t device) const;

  const Driver* driver_ = nullptr;
  std::shared_ptr<const CompiledKernel> kernel_;
  std::string who_;  // "mosaic_kernel 'add' at model.py:12 (f)"
  int num_inputs_ = 0;
  int num_buffers_ = 0;
  std::vector<int32_t> param_order_;   // buffer index, or -(scalar index + 1)
  std::vector<uint64_t> scalars_;      // one 8-byte slot per scalar
  std::vector<int32_t> scalar_sizes_;
  std::vector<size_t> expected_param_sizes_;
  CUlaunchConfig config_{};
  CUlaunchAttribute launch_attrs_[2]{};
  XLA_FFI_LaunchDims record_dims_{};
  bool uses_pdl_ = false;
  bool non_portable_cluster_ = false;  // a cluster of more than 8 blocks
  bool record_by_capture_ = false;
  std::vector<int32_t> poison_buffers_;  // debug: outputs filled with 0xFF first
  std::unique_ptr<CollectiveState> collective_;
  std::mutex mutex_;
  std::array<DeviceSlot, kMaxDevices> slots_;
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CALL_SITE_H_
