// The call site, execute and record: the launch on XLA's stream (once per
// vmap batch element), and the record stage, the same call as CUDA-graph
// nodes inside an XLA command buffer.
//
// A recorded call is a chain of commands: [barrier] [one fill per poisoned
// output] then the launch, or one launch per vmap batch element joined by an
// empty command, so that later commands depend on the whole call.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "driver/runtime_kernels.h"
#include "ffi/status.h"
#include "peers/collective.h"
#include "runtime/call_site.h"

namespace jmf {
namespace {

// The fill kernel's arguments for one poisoned output; the record API copies them.
// `word` is the 4-byte pattern: 0xFFFFFFFF poisons, 0 zeroes (zero_outputs).
struct FillArgs {
  FillArgs(const Buffers& buffers, int b, uint32_t word)
      : bytes(buffers.bytes[b]),
        word(word),
        args{{buffers.ptrs[b], 0, record_abi::kDevicePtr},
             {&bytes, sizeof(bytes), record_abi::kHostValue},
             {&this->word, sizeof(this->word), record_abi::kHostValue}},
        kernel_args{args, 3} {}
  FillArgs(const FillArgs&) = delete;

  uint64_t bytes;
  uint32_t word;
  record_abi::KernelArg args[3];
  record_abi::KernelArgs kernel_args;
};

// The fills of a call, in record order: poisoned outputs, then zeroed ones.
// Calls fn(k, buffer, word) for the k-th fill.
template <typename Fn>
ffi::Error ForEachFill(const LaunchSpec& spec, Fn&& fn) {
  size_t k = 0;
  for (int b : spec.poison_buffers) JMF_RETURN_IF_ERROR(fn(k++, b, 0xFFFFFFFFu));
  for (int b : spec.zero_buffers) JMF_RETURN_IF_ERROR(fn(k++, b, 0u));
  return ffi::Error::Success();
}

}  // namespace

ffi::Error CallSite::Launch(CUstream stream, int32_t device, Buffers& buffers) {
  if (device < 0 || device >= kMaxDevices) [[unlikely]]
    return DeviceOutOfRange(who(), device);
  LoadedModule* module = slots_[device].ready.load(std::memory_order_acquire);
  if (module == nullptr) [[unlikely]] {
    JMF_RETURN_IF_ERROR(PrepareForStream(device, stream));
    module = slots_[device].ready.load(std::memory_order_acquire);
  }
  if (!spec_.poison_buffers.empty()) [[unlikely]]
    JMF_RETURN_IF_ERROR(Poison(stream, buffers));
  if (!spec_.zero_buffers.empty()) JMF_RETURN_IF_ERROR(Zero(stream, buffers));
  void* originals[kMaxBuffers];
  if (nvshmem_ != nullptr) JMF_RETURN_IF_ERROR(nvshmem_->StageIn(stream, buffers, originals));
  // After staging: the kernel reads and writes NVSHMEM's symmetric copies, so its descriptors describe those.
  if (!spec_.tensor_maps.empty()) JMF_RETURN_IF_ERROR(EncodeTensorMaps(buffers, device));
  void* params[kMaxParams];
  auto point_at = [&](int i, const void* value, size_t) { params[i] = const_cast<void*>(value); };
  ForEachParam(buffers, device, point_at);
  CUresult result = LaunchOnce(stream, *module, params);
  // vmap: the same launch once per batch element, each with its buffers moved
  // on; the parameters point into `buffers`, so moving them moves the launch.
  for (uint32_t b = 1; b < spec_.batch_size && result == CUDA_SUCCESS; ++b) {
    MoveToNextElement(buffers);
    if (!spec_.tensor_maps.empty()) ForEachParam(buffers, device, point_at, b);  // its own descriptors
    result = LaunchOnce(stream, *module, params);
  }
  if (nvshmem_ != nullptr) {
    if (result != CUDA_SUCCESS) [[unlikely]]
      return LaunchError(result, device, *module);
    JMF_RETURN_IF_ERROR(nvshmem_->StageOut(stream, buffers, originals));
  }
  if (synchronize_launches_) [[unlikely]]
    return SynchronizeAfter(stream, device, result, *module);
  if (result != CUDA_SUCCESS) [[unlikely]]
    return LaunchError(result, device, *module);
  return ffi::Error::Success();
}

CUresult CallSite::LaunchOnce(CUstream stream, const LoadedModule& module, void** params) const {
  if (config_.numAttrs == 0) {
    return driver_->cuLaunchKernel(module.function(), config_.gridDimX, config_.gridDimY, config_.gridDimZ,
                                   config_.blockDimX, config_.blockDimY, config_.blockDimZ, config_.sharedMemBytes,
                                   stream, params, nullptr);
  }
  CUlaunchConfig config = config_;
  config.hStream = stream;
  return driver_->cuLaunchKernelEx(&config, module.function(), params, nullptr);
}

void CallSite::MoveToNextElement(Buffers& buffers) const {
  for (int i = 0; i < buffers.count; ++i) {
    buffers.ptrs[i] = static_cast<char*>(buffers.ptrs[i]) + spec_.batch_strides[i];
  }
}

ffi::Error CallSite::SynchronizeAfter(CUstream stream, int32_t device, CUresult launch_result,
                                      const LoadedModule& module) const {
  if (launch_result != CUDA_SUCCESS) return LaunchError(launch_result, device, module);
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  driver_->cuStreamIsCapturing(stream, &capturing);
  if (capturing != CU_STREAM_CAPTURE_STATUS_NONE) return ffi::Error::Success();  // a graph is being built
  CUresult result = driver_->cuStreamSynchronize(stream);
  if (result == CUDA_SUCCESS) return ffi::Error::Success();
  return ffi::Error::Internal(
      who() + ": the kernel failed while running on device " + std::to_string(device) + " (" + LaunchDescription() +
      "): " + CudaErrorText(*driver_, result) +
      ". (JAX_MOSAIC_FFI_SYNC_LAUNCHES is on, so this is the first kernel that failed, unless work queued "
      "before it on the stream faulted.) The CUDA context cannot be used after a fault: restart the process. "
      "To find the line, run under compute-sanitizer (`compute-sanitizer --tool memcheck python script.py`) "
      "and compile with options=('-lineinfo',)");
}

ffi::Error CallSite::Poison(CUstream stream, const Buffers& buffers) const {
  for (int b : spec_.poison_buffers) {
    if (buffers.bytes[b] == 0) continue;
    JMF_RETURN_IF_ERROR(CudaCheck(
        *driver_,
        driver_->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(buffers.ptrs[b]), 0xFF, buffers.bytes[b], stream), who(),
        "poisoning output buffers"));
  }
  return ffi::Error::Success();
}

// Outputs the kernel expects zeroed before every launch (zero_outputs: ones it
// accumulates into, and a scratch buffer with zero_scratch).
ffi::Error CallSite::Zero(CUstream stream, const Buffers& buffers) const {
  for (int b : spec_.zero_buffers) {
    if (buffers.bytes[b] == 0) continue;
    JMF_RETURN_IF_ERROR(CudaCheck(
        *driver_, driver_->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(buffers.ptrs[b]), 0, buffers.bytes[b], stream),
        who(), "zeroing zero_outputs"));
  }
  return ffi::Error::Success();
}

ffi::Error CallSite::LaunchError(CUresult result, int32_t device, const LoadedModule& module) const {
  std::string message = who() + ": launch failed on device " + std::to_string(device) + " (" + LaunchDescription() +
                        "): " + CudaErrorText(*driver_, result);
  if (result == CUDA_ERROR_INVALID_CLUSTER_SIZE) {
    CUlaunchConfig config = config_;
    config.hStream = nullptr;
    int max_cluster = 0;
    if (driver_->cuOccupancyMaxPotentialClusterSize(&max_cluster, module.function(), &config) == CUDA_SUCCESS) {
      message += ". The largest cluster this kernel can use with this block and shared memory is " +
                 std::to_string(max_cluster) + " blocks";
    }
  }
  if (result == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) {
    message +=
        ". A kernel that uses NVSHMEM is launched cooperatively (as nvshmemx_collective_launch does): every "
        "block must be resident on the GPU at once; use a smaller grid (at most the SM count times the "
        "blocks per SM this kernel's registers and shared memory allow)";
  }
  return ffi::Error::Internal(message);
}

// ------------------------------------------------------------------ the record stage

ffi::Error CallSite::Record(const RecordFrame& record, int32_t device, const Buffers& buffers) {
  if (device < 0 || device >= kMaxDevices) [[unlikely]]
    return DeviceOutOfRange(who(), device);
  if (record_by_capture_) return record.RequestStreamCapture("requesting stream capture");
  return record.creating() ? CreateCommands(record, device, buffers) : UpdateCommands(record, device, buffers);
}

// A recorded call is a chain of commands: [barrier] [one fill per poisoned
// output] launch. The launch comes last, so later commands depend on it.
// Calls fn(b, arguments) for each vmap batch element b (once without a batch).
template <typename Fn>
ffi::Error CallSite::ForEachElement(const Buffers& buffers, int32_t device, Fn&& fn) const {
  if (!spec_.tensor_maps.empty()) JMF_RETURN_IF_ERROR(EncodeTensorMaps(buffers, device));
  Buffers element = buffers;
  for (uint32_t b = 0; b < spec_.batch_size; ++b) {
    if (b > 0) MoveToNextElement(element);
    record_abi::KernelArg args[kMaxParams];
    record_abi::KernelArgs kernel_args{args, RecordArgs(element, device, args, b)};
    JMF_RETURN_IF_ERROR(fn(b, &kernel_args));
  }
  return ffi::Error::Success();
}

// Debug poisoning and zero_outputs inside a graph, where the record API
// has no memset: one fill-kernel node per filled output, chained after `*previous`.
ffi::Error CallSite::CreateFills(const RecordFrame& record, const Buffers& buffers, CUcontext context,
                                 const record_abi::Command** previous) const {
  if (spec_.poison_buffers.empty() && spec_.zero_buffers.empty()) return ffi::Error::Success();
  const RuntimeKernelSource source = Source(RuntimeKernel::kFill);
  RecordedKernel fill{source.symbol, source.ptx, static_cast<int64_t>(source.size), record_abi::kPtx, nullptr};
  if (record.takes_functions()) {  // loaded once per context, kept for the process
    std::string error;
    fill.function = LoadRuntimeKernel(*driver_, context, RuntimeKernel::kFill, &error);
    if (fill.function == nullptr) return ffi::Error::Internal(who() + ": recording the output fills: " + error);
  }
  return ForEachFill(spec_, [&](size_t, int b, uint32_t word) {
    FillArgs args(buffers, b, word);
    record_abi::LaunchDims dims{{static_cast<int32_t>(FillBlocks(args.bytes)), 1, 1}, {kFillThreads, 1, 1}, {0, 0, 0}};
    const record_abi::Command* command = nullptr;
    JMF_RETURN_IF_ERROR(record.CreateLaunch(fill, dims, 0, false, &args.kernel_args, *previous, &command,
                                            "recording the output fills"));
    if (!record.Push(command)) {
      return ffi::Error(ffi::ErrorCode::kResourceExhausted, who() + ": the record frame has no room");
    }
    *previous = command;
    return ffi::Error::Success();
  });
}

ffi::Error CallSite::CreateCommands(const RecordFrame& record, int32_t device, const Buffers& buffers) {
  JMF_RETURN_IF_ERROR(LoadForRecord(device));
  const LoadedModule& module = *slots_[device].ready.load(std::memory_order_acquire);
  const record_abi::Command* previous = nullptr;
  if (collective_ != nullptr) JMF_RETURN_IF_ERROR(collective_->RecordBarrier(record, device, &previous));
  JMF_RETURN_IF_ERROR(CreateFills(record, buffers, module.context(), &previous));
  const Image& image = module.image();
  const bool ptx = image.kind == ImageKind::kPtx;
  // Record 0.1 hands XLA the image, which XLA loads itself; record 0.5 takes the function loaded here.
  const RecordedKernel kernel{kernel_->module.symbol.c_str(), image.data.c_str(),
                              static_cast<int64_t>(ptx ? image.data.size() + 1 : image.data.size()),
                              ptx ? record_abi::kPtx : record_abi::kCubin, module.function()};
  const record_abi::Command* dependency = previous;  // the batch's launches are independent of each other
  const record_abi::Command* launches[kMaxRecordedCommands];
  JMF_RETURN_IF_ERROR(ForEachElement(buffers, device, [&](uint32_t b, const record_abi::KernelArgs* kernel_args) {
    JMF_RETURN_IF_ERROR(record.CreateLaunch(kernel, record_dims_, config_.sharedMemBytes, spec_.uses_pdl, kernel_args,
                                            dependency, &launches[b], "creating the launch command"));
    if (!record.Push(launches[b])) {
      return ffi::Error(ffi::ErrorCode::kResourceExhausted, who() + ": the record frame has no room for the launch");
    }
    return ffi::Error::Success();
  }));
  if (spec_.batch_size > 1) {
    // The batch elements' launches are independent; later commands wait for all of them.
    const record_abi::Command* join = nullptr;
    JMF_RETURN_IF_ERROR(record.CreateEmpty(launches, spec_.batch_size, &join, "joining the batch's launches"));
    if (!record.Push(join)) {
      return ffi::Error(ffi::ErrorCode::kResourceExhausted, who() + ": the record frame has no room");
    }
  }
  const record_abi::Command* command = launches[0];
  std::unique_ptr<void*[]> addresses(new void*[buffers.count]);  // once per recorded command
  std::copy(buffers.ptrs, buffers.ptrs + buffers.count, addresses.get());
  DeviceSlot& slot = slots_[device];
  std::erase_if(slot.recorded, [&](const auto& entry) { return entry.first == command; });
  slot.recorded.emplace_back(command, std::move(addresses));
  GetCacheStats().records_created += spec_.batch_size;
  return ffi::Error::Success();
}

int CallSite::RecordArgs(const Buffers& buffers, int32_t device, record_abi::KernelArg* args, uint32_t element) const {
  return ForEachParam(
      buffers, device,
      [&](int i, const void* value, size_t size) {
        args[i] = size == 0 ? record_abi::KernelArg{*static_cast<void* const*>(value), 0, record_abi::kDevicePtr}
                            : record_abi::KernelArg{value, static_cast<int64_t>(size), record_abi::kHostValue};
      },
      element);
}

ffi::Error CallSite::UpdateCommands(const RecordFrame& record, int32_t device, const Buffers& buffers) {
  const int64_t first_fill = collective_ != nullptr ? collective_->barrier_commands() : 0;
  const int64_t launch = first_fill + static_cast<int64_t>(spec_.poison_buffers.size() + spec_.zero_buffers.size());
  if (record.num_commands() < launch + spec_.batch_size) [[unlikely]] {
    return ffi::Error::Internal(who() + ": the record frame lost the launch command");
  }
  // XLA asks for an update whenever an allocation the graph uses moved; most
  // of the time this call's own buffers did not, and rewriting the node for
  // nothing costs more than the launch.
  const record_abi::Command* command = record.command(launch);
  void** last = nullptr;
  for (auto& [recorded_command, addresses] : slots_[device].recorded) {
    if (recorded_command == command) last = addresses.get();
  }
  if (last != nullptr && std::equal(buffers.ptrs, buffers.ptrs + buffers.count, last)) return ffi::Error::Success();
  JMF_RETURN_IF_ERROR(ForEachFill(spec_, [&](size_t k, int b, uint32_t word) {
    FillArgs args(buffers, b, word);
    return record.UpdateLaunch(record.command(first_fill + static_cast<int64_t>(k)), &args.kernel_args,
                               "updating the output fills");
  }));
  JMF_RETURN_IF_ERROR(ForEachElement(buffers, device, [&](uint32_t b, const record_abi::KernelArgs* kernel_args) {
    return record.UpdateLaunch(record.command(launch + b), kernel_args, "updating the launch command");
  }));
  if (last != nullptr) std::copy(buffers.ptrs, buffers.ptrs + buffers.count, last);
  return ffi::Error::Success();
}

}  // namespace jmf
