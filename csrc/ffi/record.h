// Access to XLA's command-buffer record extension (xla/ffi/api/record_c_api.h).
//
// jaxlib 0.11.2 ships the C API but no C++ alias for decoding it, and its C++
// wrapper copies the arguments into a std::vector on every call. The record
// stage runs on every execution, so we talk to the C API directly with
// arguments on the stack.
#ifndef JAX_MOSAIC_FFI_RECORD_H_
#define JAX_MOSAIC_FFI_RECORD_H_

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla/ffi/api/record_api.h"
#include "xla/ffi/api/record_c_api.h"

namespace jmf {

namespace ffi = xla::ffi;

// The record frame of one record call.
struct RecordFrame {
  RecordFrame(const XLA_FFI_Api* api, const XLA_FFI_RecordFrame* frame) : api(api), frame(frame) {}

  bool creating() const { return frame->action == XLA_FFI_RecordAction_Create; }
  int64_t num_commands() const { return *frame->num_commands; }
  const XLA_FFI_Command* command(int64_t i) const { return frame->commands[i]; }

  // Turns an XLA_FFI_Error from the record API into an ffi::Error.
  ffi::Error Take(XLA_FFI_Error* error, const std::string& what) const {
    if (error == nullptr) return ffi::Error::Success();
    std::string message = ffi::internal::GetErrorMessage(api, error);
    ffi::internal::DestroyError(api, error);
    return ffi::Error::Internal("command buffer: " + what + ": " + message);
  }

  // Appends a created command to the frame; false when the frame is full.
  bool Push(const XLA_FFI_Command* command) const {
    if (frame->commands == nullptr || *frame->num_commands >= frame->max_commands) return false;
    frame->commands[(*frame->num_commands)++] = command;
    return true;
  }

  const XLA_FFI_Api* api;
  const XLA_FFI_RecordFrame* frame;
};

// The newest XLA FFI API minor version whose record extension was compared
// with the headers we build against (docs/compatibility.md): jaxlib 0.11.x
// reports API 0.4 with record extension 0.1, jaxlib 0.12.x API 0.5 with
// record 0.2, and XLA_FFI_RecordFrame, XLA_FFI_RecordApi (create_launch,
// update_launch) and XLA_FFI_Record_Extension are the same in both. The
// record API may change without a version bump, so the bootstrap registers
// record handlers only for API versions up to this one; raise it after
// checking a new jaxlib's headers.
inline constexpr int32_t kNewestCheckedFfiApiMinor = 5;

// Decodes the record extension with `.Ctx<ffi::Extension<RecordExtension>>()`.
// Accepts the 0.x versions from the one we were built against on: the minor
// bumps so far (0.1 -> 0.2: a FUNCTION_PTR source format) only added. The
// bootstrap's API version check is what keeps unchecked runtimes away; a
// refusal here would fail the execution instead of falling back to capture.
struct RecordExtension : ffi::internal::RecordExtensionBase<RecordFrame> {
  static bool Support(int32_t major, int32_t minor) {
    return major == XLA_FFI_Extension_Record_MajorVersion && minor >= XLA_FFI_Extension_Record_MinorVersion;
  }
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_RECORD_H_
