#include "ffi/record.h"

#include <string>

namespace jmf {

std::atomic<record_abi::Layout>& ProvenRecordLayout() {
  static std::atomic<record_abi::Layout> layout{record_abi::Layout::kNone};
  return layout;
}

ffi::Error RecordFrame::Take(XLA_FFI_Error* error, const char* what) const {
  if (error == nullptr) return ffi::Error::Success();
  std::string message = ffi::internal::GetErrorMessage(api_, error);
  ffi::internal::DestroyError(api_, error);
  return ffi::Error::Internal(std::string("command buffer: ") + what + ": " + message);
}

ffi::Error RecordFrame::CreateLaunch(const RecordedKernel& kernel, const record_abi::LaunchDims& dims,
                                     uint32_t shared_mem_bytes, bool uses_pdl, const record_abi::KernelArgs* args,
                                     const record_abi::Command* dependency, const record_abi::Command** out,
                                     const char* what) const {
  const record_abi::Command* const* dependencies = dependency != nullptr ? &dependency : nullptr;
  const uint32_t count = dependency != nullptr ? 1 : 0;
  switch (layout_) {
    case record_abi::Layout::kV0_1: {
      const auto* api = static_cast<const record_abi::v0_1::Api*>(frame_->api);
      return Take(api->create_launch(frame_->context, kernel.name, kernel.image, kernel.image_size, kernel.format, dims,
                                     shared_mem_bytes, uses_pdl ? 1 : 0, args, dependencies, count, out),
                  what);
    }
    case record_abi::Layout::kV0_5: {
      if (kernel.function == nullptr) {
        return ffi::Error::Internal(std::string("command buffer: ") + what + ": the kernel is not loaded");
      }
      const auto* api = static_cast<const record_abi::v0_5::Api*>(frame_->api);
      const record_abi::v0_5::Kernel recorded{
          record_abi::v0_5::kKernelStructSize, nullptr, nullptr, kernel.function,
          XLA_FFI_ByteSpan{kernel.name, std::char_traits<char>::length(kernel.name)}};
      const record_abi::v0_5::LaunchParams params{
          record_abi::v0_5::kLaunchParamsStructSize, nullptr, dims, shared_mem_bytes, uses_pdl ? 1 : 0, args};
      return Take(api->create_launch(frame_->context, &recorded, &params, dependencies, count, out), what);
    }
    default:
      return ffi::Error::Internal(std::string("command buffer: ") + what + ": no record layout was proven");
  }
}

// update_launch, request_stream_capture and create_empty_command have the same
// place and signature in every layout (tests/ffi_layouts/check_layouts.cc).
ffi::Error RecordFrame::UpdateLaunch(const record_abi::Command* command, const record_abi::KernelArgs* args,
                                     const char* what) const {
  if (layout_ == record_abi::Layout::kNone) [[unlikely]]
    return ffi::Error::Internal(std::string("command buffer: ") + what + ": no record layout was proven");
  const auto* api = static_cast<const record_abi::v0_5::Api*>(frame_->api);
  return Take(api->update_launch(frame_->context, command, args), what);
}

ffi::Error RecordFrame::CreateEmpty(const record_abi::Command* const* dependencies, uint32_t count,
                                    const record_abi::Command** out, const char* what) const {
  if (layout_ == record_abi::Layout::kNone) [[unlikely]]
    return ffi::Error::Internal(std::string("command buffer: ") + what + ": no record layout was proven");
  const auto* api = static_cast<const record_abi::v0_5::Api*>(frame_->api);
  return Take(api->create_empty_command(frame_->context, dependencies, count, out), what);
}

ffi::Error RecordFrame::RequestStreamCapture(const char* what) const {
  if (layout_ == record_abi::Layout::kNone) [[unlikely]]
    return ffi::Error::Internal(std::string("command buffer: ") + what + ": no record layout was proven");
  const auto* api = static_cast<const record_abi::v0_5::Api*>(frame_->api);
  return Take(api->request_stream_capture(frame_->context), what);
}

}  // namespace jmf
