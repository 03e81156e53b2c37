#include "call_site.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "collective.h"

namespace jmf {

ffi::TypeId CallSite::id = {};

namespace {

template <typename T>
ffi::ErrorOr<T> Required(const ffi::Dictionary& attrs, const char* name, const std::string& who) {
  if (!attrs.contains(name)) {
    return ffi::Error::InvalidArgument(who + ": the custom call has no '" + name +
                                       "' attribute; it was not lowered by jax_mosaic_ffi's mosaic_kernel");
  }
  auto value = attrs.get<T>(name);
  if (!value.has_value()) {
    return ffi::Error::InvalidArgument(who + ": attribute '" + name + "' has the wrong type: " +
                                       value.error().message());
  }
  return *value;
}

template <typename T>
ffi::ErrorOr<T> Optional(const ffi::Dictionary& attrs, const char* name, T fallback, const std::string& who) {
  if (!attrs.contains(name)) return fallback;
  return Required<T>(attrs, name, who);
}

ffi::ErrorOr<std::array<uint32_t, 3>> Dims(const ffi::Dictionary& attrs, const char* name,
                                           const std::string& who) {
  auto span = Required<ffi::Span<const int32_t>>(attrs, name, who);
  if (!span.has_value()) return span.error();
  if (span->size() != 3) {
    return ffi::Error::InvalidArgument(who + ": attribute '" + name + "' must hold 3 values");
  }
  std::array<uint32_t, 3> dims;
  for (int i = 0; i < 3; ++i) {
    if ((*span)[i] < 1) {
      return ffi::Error::InvalidArgument(who + ": " + name + "[" + std::to_string(i) + "] = " +
                                         std::to_string((*span)[i]) + " must be at least 1");
    }
    dims[i] = static_cast<uint32_t>((*span)[i]);
  }
  return dims;
}

std::string DimsText(const unsigned int (&d)[3]) {
  return "(" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) + ")";
}

std::string ListText(const std::vector<size_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace

#define JMF_ASSIGN_OR_RETURN(lhs, expr) \
  auto lhs##_or = (expr);               \
  if (!lhs##_or.has_value()) return lhs##_or.error(); \
  auto lhs = std::move(*lhs##_or)

ffi::ErrorOr<std::unique_ptr<CallSite>> CallSite::Create(ffi::Dictionary attrs, bool collective) {
  std::unique_ptr<CallSite> site(new CallSite());
  std::string kernel_name(Optional<std::string_view>(attrs, "kernel_name", "<unnamed>", "mosaic_kernel").value());
  std::string call_site(Optional<std::string_view>(attrs, "call_site", "<unknown call site>", "mosaic_kernel").value());
  site->who_ = "mosaic_kernel '" + kernel_name + "' at " + call_site;
  const std::string& who = site->who_;

  JMF_ASSIGN_OR_RETURN(use_custom_barrier, Optional<bool>(attrs, "use_custom_barrier", false, who));
  if (use_custom_barrier) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      who + ": use_custom_barrier=true is not supported on GPUs");
  }
  JMF_ASSIGN_OR_RETURN(hash_bytes, Required<std::string_view>(attrs, "kernel_hash", who));
  if (hash_bytes.size() != 32) {
    return ffi::Error::InvalidArgument(who + ": kernel_hash is " + std::to_string(hash_bytes.size()) +
                                       " bytes; it must be the 32-byte sha256 of the module");
  }
  JMF_ASSIGN_OR_RETURN(module, Required<std::string_view>(attrs, "module", who));
  JMF_ASSIGN_OR_RETURN(uses_metadata, Optional<bool>(attrs, "uses_xla_collective_metadata", false, who));
  if (uses_metadata != collective) {
    return ffi::Error::InvalidArgument(
        who + ": uses_xla_collective_metadata=" + (uses_metadata ? "true" : "false") +
        " does not match the custom call target; lower it again with this jax_mosaic_ffi");
  }

  std::string driver_error;
  site->driver_ = GetDriver(&driver_error);
  if (site->driver_ == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, who + ": " + driver_error);
  }

  KernelHash hash;
  std::memcpy(hash.data(), hash_bytes.data(), hash.size());
  auto kernel = GetOrBuildKernel(hash, module);
  if (!kernel.has_value()) {
    return ffi::Error(kernel.error().errc().value_or(ffi::ErrorCode::kInvalidArgument),
                      who + ": " + kernel.error().message());
  }
  site->kernel_ = *kernel;

  JMF_ASSIGN_OR_RETURN(grid, Dims(attrs, "grid", who));
  JMF_ASSIGN_OR_RETURN(block, Dims(attrs, "block", who));
  JMF_ASSIGN_OR_RETURN(cluster, Dims(attrs, "cluster", who));
  JMF_ASSIGN_OR_RETURN(smem, Optional<int32_t>(attrs, "smem_bytes", 0, who));
  JMF_ASSIGN_OR_RETURN(uses_pdl, Optional<bool>(attrs, "uses_pdl", false, who));
  JMF_ASSIGN_OR_RETURN(num_inputs, Required<int32_t>(attrs, "num_inputs", who));
  JMF_ASSIGN_OR_RETURN(order, Required<ffi::Span<const int32_t>>(attrs, "param_order", who));
  if (smem < 0) return ffi::Error::InvalidArgument(who + ": smem_bytes is negative");
  if (uint64_t threads = uint64_t{block[0]} * block[1] * block[2]; threads > 1024) {
    return ffi::Error::InvalidArgument(who + ": a block of " + std::to_string(threads) +
                                       " threads is over the limit of 1024");
  }

  std::string_view scalar_data;
  std::vector<int32_t> scalar_sizes;
  if (attrs.contains("scalar_sizes")) {
    JMF_ASSIGN_OR_RETURN(sizes, Required<ffi::Span<const int32_t>>(attrs, "scalar_sizes", who));
    scalar_sizes.assign(sizes.begin(), sizes.end());
    JMF_ASSIGN_OR_RETURN(data, Required<std::string_view>(attrs, "scalar_data", who));
    scalar_data = data;
  }
  if (scalar_data.size() != 8 * scalar_sizes.size()) {
    return ffi::Error::InvalidArgument(who + ": scalar_data must hold 8 bytes per scalar");
  }
  site->scalars_.resize(scalar_sizes.size());
  if (!scalar_data.empty()) std::memcpy(site->scalars_.data(), scalar_data.data(), scalar_data.size());
  site->scalar_sizes_ = scalar_sizes;

  int num_buffers = 0;
  std::vector<bool> seen_scalar(scalar_sizes.size(), false);
  for (int32_t code : order) {
    if (code >= 0) {
      num_buffers = std::max(num_buffers, code + 1);
      site->expected_param_sizes_.push_back(8);
    } else {
      size_t k = static_cast<size_t>(-code - 1);
      if (k >= scalar_sizes.size() || seen_scalar[k]) {
        return ffi::Error::InvalidArgument(who + ": param_order names scalar " + std::to_string(k) +
                                           " which is missing or repeated");
      }
      seen_scalar[k] = true;
      if (scalar_sizes[k] < 1 || scalar_sizes[k] > 8) {
        return ffi::Error::InvalidArgument(who + ": scalar sizes must be 1 to 8 bytes");
      }
      site->expected_param_sizes_.push_back(static_cast<size_t>(scalar_sizes[k]));
    }
    site->param_order_.push_back(code);
  }
  if (num_inputs < 0 || num_inputs > num_buffers) {
    return ffi::Error::InvalidArgument(who + ": num_inputs is out of range");
  }
  if (static_cast<int>(site->param_order_.size()) + (collective ? 1 : 0) > kMaxParams) {
    return ffi::Error::InvalidArgument(who + ": more than " + std::to_string(kMaxParams) + " kernel parameters");
  }
  site->num_inputs_ = num_inputs;
  site->num_buffers_ = num_buffers;
  if (collective) site->expected_param_sizes_.push_back(8);
  if (attrs.contains("poison_outputs")) {
    JMF_ASSIGN_OR_RETURN(poison, Required<ffi::Span<const int32_t>>(attrs, "poison_outputs", who));
    for (int32_t output : poison) {
      if (output < 0 || num_inputs + output >= num_buffers) {
        return ffi::Error::InvalidArgument(who + ": poison_outputs names output " + std::to_string(output));
      }
      site->poison_buffers_.push_back(num_inputs + output);
    }
  }

  CUlaunchConfig& c = site->config_;
  c.gridDimX = grid[0], c.gridDimY = grid[1], c.gridDimZ = grid[2];
  c.blockDimX = block[0], c.blockDimY = block[1], c.blockDimZ = block[2];
  c.sharedMemBytes = static_cast<unsigned>(smem);
  int num_attrs = 0;
  if (cluster[0] * cluster[1] * cluster[2] > 1) {
    for (int i = 0; i < 3; ++i) {
      if (grid[i] % cluster[i] != 0) {
        return ffi::Error::InvalidArgument(who + ": grid[" + std::to_string(i) + "] is not a multiple of cluster[" +
                                           std::to_string(i) + "]");
      }
    }
    site->launch_attrs_[num_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    site->launch_attrs_[num_attrs].value.clusterDim.x = cluster[0];
    site->launch_attrs_[num_attrs].value.clusterDim.y = cluster[1];
    site->launch_attrs_[num_attrs].value.clusterDim.z = cluster[2];
    ++num_attrs;
  }
  if (uses_pdl) {
    site->launch_attrs_[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    site->launch_attrs_[num_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  site->uses_pdl_ = uses_pdl;
  // XLA loads its own copy of the module for a recorded launch and cannot be
  // told to allow non-portable clusters on it, and the record API has no
  // memset for poisoning: such call sites let XLA capture the stream launch.
  site->non_portable_cluster_ = cluster[0] * cluster[1] * cluster[2] > 8;
  site->record_by_capture_ = site->non_portable_cluster_ || !site->poison_buffers_.empty();
  c.attrs = num_attrs ? site->launch_attrs_ : nullptr;
  c.numAttrs = num_attrs;
  const bool has_cluster = cluster[0] * cluster[1] * cluster[2] > 1;
  site->record_dims_ = XLA_FFI_LaunchDims{
      {static_cast<int32_t>(grid[0]), static_cast<int32_t>(grid[1]), static_cast<int32_t>(grid[2])},
      {static_cast<int32_t>(block[0]), static_cast<int32_t>(block[1]), static_cast<int32_t>(block[2])},
      {has_cluster ? static_cast<int32_t>(cluster[0]) : 0, has_cluster ? static_cast<int32_t>(cluster[1]) : 0,
       has_cluster ? static_cast<int32_t>(cluster[2]) : 0}};

  if (collective) {
    auto state = CollectiveState::Create(attrs, *site);
    if (!state.has_value()) return state.error();
    site->collective_ = std::move(*state);
  }
  return site;
}

CallSite::~CallSite() = default;

ffi::Error CallSite::DeviceOutOfRange(int32_t device) const {
  return ffi::Error::Internal(who_ + ": device ordinal " + std::to_string(device) + " is outside 0.." +
                              std::to_string(kMaxDevices - 1));
}

ffi::Error CallSite::GatherBuffers(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets,
                                   Buffers* out) const {
  const int n = static_cast<int>(args.size() + rets.size());
  if (n != num_buffers_ || static_cast<int>(args.size()) != num_inputs_) {
    return ffi::Error::InvalidArgument(who_ + ": called with " + std::to_string(args.size()) + " inputs and " +
                                       std::to_string(rets.size()) + " outputs, but lowered for " +
                                       std::to_string(num_inputs_) + " and " +
                                       std::to_string(num_buffers_ - num_inputs_));
  }
  uintptr_t misaligned = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) return ffi::Error::InvalidArgument(who_ + ": input " + std::to_string(i) + " is not a buffer");
    out->ptrs[i] = buffer->untyped_data();
    misaligned |= reinterpret_cast<uintptr_t>(out->ptrs[i]);
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) return ffi::Error::InvalidArgument(who_ + ": output " + std::to_string(i) + " is not a buffer");
    out->ptrs[args.size() + i] = (*buffer)->untyped_data();
    if (!poison_buffers_.empty()) [[unlikely]] out->bytes[args.size() + i] = (*buffer)->size_bytes();
    misaligned |= reinterpret_cast<uintptr_t>(out->ptrs[args.size() + i]);
  }
  out->count = n;
  if (misaligned % kBufferAlignment != 0) [[unlikely]] {
    for (int i = 0; i < n; ++i) {
      if (reinterpret_cast<uintptr_t>(out->ptrs[i]) % kBufferAlignment != 0) {
        const bool input = i < num_inputs_;
        return ffi::Error::InvalidArgument(
            who_ + ": " + (input ? "input " : "output ") + std::to_string(input ? i : i - num_inputs_) +
            " is at address " + std::to_string(reinterpret_cast<uintptr_t>(out->ptrs[i])) +
            ", which is not " + std::to_string(kBufferAlignment) +
            "-byte aligned. Kernels may assume aligned buffers; pass a whole array, not a "
            "view into one (for instance copy it with jnp.copy)");
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error CallSite::CheckFits(const LoadedModule& module, int32_t device) const {
  const std::vector<size_t>& actual = module.param_sizes();
  if (!actual.empty() && actual != expected_param_sizes_) {
    return ffi::Error::InvalidArgument(
        who_ + ": the kernel takes " + std::to_string(actual.size()) + " parameters of " + ListText(actual) +
        " bytes, but the call passes " + std::to_string(expected_param_sizes_.size()) + " of " +
        ListText(expected_param_sizes_) +
        " bytes (inputs, outputs, scalars in param_order). Fix the kernel's signature or the call");
  }
  const int threads = static_cast<int>(config_.blockDimX * config_.blockDimY * config_.blockDimZ);
  if (module.max_threads_per_block() > 0 && threads > module.max_threads_per_block()) {
    return ffi::Error::InvalidArgument(
        who_ + ": block " + DimsText({config_.blockDimX, config_.blockDimY, config_.blockDimZ}) + " has " +
        std::to_string(threads) + " threads, but this kernel (" + std::to_string(module.num_registers()) +
        " registers per thread) can run at most " + std::to_string(module.max_threads_per_block()) +
        " per block on device " + std::to_string(device) + "; use a smaller block");
  }
  const int total_smem = module.static_smem_bytes() + static_cast<int>(config_.sharedMemBytes);
  if (module.max_dynamic_smem_optin() > 0 && total_smem > module.max_dynamic_smem_optin()) {
    return ffi::Error::InvalidArgument(
        who_ + ": the kernel needs " + std::to_string(config_.sharedMemBytes) + " bytes of dynamic plus " +
        std::to_string(module.static_smem_bytes()) + " bytes of static shared memory, over the " +
        std::to_string(module.max_dynamic_smem_optin()) + " bytes a block may have on device " +
        std::to_string(device) + "; lower smem_bytes");
  }
  return ffi::Error::Success();
}

ffi::Error CallSite::Prepare(int32_t device, CUcontext context) {
  if (device < 0 || device >= kMaxDevices) return DeviceOutOfRange(device);
  DeviceSlot& slot = slots_[device];
  if (slot.ready.load(std::memory_order_acquire) != nullptr) return ffi::Error::Success();
  std::lock_guard<std::mutex> lock(mutex_);
  if (slot.ready.load(std::memory_order_relaxed) != nullptr) return ffi::Error::Success();
  auto loaded = LoadedModule::GetOrLoad(*driver_, kernel_, context);
  if (!loaded.has_value()) {
    return ffi::Error(loaded.error().errc().value_or(ffi::ErrorCode::kInternal),
                      who_ + " on device " + std::to_string(device) + ": " + loaded.error().message());
  }
  if (ffi::Error e = CheckFits(**loaded, device); e.failure()) return e;
  if (ffi::Error e = (*loaded)->Configure(static_cast<int>(config_.sharedMemBytes), non_portable_cluster_, who_);
      e.failure()) {
    return e;
  }
  slot.module = std::move(*loaded);
  slot.ready.store(slot.module.get(), std::memory_order_release);
  return ffi::Error::Success();
}

ffi::Error CallSite::PrepareForStream(int32_t device, CUstream stream) {
  CUcontext context = nullptr;
  if (CUresult r = driver_->cuStreamGetCtx(stream, &context); r != CUDA_SUCCESS) {
    return ffi::Error::Internal(who_ + ": cuStreamGetCtx: " + CudaErrorText(*driver_, r));
  }
  return Prepare(device, context);
}

int CallSite::BuildParams(Buffers& buffers, void** params) const {
  int n = 0;
  for (int32_t code : param_order_) {
    params[n++] = code >= 0 ? static_cast<void*>(&buffers.ptrs[code])
                            : const_cast<uint64_t*>(&scalars_[static_cast<size_t>(-code - 1)]);
  }
  return n;
}

ffi::Error CallSite::Launch(CUstream stream, int32_t device, Buffers& buffers) {
  if (device < 0 || device >= kMaxDevices) [[unlikely]] return DeviceOutOfRange(device);
  LoadedModule* module = slots_[device].ready.load(std::memory_order_acquire);
  if (module == nullptr) [[unlikely]] {
    if (ffi::Error e = PrepareForStream(device, stream); e.failure()) return e;
    module = slots_[device].ready.load(std::memory_order_acquire);
  }
  if (!poison_buffers_.empty()) [[unlikely]] {
    if (ffi::Error e = Poison(stream, buffers); e.failure()) return e;
  }
  void* params[kMaxParams + 1];
  int n = BuildParams(buffers, params);
  if (collective_ != nullptr) {
    buffers.ptrs[buffers.count] = collective_->metadata(device);
    params[n++] = &buffers.ptrs[buffers.count];
  }
  CUresult result;
  if (config_.numAttrs == 0) {
    result = driver_->cuLaunchKernel(module->function(), config_.gridDimX, config_.gridDimY, config_.gridDimZ,
                                     config_.blockDimX, config_.blockDimY, config_.blockDimZ,
                                     config_.sharedMemBytes, stream, params, nullptr);
  } else {
    CUlaunchConfig config = config_;
    config.hStream = stream;
    result = driver_->cuLaunchKernelEx(&config, module->function(), params, nullptr);
  }
  if (result != CUDA_SUCCESS) [[unlikely]] return LaunchError(result, device, *module);
  return ffi::Error::Success();
}

ffi::Error CallSite::Poison(CUstream stream, const Buffers& buffers) const {
  for (int32_t b : poison_buffers_) {
    if (buffers.bytes[b] == 0) continue;
    if (CUresult r = driver_->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(buffers.ptrs[b]), 0xFF, buffers.bytes[b],
                                              stream);
        r != CUDA_SUCCESS) {
      return ffi::Error::Internal(who_ + ": poisoning output buffers: " + CudaErrorText(*driver_, r));
    }
  }
  return ffi::Error::Success();
}

ffi::Error CallSite::LaunchError(CUresult result, int32_t device, const LoadedModule& module) const {
  std::string cluster = "none";
  if (config_.numAttrs > 0 && launch_attrs_[0].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
    const auto& d = launch_attrs_[0].value.clusterDim;
    cluster = DimsText({d.x, d.y, d.z});
  }
  std::string message = who_ + ": launch failed on device " + std::to_string(device) + " (grid " +
                        DimsText({config_.gridDimX, config_.gridDimY, config_.gridDimZ}) + ", block " +
                        DimsText({config_.blockDimX, config_.blockDimY, config_.blockDimZ}) + ", smem " +
                        std::to_string(config_.sharedMemBytes) + " bytes, cluster " + cluster +
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

ffi::Error CallSite::Record(const RecordFrame& record, int32_t device, Buffers& buffers) {
  if (device < 0 || device >= kMaxDevices) [[unlikely]] return DeviceOutOfRange(device);
  XLA_FFI_KernelArg args[kMaxParams + 1];
  int n = 0;
  for (int32_t code : param_order_) {
    if (code >= 0) {
      args[n++] = XLA_FFI_KernelArg{buffers.ptrs[code], 0, XLA_FFI_KernelArgType_DevicePtr};
    } else {
      size_t k = static_cast<size_t>(-code - 1);
      args[n++] = XLA_FFI_KernelArg{&scalars_[k], scalar_sizes_[k], XLA_FFI_KernelArgType_HostValue};
    }
  }
  if (collective_ != nullptr) {
    args[n++] = XLA_FFI_KernelArg{collective_->metadata(device), 0, XLA_FFI_KernelArgType_DevicePtr};
  }
  XLA_FFI_KernelArgs kernel_args{args, n};
  const int64_t launch_command = collective_ != nullptr ? collective_->barrier_commands() : 0;
  DeviceSlot& slot = slots_[device];
  if (!record.creating()) {
    if (record.num_commands() <= launch_command) [[unlikely]] {
      return ffi::Error::Internal(who_ + ": the record frame lost the launch command");
    }
    // XLA asks for an update on every execution; most reuse the same buffers,
    // and rewriting the graph node for nothing costs more than the launch.
    const XLA_FFI_Command* command = record.command(launch_command);
    void** last = nullptr;
    for (auto& [recorded_command, addresses] : slot.recorded) {
      if (recorded_command == command) last = addresses.get();
    }
    if (last != nullptr && std::equal(buffers.ptrs, buffers.ptrs + buffers.count, last)) {
      return ffi::Error::Success();
    }
    if (ffi::Error e = record.Take(record.frame->api->update_launch(record.frame->record_ctx, command, &kernel_args),
                                   "updating the launch command");
        e.failure()) {
      return e;
    }
    if (last != nullptr) std::copy(buffers.ptrs, buffers.ptrs + buffers.count, last);
    return ffi::Error::Success();
  }
  if (record_by_capture_) {
    return record.Take(record.frame->api->request_stream_capture(record.frame->record_ctx),
                       "requesting stream capture");
  }
  LoadedModule* module = slots_[device].ready.load(std::memory_order_acquire);
  if (module == nullptr) {
    // Load our own copy too: it checks the kernel against this call site and
    // picks the image for this GPU. XLA loads the image it is given itself.
    CUcontext context = nullptr;
    driver_->cuCtxGetCurrent(&context);
    if (context == nullptr) {
      CUdevice cu_device;
      if (driver_->cuDeviceGet(&cu_device, device) != CUDA_SUCCESS ||
          driver_->cuDevicePrimaryCtxRetain(&context, cu_device) != CUDA_SUCCESS) {
        return ffi::Error::Internal(who_ + ": no CUDA context for device " + std::to_string(device) +
                                    " while recording");
      }
    }
    if (ffi::Error e = Prepare(device, context); e.failure()) return e;
    module = slots_[device].ready.load(std::memory_order_acquire);
  }
  const XLA_FFI_Command* dependency = nullptr;
  if (collective_ != nullptr) {
    if (ffi::Error e = collective_->RecordBarrier(record, device, &dependency); e.failure()) return e;
  }
  const Image& image = module->image();
  const bool ptx = image.kind == ImageKind::kPtx;
  const XLA_FFI_Command* command = nullptr;
  if (ffi::Error e = record.Take(
          record.frame->api->create_launch(
              record.frame->record_ctx, kernel_->module.symbol.c_str(), image.data.c_str(),
              static_cast<int64_t>(ptx ? image.data.size() + 1 : image.data.size()),
              ptx ? XLA_FFI_SourceFormat_PTX : XLA_FFI_SourceFormat_CUBIN, record_dims_, config_.sharedMemBytes,
              uses_pdl_, &kernel_args, dependency ? &dependency : nullptr, dependency ? 1 : 0, &command),
          "creating the launch command");
      e.failure()) {
    return e;
  }
  if (!record.Push(command)) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, who_ + ": the record frame has no room for the launch");
  }
  std::unique_ptr<void*[]> addresses(new void*[buffers.count]);  // once per recorded command
  std::copy(buffers.ptrs, buffers.ptrs + buffers.count, addresses.get());
  std::erase_if(slot.recorded, [&](const auto& entry) { return entry.first == command; });
  slot.recorded.emplace_back(command, std::move(addresses));
  GetCacheStats().records_created++;
  return ffi::Error::Success();
}

ffi::Error RecordFrame::Take(XLA_FFI_Error* error, const std::string& what) const {
  if (error == nullptr) return ffi::Error::Success();
  std::string message = ffi::internal::GetErrorMessage(api, error);
  ffi::internal::DestroyError(api, error);
  return ffi::Error::Internal("command buffer: " + what + ": " + message);
}

}  // namespace jmf
