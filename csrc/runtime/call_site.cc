#include "runtime/call_site.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "runtime/collective.h"
#include "runtime/status.h"

namespace jmf {

ffi::TypeId CallSite::id = {};

namespace {

// The attributes of XLA's custom call, for DecodeLaunchAttributes.
class DictionarySource {
 public:
  explicit DictionarySource(const ffi::Dictionary& attrs) : attrs_(attrs) {}

  Lookup Bool(const char* name, bool* out) { return Get(name, out); }
  Lookup Int(const char* name, int64_t* out) {
    int32_t value = 0;
    Lookup found = Get(name, &value);
    if (found == Lookup::kFound) *out = value;
    return found;
  }
  Lookup Ints(const char* name, std::vector<int64_t>* out) {
    ffi::Span<const int32_t> span;
    Lookup found = Get(name, &span);
    if (found == Lookup::kFound) out->assign(span.begin(), span.end());
    return found;
  }
  Lookup Ints64(const char* name, std::vector<int64_t>* out) {
    ffi::Span<const int64_t> span;
    Lookup found = Get(name, &span);
    if (found == Lookup::kFound) out->assign(span.begin(), span.end());
    return found;
  }
  Lookup Bytes(const char* name, std::string* out, size_t limit) {
    std::string_view view;
    Lookup found = Get(name, &view);
    if (found != Lookup::kFound) return found;
    if (view.size() > limit) return Lookup::kWrongType;
    out->assign(view);
    return found;
  }
  template <typename T>
  Lookup Get(const char* name, T* out) {
    if (!attrs_.contains(name)) return Lookup::kMissing;
    auto value = attrs_.get<T>(name);
    if (!value.has_value()) return Lookup::kWrongType;
    *out = *value;
    return Lookup::kFound;
  }

 private:
  const ffi::Dictionary& attrs_;
};

std::string DimsText(unsigned x, unsigned y, unsigned z) {
  std::string text = "(";
  text += std::to_string(x);
  text += ", ";
  text += std::to_string(y);
  text += ", ";
  text += std::to_string(z);
  return text + ")";
}

std::string ListText(const std::vector<size_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace

ffi::Error DeviceOutOfRange(const std::string& who, int32_t device) {
  return ffi::Error::Internal(who + ": device ordinal " + std::to_string(device) + " is outside 0.." +
                              std::to_string(kMaxDevices - 1));
}

bool SynchronizeLaunchesRequested() {
  const char* value = std::getenv("JAX_MOSAIC_FFI_SYNC_LAUNCHES");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

ffi::ErrorOr<std::unique_ptr<CallSite>> CallSite::Create(ffi::Dictionary attrs, bool collective) {
  std::unique_ptr<CallSite> site(new CallSite());
  LaunchAttributes decoded;
  std::string error;
  DictionarySource source(attrs);
  if (!DecodeLaunchAttributes(source, &decoded, &error)) {
    return ffi::Error::InvalidArgument(Who(decoded) + ": " + error);
  }
  if (!ValidateLaunch(decoded, collective, &site->spec_, &error)) {
    return ffi::Error::InvalidArgument(site->spec_.who + ": " + error);
  }
  const LaunchSpec& spec = site->spec_;
  const std::string& who = spec.who;

  std::string_view module;
  if (Lookup found = source.Get("module", &module); found != Lookup::kFound) {
    return ffi::Error::InvalidArgument(who + (found == Lookup::kMissing ? ": the custom call has no 'module' attribute"
                                                                        : ": attribute 'module' is not a string"));
  }
  site->driver_ = GetDriver(&error);
  if (site->driver_ == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, who + ": " + error);
  KernelHash hash;
  std::memcpy(hash.data(), decoded.kernel_hash.data(), hash.size());
  auto kernel = GetOrParseKernel(hash, module);
  if (!kernel.has_value()) {
    return ffi::Error(kernel.error().errc().value_or(ffi::ErrorCode::kInvalidArgument),
                      who + ": " + kernel.error().message());
  }
  site->kernel_ = *kernel;

  site->ConfigureLaunch(collective);
  if (collective) {
    JMF_ASSIGN_OR_RETURN(site->collective_, CollectiveState::Create(*site));
    // Across processes the copies around the launch are stream work that the
    // record API cannot express: XLA captures the stream instead.
    if (site->collective_->cross_process()) site->record_by_capture_ = site->needs_bytes_ = true;
  }
  return site;
}

void CallSite::ConfigureLaunch(bool collective) {
  const LaunchSpec& spec = spec_;
  CUlaunchConfig& c = config_;
  c.gridDimX = spec.grid[0], c.gridDimY = spec.grid[1], c.gridDimZ = spec.grid[2];
  c.blockDimX = spec.block[0], c.blockDimY = spec.block[1], c.blockDimZ = spec.block[2];
  c.sharedMemBytes = spec.smem_bytes;
  int num_attrs = 0;
  if (spec.has_cluster) {
    CUlaunchAttribute& a = launch_attrs_[num_attrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim.x = spec.cluster[0], a.value.clusterDim.y = spec.cluster[1],
    a.value.clusterDim.z = spec.cluster[2];
  }
  if (spec.uses_pdl) {
    CUlaunchAttribute& a = launch_attrs_[num_attrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    a.value.programmaticStreamSerializationAllowed = 1;
  }
  c.attrs = num_attrs ? launch_attrs_ : nullptr;
  c.numAttrs = num_attrs;
  auto dim = [](uint32_t v) { return static_cast<int32_t>(v); };  // bounded by the contract
  record_dims_ = XLA_FFI_LaunchDims{{dim(spec.grid[0]), dim(spec.grid[1]), dim(spec.grid[2])},
                                    {dim(spec.block[0]), dim(spec.block[1]), dim(spec.block[2])},
                                    spec.has_cluster
                                        ? XLA_FFI_Dim3{dim(spec.cluster[0]), dim(spec.cluster[1]), dim(spec.cluster[2])}
                                        : XLA_FFI_Dim3{0, 0, 0}};
  synchronize_launches_ = SynchronizeLaunchesRequested();
  // XLA loads its own copy of the module for a recorded launch and cannot be
  // told to allow non-portable clusters on it; a synchronizing debug launch
  // cannot sit in a graph; and one record call holds at most 16 commands.
  // Such call sites let XLA capture the stream launch instead.
  const int64_t commands = (collective ? 1 : 0) + static_cast<int64_t>(spec.poison_buffers.size()) +
                           static_cast<int64_t>(spec.zero_buffers.size()) + spec.batch_size +
                           (spec.batch_size > 1 ? 1 : 0);
  needs_bytes_ = !spec.poison_buffers.empty() || !spec.zero_buffers.empty() || !spec.tensor_maps.empty();
  record_by_capture_ = spec.non_portable_cluster || synchronize_launches_ || commands > kMaxRecordedCommands;
}

CallSite::~CallSite() = default;

void* const* CallSite::MetadataSlot(int32_t device) const { return collective_->metadata_slot(device); }

ffi::Error CallSite::GatherBuffers(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets, Buffers* out) const {
  if (args.size() != static_cast<size_t>(spec_.num_inputs) ||
      args.size() + rets.size() != static_cast<size_t>(spec_.num_buffers)) [[unlikely]] {
    return ffi::Error::InvalidArgument(who() + ": called with " + std::to_string(args.size()) + " inputs and " +
                                       std::to_string(rets.size()) + " outputs, but lowered for " +
                                       std::to_string(spec_.num_inputs) + " and " +
                                       std::to_string(spec_.num_buffers - spec_.num_inputs));
  }
  uintptr_t misaligned = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) [[unlikely]] {
      return ffi::Error::InvalidArgument(who() + ": input " + std::to_string(i) + " is not a buffer");
    }
    out->ptrs[i] = buffer->untyped_data();
    if (needs_bytes_) [[unlikely]]
      out->bytes[i] = buffer->size_bytes();
    misaligned |= reinterpret_cast<uintptr_t>(out->ptrs[i]);
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) [[unlikely]] {
      return ffi::Error::InvalidArgument(who() + ": output " + std::to_string(i) + " is not a buffer");
    }
    out->ptrs[args.size() + i] = (*buffer)->untyped_data();
    if (needs_bytes_) [[unlikely]]
      out->bytes[args.size() + i] = (*buffer)->size_bytes();
    misaligned |= reinterpret_cast<uintptr_t>(out->ptrs[args.size() + i]);
  }
  out->count = spec_.num_buffers;
  if (misaligned % kBufferAlignment != 0) [[unlikely]] {
    for (int i = 0; i < out->count; ++i) {
      if (reinterpret_cast<uintptr_t>(out->ptrs[i]) % kBufferAlignment == 0) continue;
      const bool input = i < spec_.num_inputs;
      return ffi::Error::InvalidArgument(who() + ": " + (input ? "input " : "output ") +
                                         std::to_string(input ? i : i - spec_.num_inputs) + " is at address " +
                                         std::to_string(reinterpret_cast<uintptr_t>(out->ptrs[i])) + ", which is not " +
                                         std::to_string(kBufferAlignment) +
                                         "-byte aligned. Kernels may assume aligned buffers; pass a whole array, not a "
                                         "view into one (for instance copy it with jnp.copy)");
    }
  }
  return ffi::Error::Success();
}

ffi::Error CallSite::CheckFits(const LoadedModule& module, int32_t device) const {
  const std::vector<size_t>& actual = module.param_sizes();
  if (!actual.empty() && actual != spec_.param_sizes) {
    return ffi::Error::InvalidArgument(
        who() + ": the kernel takes " + std::to_string(actual.size()) + " parameters of " + ListText(actual) +
        " bytes, but the call passes " + std::to_string(spec_.param_sizes.size()) + " of " +
        ListText(spec_.param_sizes) +
        " bytes (inputs, outputs, scalars in param_order). Fix the kernel's signature or the call");
  }
  const int threads = static_cast<int>(config_.blockDimX * config_.blockDimY * config_.blockDimZ);
  if (module.max_threads_per_block() > 0 && threads > module.max_threads_per_block()) {
    return ffi::Error::InvalidArgument(
        who() + ": block " + DimsText(config_.blockDimX, config_.blockDimY, config_.blockDimZ) + " has " +
        std::to_string(threads) + " threads, but this kernel (" + std::to_string(module.num_registers()) +
        " registers per thread) can run at most " + std::to_string(module.max_threads_per_block()) +
        " per block on device " + std::to_string(device) + "; use a smaller block");
  }
  const int64_t total_smem = int64_t{module.static_smem_bytes()} + config_.sharedMemBytes;
  if (module.max_dynamic_smem_optin() > 0 && total_smem > module.max_dynamic_smem_optin()) {
    return ffi::Error::InvalidArgument(
        who() + ": the kernel needs " + std::to_string(config_.sharedMemBytes) + " bytes of dynamic plus " +
        std::to_string(module.static_smem_bytes()) + " bytes of static shared memory, over the " +
        std::to_string(module.max_dynamic_smem_optin()) + " bytes a block may have on device " +
        std::to_string(device) + "; lower smem_bytes");
  }
  return ffi::Error::Success();
}

ffi::Error CallSite::Prepare(int32_t device, CUcontext context) {
  if (device < 0 || device >= kMaxDevices) return DeviceOutOfRange(who(), device);
  DeviceSlot& slot = slots_[device];
  if (slot.ready.load(std::memory_order_acquire) != nullptr) return ffi::Error::Success();
  std::lock_guard<std::mutex> lock(mutex_);
  if (slot.ready.load(std::memory_order_relaxed) != nullptr) return ffi::Error::Success();
  auto loaded = LoadedModule::GetOrLoad(*driver_, kernel_, context);
  if (!loaded.has_value()) {
    return ffi::Error(loaded.error().errc().value_or(ffi::ErrorCode::kInternal),
                      who() + " on device " + std::to_string(device) + ": " + loaded.error().message());
  }
  JMF_RETURN_IF_ERROR(CheckFits(**loaded, device));
  JMF_RETURN_IF_ERROR(
      (*loaded)->Configure(static_cast<int>(config_.sharedMemBytes), spec_.non_portable_cluster, who()));
  slot.module = std::move(*loaded);
  if (!spec_.tensor_maps.empty() && slot.tensor_maps == nullptr) {
    slot.tensor_maps.reset(new EncodedTensorMap[spec_.tensor_maps.size()]);
  }
  slot.ready.store(slot.module.get(), std::memory_order_release);
  return ffi::Error::Success();
}

ffi::Error CallSite::PrepareForStream(int32_t device, CUstream stream) {
  CUcontext context = nullptr;
  JMF_RETURN_IF_ERROR(CudaCheck(*driver_, driver_->cuStreamGetCtx(stream, &context), who(), "cuStreamGetCtx"));
  return Prepare(device, context);
}

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
  if (!spec_.tensor_maps.empty()) JMF_RETURN_IF_ERROR(EncodeTensorMaps(buffers, device));
  void* params[kMaxParams];
  ForEachParam(buffers, device, [&](int i, const void* value, size_t) { params[i] = const_cast<void*>(value); });
  CUresult result = LaunchOnce(stream, *module, params);
  // vmap: the same launch once per batch element, each with its buffers moved
  // on; the parameters point into `buffers`, so moving them moves the launch.
  for (uint32_t b = 1; b < spec_.batch_size && result == CUDA_SUCCESS; ++b) {
    MoveToNextElement(buffers);
    result = LaunchOnce(stream, *module, params);
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

std::string CallSite::LaunchDescription() const {
  std::string cluster = "none";
  if (spec_.has_cluster) cluster = DimsText(spec_.cluster[0], spec_.cluster[1], spec_.cluster[2]);
  return "grid " + DimsText(config_.gridDimX, config_.gridDimY, config_.gridDimZ) + ", block " +
         DimsText(config_.blockDimX, config_.blockDimY, config_.blockDimZ) + ", smem " +
         std::to_string(config_.sharedMemBytes) + " bytes, cluster " + cluster;
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
  return ffi::Error::Internal(message);
}

}  // namespace jmf
