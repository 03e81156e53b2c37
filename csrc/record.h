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
  ffi::Error Take(XLA_FFI_Error* error, const std::string& what) const;

  // Appends a created command to the frame; false when the frame is full.
  bool Push(const XLA_FFI_Command* command) const {
    if (frame->commands == nullptr || *frame->num_commands >= frame->max_commands) return false;
    frame->commands[(*frame->num_commands)++] = command;
    return true;
  }

  const XLA_FFI_Api* api;
  const XLA_FFI_RecordFrame* frame;
};

// Decodes the record extension with `.Ctx<ffi::Extension<RecordExtension>>()`.
// Accepts the 0.x versions whose frame layout we were built against.
struct RecordExtension : ffi::internal::RecordExtensionBase<RecordFrame> {
  static bool Support(int32_t major, int32_t minor) {
    return major == XLA_FFI_Extension_Record_MajorVersion &&
           minor >= XLA_FFI_Extension_Record_MinorVersion;
  }
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_RECORD_H_
