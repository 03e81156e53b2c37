// The per-call-site state XLA keeps for each mosaic_kernel custom call.
//
// Instantiate builds it: the validated launch spec (contract/contract.h), the parsed
// kernel (from the process-wide cache) and the launch configuration, so that
// a launch parses nothing and allocates nothing. One state serves all local
// devices, which call it concurrently: per-device data lives in slots indexed
// by device ordinal, written once under a mutex and read lock-free.
//
// Its methods live in two files:
//   call_site.cc         instantiate and prepare: the state built from the attributes, the kernel loaded and
//                        checked per device, a call's buffers gathered
//   call_site_tensor_maps.cc  its TMA descriptors encoded, again only when their buffer moved
//   call_site_launch.cc  execute and record: the launch, on the stream or as command-buffer nodes
//   call_site_programs.cc  a grid and scalars computed from the buffers' shapes (contract v2)
//   call_site_cute.cc    CuTe DSL calls: the object's module made at instantiate, its host function run
// A collective call site also owns a CollectiveState (peers/collective.h), and an
// NVSHMEM call site an NvshmemStaging (peers/nvshmem_staging.h), each built from
// what it needs, not from the call site.
#ifndef JAX_MOSAIC_FFI_CALL_SITE_H_
#define JAX_MOSAIC_FFI_CALL_SITE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "contract/contract.h"
#include "driver/cuda_driver.h"
#include "ffi/buffers.h"
#include "ffi/record.h"
#include "peers/collective.h"
#include "peers/nvshmem_staging.h"
#include "runtime/cute_module.h"
#include "runtime/kernel_cache.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

// A record frame holds at most this many commands per call (XLA's limit):
// the barrier, the poison fills and the launches must fit.
inline constexpr int kMaxRecordedCommands = 16;

// A TMA descriptor as the kernel gets it, and the address it was encoded for.
struct EncodedTensorMap {
  CUtensorMap map;
  const void* address = nullptr;
};

class CallSite {
 public:
  static ffi::TypeId id;

  // `programs_allowed`: the call's target is of contract v2, whose calls may
  // carry launch programs; a v1 call that has them is refused.
  static ffi::ErrorOr<std::unique_ptr<CallSite>> Create(ffi::Dictionary attrs, bool collective,
                                                        bool programs_allowed = false);

  // Reads the buffer pointers of a call and checks their count and alignment.
  ffi::Error GatherBuffers(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets, Buffers* out) const;

  // Makes sure the kernel is loaded and checked for `device`. `context` is
  // the CUDA context launches will use. O(1) once done.
  ffi::Error Prepare(int32_t device, CUcontext context);

  // Whether the grid or scalars come from the buffers' shapes (launch programs):
  // then ResolveLaunchPrograms runs before every launch or record.
  bool has_programs() const { return spec_.programs != nullptr; }
  // Computes them at the first call; later calls check the shapes they read are the same. O(dims read).
  ffi::Error ResolveLaunchPrograms(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets);

  ffi::Error Launch(CUstream stream, int32_t device, Buffers& buffers);
  // CuTe DSL calls (the CuTe target): the object's host function, run on the stream (call_site_cute.cc).
  bool host_launch() const { return spec_.host_launch; }
  ffi::Error LaunchHost(CUstream stream, int32_t device, Buffers& buffers);
  // The record stage.
  ffi::Error Record(const RecordFrame& record, int32_t device, const Buffers& buffers);

  CollectiveState* collective() { return collective_.get(); }
  // NVSHMEM calls: the call's buffers on NVSHMEM's symmetric heap (peers/nvshmem_staging.h); null otherwise.
  NvshmemStaging* nvshmem() { return nvshmem_.get(); }
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
    std::vector<std::pair<const record_abi::Command*, std::unique_ptr<void*[]>>> recorded;
    // The call's tensor maps on this device, one per map and vmap batch
    // element (TensorMapIndex), allocated before `ready` is set; re-encoded by
    // the device's own thread when their element's buffer moved.
    std::unique_ptr<EncodedTensorMap[]> tensor_maps;
    std::atomic<bool> host_checked{false};  // CuTe calls: this device runs the object's arch
  };

  // Calls visit(index, value_address, size) for each kernel parameter in
  // order: size 0 for a device pointer stored at *value_address, else a
  // host value of that size; a tensor map's is vmap batch element `element`'s.
  // Execute and record both build their arguments with it.
  template <typename Visit>
  int ForEachParam(const Buffers& buffers, int32_t device, Visit&& visit, uint32_t element = 0) const;
  // Where tensor map `m` of batch element `element` is kept in a slot's
  // tensor_maps: a shared input's (batch stride 0) is element 0's.
  size_t TensorMapIndex(size_t m, uint32_t element) const {
    return (ElementOffset(spec_.tensor_maps[m].buffer, element) == 0 ? 0 : element) * spec_.tensor_maps.size() + m;
  }
  // Bytes from a buffer's vmap batch element 0 to `element` (batch_strides is
  // empty on an unbatched call; the contract bounds the product).
  uint64_t ElementOffset(int buffer, uint32_t element) const {
    return element == 0 ? 0 : element * spec_.batch_strides[buffer];
  }

  CUresult LaunchOnce(CUstream stream, const LoadedModule& module, void** params) const;
  void* const* MetadataSlot(int32_t device) const;  // the collective metadata pointer's home
  void MoveToNextElement(Buffers& buffers) const;
  int RecordArgs(const Buffers& buffers, int32_t device, record_abi::KernelArg* args, uint32_t element) const;
  template <typename Fn>
  ffi::Error ForEachElement(const Buffers& buffers, int32_t device, Fn&& fn) const;
  ffi::Error PrepareForStream(int32_t device, CUstream stream);
  ffi::Error LoadForRecord(int32_t device);
  ffi::Error Poison(CUstream stream, const Buffers& buffers) const;
  ffi::Error Zero(CUstream stream, const Buffers& buffers) const;
  // Encodes each tensor map (of each vmap batch element, `buffers` being
  // element 0's) whose buffer is not where it was last encoded for.
  ffi::Error EncodeTensorMaps(const Buffers& buffers, int32_t device) const;
  ffi::Error EncodeTensorMap(const TensorMapSpec& t, size_t m, uint32_t element, const Buffers& buffers,
                             EncodedTensorMap* encoded) const;
  void ConfigureLaunch(bool collective);
  ffi::Error CreateFills(const RecordFrame& record, const Buffers& buffers, CUcontext context,
                         const record_abi::Command** previous) const;
  ffi::Error CreateCommands(const RecordFrame& record, int32_t device, const Buffers& buffers);
  ffi::Error UpdateCommands(const RecordFrame& record, int32_t device, const Buffers& buffers);
  ffi::Error SynchronizeAfter(CUstream stream, int32_t device, CUresult launch_result,
                              const LoadedModule& module) const;
  ffi::Error LaunchError(CUresult result, int32_t device, const LoadedModule& module) const;
  ffi::Error CheckFits(const LoadedModule& module, int32_t device) const;
  std::string LaunchDescription() const;
  // CuTe DSL calls (call_site_cute.cc): the module at instantiate; per device, its arch checked once.
  ffi::Error CreateHostModule();
  ffi::Error CheckHostDevice(int32_t device);
  ffi::Error HostRunError(int code, int32_t result, int32_t device) const;

  LaunchSpec spec_;
  const Driver* driver_ = nullptr;
  std::shared_ptr<const ParsedKernel> kernel_;
  CUlaunchConfig config_{};
  CUlaunchAttribute launch_attrs_[3]{};
  record_abi::LaunchDims record_dims_{};
  bool record_by_capture_ = false;
  bool synchronize_launches_ = false;  // debug: JAX_MOSAIC_FFI_SYNC_LAUNCHES
  bool needs_bytes_ = false;           // buffers' sizes are read: fills, tensor maps, cross-process copies
  std::unique_ptr<CollectiveState> collective_;
  std::unique_ptr<NvshmemStaging> nvshmem_;
  // Launch programs: computed once (under mutex_), and the dimensions they read then.
  std::atomic<bool> programs_resolved_{false};
  std::vector<int64_t> program_dims_;
  // CuTe DSL calls: the object's module, and per buffer how many leading dimensions of its shape are vmap's batch.
  std::shared_ptr<CuteModule> host_module_;
  std::vector<uint8_t> batch_dims_;
  std::mutex mutex_;
  std::array<DeviceSlot, kMaxDevices> slots_;
};

template <typename Visit>
int CallSite::ForEachParam(const Buffers& buffers, int32_t device, Visit&& visit, uint32_t element) const {
  int n = 0;
  for (const Param& p : spec_.params) {
    if (p.kind == Param::kBuffer) {
      visit(n++, static_cast<const void*>(&buffers.ptrs[p.index]), size_t{0});
    } else if (p.kind == Param::kTensorMap) {
      visit(n++, static_cast<const void*>(&slots_[device].tensor_maps[TensorMapIndex(p.index, element)].map),
            size_t{kTensorMapBytes});
    } else {
      visit(n++, static_cast<const void*>(&spec_.scalars[p.index]), size_t{spec_.scalar_sizes[p.index]});
    }
  }
  if (collective_ != nullptr) visit(n++, static_cast<const void*>(MetadataSlot(device)), size_t{0});
  return n;
}

// "<who>: device ordinal N is outside 0..63".
ffi::Error DeviceOutOfRange(const std::string& who, int32_t device);

// Reads JAX_MOSAIC_FFI_SYNC_LAUNCHES (debug: synchronize after each launch
// and name the kernel that faulted).
bool SynchronizeLaunchesRequested();

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CALL_SITE_H_
