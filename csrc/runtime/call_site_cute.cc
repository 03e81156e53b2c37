// The call site, CuTe DSL calls (the CuTe target): the kernel is a CuTe DSL
// object whose host function picks the grid, block and shared memory and
// launches on the stream it is given. Python describes that function's
// arguments (host_args: buffer addresses and dimensions, docs/contract.md) and
// the module records their kinds; instantiate checks the two agree and makes
// the module (driver/cute_dsl_runtime.h), so execute only fills 8-byte slots
// and calls CuteDSLRT_Function_Run: no parsing, allocation, locking or
// strings. Inside a command buffer XLA captures that launch (the object does
// not expose its launch configuration, which its host code computes).
#include <cstdint>
#include <string>

#include "ffi/status.h"
#include "runtime/call_site.h"

namespace jmf {
namespace {

// The compute capability of the device whose context is current, or of device 0.
int CurrentArch(const Driver& driver) {
  CUcontext context = nullptr;
  CUdevice device = 0;
  driver.cuCtxGetCurrent(&context);
  if (context == nullptr || driver.cuCtxGetDevice(&device) != CUDA_SUCCESS) driver.cuDeviceGet(&device, 0);
  int major = 0, minor = 0;
  driver.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  driver.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  return major * 10 + minor;
}

}  // namespace

ffi::Error CallSite::CreateHostModule() {
  const ParsedModule& module = kernel_->module;
  const int arch = CurrentArch(*driver_);
  const Image* image = SelectCuteImage(module, arch);
  if (image == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who() + ": the kernel has no CuTe DSL object this GPU (sm_" + std::to_string(arch) +
                          ") can run: the module holds " + DescribeImages(module) + ". Compile it for sm_" +
                          std::to_string(arch) + (arch >= 90 ? "a" : "") + " (targets=...)");
  }
  const size_t expected = image->host_arg_kinds.size();
  bool agree = expected == spec_.host_args.size();
  for (size_t i = 0; agree && i < expected; ++i) {
    const uint32_t wanted = spec_.host_args[i].kind == kHostArgAddress ? kHostArgPointer : kHostArgInt64;
    agree = image->host_arg_kinds[i] == wanted;
  }
  if (!agree) {
    return ffi::Error::InvalidArgument(
        who() + ": host_args describes " + std::to_string(spec_.host_args.size()) +
        " arguments that do not match the " + std::to_string(expected) +
        " the CuTe DSL object's host function takes (pointers and int64 dimensions, in its order); lower the call "
        "again with this jax_mosaic_ffi");
  }
  batch_dims_.assign(spec_.num_buffers, 0);
  if (spec_.batch_size > 1) {
    for (int b = 0; b < spec_.num_buffers; ++b) batch_dims_[b] = spec_.batch_strides[b] != 0 ? 1 : 0;
  }
  record_by_capture_ = true;
  auto created = CuteModule::GetOrCreate(kernel_, *image);
  if (!created.has_value()) {
    return ffi::Error(created.error().errc().value_or(ffi::ErrorCode::kInternal),
                      who() + ": " + created.error().message());
  }
  host_module_ = std::move(*created);
  return ffi::Error::Success();
}

ffi::Error CallSite::CheckHostDevice(int32_t device) {
  CUdevice cu_device = 0;
  int major = 0, minor = 0;
  driver_->cuDeviceGet(&cu_device, device);
  driver_->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu_device);
  driver_->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu_device);
  const Image& image = host_module_->image();
  if (SelectCuteImage(kernel_->module, major * 10 + minor) != &image) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who() + ": device " + std::to_string(device) + " is sm_" + std::to_string(major * 10 + minor) +
                          ", but the call's CuTe DSL object was loaded for sm_" + ArchName(image) +
                          " (the GPU current when the program was compiled); one program runs CuTe DSL kernels on "
                          "GPUs of one architecture");
  }
  slots_[device].host_checked.store(true, std::memory_order_release);
  return ffi::Error::Success();
}

ffi::Error CallSite::HostRunError(int code, int32_t result, int32_t device) const {
  const CuteDslRuntime& runtime = host_module_->runtime();
  std::string what = code != 0 ? "CuteDSLRT_Function_Run failed: " + runtime.ErrorText(code)
                               : "its host function returned CUDA error " + std::to_string(result) +
                                     " (a cudaError_t: " + CudaErrorText(*driver_, static_cast<CUresult>(result)) + ")";
  return ffi::Error::Internal(who() + ": the CuTe DSL kernel's launch on device " + std::to_string(device) +
                              " failed: " + what);
}

ffi::Error CallSite::LaunchHost(CUstream stream, int32_t device, Buffers& buffers) {
  if (device < 0 || device >= kMaxDevices) [[unlikely]]
    return DeviceOutOfRange(who(), device);
  if (!slots_[device].host_checked.load(std::memory_order_acquire)) [[unlikely]]
    JMF_RETURN_IF_ERROR(CheckHostDevice(device));
  if (!spec_.poison_buffers.empty()) [[unlikely]]
    JMF_RETURN_IF_ERROR(Poison(stream, buffers));
  if (!spec_.zero_buffers.empty()) JMF_RETURN_IF_ERROR(Zero(stream, buffers));
  // The host function takes a pointer to each argument: the stream, its own, then an int32 result slot.
  const size_t n = spec_.host_args.size();
  uint64_t values[kMaxParams];
  void* argv[kMaxParams + 2];
  int32_t result = 0;
  argv[0] = &stream;
  for (size_t i = 0; i < n; ++i) argv[i + 1] = &values[i];
  argv[n + 1] = &result;
  const CuteDslRuntime& runtime = host_module_->runtime();
  for (uint32_t element = 0; element < spec_.batch_size; ++element) {
    if (element > 0) MoveToNextElement(buffers);
    for (size_t i = 0; i < n; ++i) {
      const HostArg& arg = spec_.host_args[i];
      if (arg.kind == kHostArgAddress) {
        values[i] = reinterpret_cast<uintptr_t>(buffers.ptrs[arg.buffer]);
        continue;
      }
      const int64_t dimension = int64_t{arg.dimension} + batch_dims_[arg.buffer];
      if (dimension >= buffers.ranks[arg.buffer]) [[unlikely]] {
        return ffi::Error::InvalidArgument(who() + ": host_args entry " + std::to_string(i) + " reads dimension " +
                                           std::to_string(arg.dimension) + " of buffer " + std::to_string(arg.buffer) +
                                           ", which has rank " +
                                           std::to_string(buffers.ranks[arg.buffer] - batch_dims_[arg.buffer]));
      }
      values[i] = static_cast<uint64_t>(buffers.dims[arg.buffer][dimension]);
    }
    const CuteDslError code = runtime.function_run(host_module_->function(), argv, n + 2);
    if (code != 0 || result != 0) [[unlikely]]
      return HostRunError(code, result, device);
  }
  if (synchronize_launches_) [[unlikely]] {
    CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    driver_->cuStreamIsCapturing(stream, &capturing);
    if (capturing == CU_STREAM_CAPTURE_STATUS_NONE) {
      if (CUresult r = driver_->cuStreamSynchronize(stream); r != CUDA_SUCCESS) {
        return ffi::Error::Internal(who() + ": the CuTe DSL kernel failed while running on device " +
                                    std::to_string(device) + ": " + CudaErrorText(*driver_, r) +
                                    ". (JAX_MOSAIC_FFI_SYNC_LAUNCHES is on.) The CUDA context cannot be used after a "
                                    "fault: restart the process");
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace jmf
