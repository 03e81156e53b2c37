// The call site, instantiate and prepare: the state built from the
// attributes (decoded and validated by the contract), the kernel loaded and
// checked on each device, a call's buffers gathered. Its tensor maps are
// encoded in call_site_tensor_maps.cc; execute and record are in
// call_site_launch.cc.
#include "runtime/call_site.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "ffi/status.h"
#include "peers/nvshmem_runtime.h"

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

ffi::ErrorOr<std::unique_ptr<CallSite>> CallSite::Create(ffi::Dictionary attrs, bool collective,
                                                         bool programs_allowed) {
  std::unique_ptr<CallSite> site(new CallSite());
  LaunchAttributes decoded;
  std::string error;
  DictionarySource source(attrs);
  if (!DecodeLaunchAttributes(source, &decoded, &error)) {
    return ffi::Error::InvalidArgument(Who(decoded) + ": " + error);
  }
  if (!programs_allowed && !decoded.launch_programs.empty()) {
    // An older runtime ignores launch_programs and would launch the placeholders: such calls use the v2 target.
    return ffi::Error::InvalidArgument(Who(decoded) +
                                       ": launch_programs needs a contract v2 target (jax_mosaic_ffi_launch_v2); this "
                                       "call's target is of contract v1. Lower it again with this jax_mosaic_ffi");
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
  const bool kernel_uses_nvshmem = (site->kernel_->module.flags & kFlagNvshmem) != 0;
  if (kernel_uses_nvshmem && !spec.nvshmem) {
    return ffi::Error::InvalidArgument(
        who +
        ": the kernel uses NVSHMEM, so only an NVSHMEM collective call can launch it; call it with "
        "mosaic_kernel(..., collective=jmf.Collective(axis, transport=\"nvshmem\")) inside shard_map");
  }

  if (site->kernel_->module.cute != spec.host_launch) {
    return ffi::Error::InvalidArgument(
        who + (spec.host_launch ? ": host_args is for a module of CuTe DSL objects; this module holds " +
                                      DescribeImages(site->kernel_->module)
                                : ": the module holds CuTe DSL objects, which only the CuTe target (with host_args) "
                                  "launches; lower the call again with this jax_mosaic_ffi"));
  }
  site->ConfigureLaunch(collective);
  if (spec.host_launch) JMF_RETURN_IF_ERROR(site->CreateHostModule());
  if (spec.nvshmem) {
    // The copies through the symmetric heap are stream work the record API
    // cannot express, and XLA's own copy of a recorded module would not be
    // registered with NVSHMEM: XLA captures the stream instead.
    site->record_by_capture_ = site->needs_bytes_ = true;
    NvshmemStagingInputs inputs{.driver = site->driver_,
                                .who = spec.who,
                                .num_inputs = spec.num_inputs,
                                .symmetric = spec.nvshmem_symmetric,
                                .filled_outputs = spec.zero_buffers};
    inputs.filled_outputs.insert(inputs.filled_outputs.end(), spec.poison_buffers.begin(), spec.poison_buffers.end());
    site->nvshmem_ = std::make_unique<NvshmemStaging>(std::move(inputs));
  }
  if (collective) {
    CollectiveInputs inputs{.driver = site->driver_,
                            .who = spec.who,
                            .num_inputs = spec.num_inputs,
                            .num_buffers = spec.num_buffers,
                            .cliques = spec.cliques,
                            .symmetric = spec.symmetric,
                            .skip_device_barrier = spec.skip_device_barrier};
    JMF_ASSIGN_OR_RETURN(site->collective_, CollectiveState::Create(std::move(inputs)));
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
  if (spec.nvshmem) {  // nvshmemx_collective_launch's semantics: every block resident at once, for device-side sync
    CUlaunchAttribute& a = launch_attrs_[num_attrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    a.value.cooperative = 1;
  }
  c.attrs = num_attrs ? launch_attrs_ : nullptr;
  c.numAttrs = num_attrs;
  auto dim = [](uint32_t v) { return static_cast<int32_t>(v); };  // bounded by the contract
  record_dims_ = record_abi::LaunchDims{
      {dim(spec.grid[0]), dim(spec.grid[1]), dim(spec.grid[2])},
      {dim(spec.block[0]), dim(spec.block[1]), dim(spec.block[2])},
      spec.has_cluster ? record_abi::Dim3{dim(spec.cluster[0]), dim(spec.cluster[1]), dim(spec.cluster[2])}
                       : record_abi::Dim3{0, 0, 0}};
  synchronize_launches_ = SynchronizeLaunchesRequested();
  // XLA loads its own copy of the module for a recorded launch and cannot be
  // told to allow non-portable clusters on it; a synchronizing debug launch
  // cannot sit in a graph; and one record call holds at most 16 commands.
  // Such call sites let XLA capture the stream launch instead. So do those
  // with some dynamic shared memory, but no more than the 48 KiB every kernel
  // may take: XLA marks its copy of a kernel recorded with any dynamic shared
  // memory CU_FUNC_CACHE_PREFER_SHARED, which leaves it a small L1 (measured
  // on an H200: a Triton layer norm ran 13-25% slower as a recorded node).
  // Triton's launcher sets that preference only past 48 KiB; ours never does.
  const int64_t commands = (collective ? 1 : 0) + static_cast<int64_t>(spec.poison_buffers.size()) +
                           static_cast<int64_t>(spec.zero_buffers.size()) + spec.batch_size +
                           (spec.batch_size > 1 ? 1 : 0);
  needs_bytes_ = !spec.poison_buffers.empty() || !spec.zero_buffers.empty() || !spec.tensor_maps.empty();
  const bool xla_would_prefer_shared =
      spec.smem_bytes > 0 && spec.smem_bytes <= static_cast<uint32_t>(kDefaultDynamicSmemBytes);
  record_by_capture_ =
      spec.non_portable_cluster || synchronize_launches_ || commands > kMaxRecordedCommands || xla_would_prefer_shared;
}

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
    if (spec_.host_launch) {
      out->dims[i] = buffer->dimensions().begin();
      out->ranks[i] = static_cast<int64_t>(buffer->dimensions().size());
    }
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
    if (spec_.host_launch) {
      out->dims[args.size() + i] = (*buffer)->dimensions().begin();
      out->ranks[args.size() + i] = static_cast<int64_t>((*buffer)->dimensions().size());
    }
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
  if (spec_.nvshmem) JMF_RETURN_IF_ERROR(EnsureNvshmemStarted(device, who()));
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
    slot.tensor_maps.reset(new EncodedTensorMap[spec_.tensor_maps.size() * spec_.batch_size]);
  }
  slot.ready.store(slot.module.get(), std::memory_order_release);
  return ffi::Error::Success();
}

ffi::Error CallSite::PrepareForStream(int32_t device, CUstream stream) {
  CUcontext context = nullptr;
  JMF_RETURN_IF_ERROR(CudaCheck(*driver_, driver_->cuStreamGetCtx(stream, &context), who(), "cuStreamGetCtx"));
  return Prepare(device, context);
}

ffi::Error CallSite::LoadForRecord(int32_t device) {
  if (slots_[device].ready.load(std::memory_order_acquire) != nullptr) return ffi::Error::Success();
  // Load our own copy too: it checks the kernel against this call site and
  // picks the image for this GPU. XLA loads the image it is given itself.
  CUcontext context = nullptr;
  driver_->cuCtxGetCurrent(&context);
  if (context == nullptr) {
    CUdevice cu_device;
    if (driver_->cuDeviceGet(&cu_device, device) != CUDA_SUCCESS ||
        driver_->cuDevicePrimaryCtxRetain(&context, cu_device) != CUDA_SUCCESS) {
      return ffi::Error::Internal(who() + ": no CUDA context for device " + std::to_string(device) +
                                  " while recording");
    }
  }
  return Prepare(device, context);
}

std::string CallSite::LaunchDescription() const {
  std::string cluster = "none";
  if (spec_.has_cluster) cluster = DimsText(spec_.cluster[0], spec_.cluster[1], spec_.cluster[2]);
  return "grid " + DimsText(config_.gridDimX, config_.gridDimY, config_.gridDimZ) + ", block " +
         DimsText(config_.blockDimX, config_.blockDimY, config_.blockDimZ) + ", smem " +
         std::to_string(config_.sharedMemBytes) + " bytes, cluster " + cluster;
}

}  // namespace jmf
