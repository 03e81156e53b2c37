// The per-call-site state XLA keeps for each mosaic_kernel custom call.
//
// Instantiate builds it: the validated launch spec (contract.h), the parsed
// kernel (from the process-wide cache) and the launch configuration, so that
// a launch parses nothing and allocates nothing. One state serves all local
// devices, which call it concurrently: per-device data lives in slots indexed
// by device ordinal, written once under a mutex and read lock-free.
#ifndef JAX_MOSAIC_FFI_CALL_SITE_H_
#define JAX_MOSAIC_FFI_CALL_SITE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "contract.h"
#include "cuda_driver.h"
#include "kernel_cache.h"
#include "record.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

class CollectiveState;

// The buffers of one call, inputs then outputs. One more pointer slot holds
// the collective metadata pointer for the launch.
struct Buffers {
  void* ptrs[kMaxBuffers + 1];
  size_t bytes[kMaxBuffers];  // filled only when outputs are poisoned
  int count = 0;
};

class CallSite {
 public:
  static ffi::TypeId id;

  static ffi::ErrorOr<std::unique_ptr<CallSite>> Create(ffi::Dictionary attrs, bool collective);
  ~CallSite();

  // Reads the buffer pointers of a call and checks their count and alignment.
  ffi::Error GatherBuffers(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets, Buffers* out) const;

  // Makes sure the kernel is loaded and checked for `device`. `context` is
  // the CUDA context launches will use. O(1) once done.
  ffi::Error Prepare(int32_t device, CUcontext context);

  ffi::Error Launch(CUstream stream, int32_t device, Buffers& buffers);
  ffi::Error Record(const RecordFrame& record, int32_t device, const Buffers& buffers);

  CollectiveState* collective() { return collective_.get(); }
  const Driver& driver() const { return *driver_; }
  const LaunchSpec& spec() const { return spec_; }
  const std::string& who() const { return spec_.who; }

 private:
  CallSite() = default;

  struct DeviceSlot {
    std::atomic<LoadedModule*> ready{nullptr};
    std::shared_ptr<LoadedModule> module;  // written under mutex_
    // Per recorded command group on this device (one per graph that holds
    // this call site), the buffer addresses it was last given: an update
    // with the same addresses is skipped. Written by the device's own thread.
    std::vector<std::pair<const XLA_FFI_Command*, std::unique_ptr<void*[]>>> recorded;
  };

  // Calls visit(index, value_address, size) for each kernel parameter in
  // order: size 0 for a device pointer stored at *value_address, else a
  // host value of that size. Execute and record both build their arguments
  // with it.
  template <typename Visit>
  int ForEachParam(const Buffers& buffers, int32_t device, Visit&& visit) const;

  CUresult LaunchOnce(CUstream stream, const LoadedModule& module, void** params) const;
  void MoveToNextElement(Buffers& buffers) const;
  int RecordArgs(const Buffers& buffers, int32_t device, XLA_FFI_KernelArg* args) const;
  ffi::Error PrepareForStream(int32_t device, CUstream stream);
  ffi::Error LoadForRecord(int32_t device);
  ffi::Error Poison(CUstream stream, const Buffers& buffers) const;
  ffi::Error CreateCommands(const RecordFrame& record, int32_t device, const Buffers& buffers);
  ffi::Error UpdateCommands(const RecordFrame& record, int32_t device, const Buffers& buffers);
  ffi::Error SynchronizeAfter(CUstream stream, int32_t device, CUresult launch_result, const LoadedModule& module) const;
  ffi::Error LaunchError(CUresult result, int32_t device, const LoadedModule& module) const;
  ffi::Error CheckFits(const LoadedModule& module, int32_t device) const;
  std::string LaunchDescription() const;

  LaunchSpec spec_;
  const Driver* driver_ = nullptr;
  std::shared_ptr<const ParsedKernel> kernel_;
  CUlaunchConfig config_{};
  CUlaunchAttribute launch_attrs_[2]{};
  XLA_FFI_LaunchDims record_dims_{};
  bool record_by_capture_ = false;
  bool synchronize_launches_ = false;  // debug: JAX_MOSAIC_FFI_SYNC_LAUNCHES
  std::unique_ptr<CollectiveState> collective_;
  std::mutex mutex_;
  std::array<DeviceSlot, kMaxDevices> slots_;
};

// Reads JAX_MOSAIC_FFI_SYNC_LAUNCHES (debug: synchronize after each launch
// and name the kernel that faulted).
bool SynchronizeLaunchesRequested();

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CALL_SITE_H_
