// The record stage's access to XLA's command-buffer record extension, through
// our own declarations of each layout (ffi/record_layouts.h), never XLA's
// record headers: the layout is chosen from the running extension's version.
//
// The record stage runs at every new recording and every update, so calls go
// to the C API directly with their arguments on the stack (XLA's C++ wrapper
// copies them into a std::vector per call).
#ifndef JAX_MOSAIC_FFI_RECORD_H_
#define JAX_MOSAIC_FFI_RECORD_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "ffi/record_layouts.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

namespace ffi = xla::ffi;

// The newest XLA FFI API minor version (the core C API: registration, call
// frames, extensions lookup) checked against our build (docs/compatibility.md):
// jaxlib 0.11.x reports API 0.4, 0.12.x API 0.5. The record extension has
// versions of its own, checked separately (record_abi::LayoutFor).
inline constexpr int32_t kNewestCheckedFfiApiMinor = 5;

// A kernel as a record command launches it: its image (record 0.1) or the
// function loaded from it in the recording device's context (record 0.5).
struct RecordedKernel {
  const char* name;
  const void* image;
  int64_t image_size;  // PTX with its terminating NUL
  record_abi::SourceFormat format;
  void* function;  // CUfunction
};

// The record frame of one record call, in the layout the bootstrap proved.
class RecordFrame {
 public:
  RecordFrame(const XLA_FFI_Api* api, const record_abi::Frame* frame, record_abi::Layout layout)
      : api_(api), frame_(frame), layout_(layout) {}

  bool creating() const { return frame_->action == record_abi::kCreate; }
  // Whether launches need the kernel loaded in the recording context (RecordedKernel::function).
  bool takes_functions() const { return layout_ == record_abi::Layout::kV0_5; }
  int64_t num_commands() const { return *frame_->num_commands; }
  const record_abi::Command* command(int64_t i) const { return frame_->commands[i]; }

  // Appends a created command to the frame; false when the frame is full.
  bool Push(const record_abi::Command* command) const {
    if (frame_->commands == nullptr || *frame_->num_commands >= frame_->max_commands) return false;
    frame_->commands[(*frame_->num_commands)++] = command;
    return true;
  }

  // Each returns the record API's error as an ffi::Error naming `what`.
  ffi::Error CreateLaunch(const RecordedKernel& kernel, const record_abi::LaunchDims& dims, uint32_t shared_mem_bytes,
                          bool uses_pdl, const record_abi::KernelArgs* args, const record_abi::Command* dependency,
                          const record_abi::Command** out, const char* what) const;
  ffi::Error UpdateLaunch(const record_abi::Command* command, const record_abi::KernelArgs* args,
                          const char* what) const;
  ffi::Error CreateEmpty(const record_abi::Command* const* dependencies, uint32_t count,
                         const record_abi::Command** out, const char* what) const;
  ffi::Error RequestStreamCapture(const char* what) const;

 private:
  ffi::Error Take(XLA_FFI_Error* error, const char* what) const;

  const XLA_FFI_Api* api_;
  const record_abi::Frame* frame_;
  record_abi::Layout layout_;
};

// The layout the bootstrap's probe proved for this process (record_abi::kNone
// until then): the record handlers, registered only after that proof, decode
// the extension only in this layout.
std::atomic<record_abi::Layout>& ProvenRecordLayout();

// Decodes the record extension with `.Ctx<ffi::Extension<RecordExtension>>()`,
// in the proven layout only: XLA refuses to call a handler whose extension
// fails to decode, so a mismatch fails the execution instead of calling an
// ABI nobody checked (it cannot happen while the runtime stays the one probed).
struct RecordExtension {
  using Type = RecordFrame;
  using CExtension = record_abi::Extension;
  static constexpr auto kName = "RecordExtension";
  static constexpr int64_t kExtensionType = record_abi::kExtensionType;
  static constexpr int32_t kMajorVersion = 0;
  static constexpr int32_t kMinorVersion = static_cast<int32_t>(record_abi::Layout::kV0_5);
  static bool Support(int32_t major, int32_t minor) {
    const record_abi::Layout layout = record_abi::LayoutFor(major, minor);
    return layout != record_abi::Layout::kNone && layout == ProvenRecordLayout().load(std::memory_order_relaxed);
  }
  static RecordFrame Create(const XLA_FFI_Api* api, const CExtension* extension) {
    return RecordFrame(api, extension->frame,
                       record_abi::LayoutFor(extension->base.id.major_version, extension->base.id.minor_version));
  }
};

// What the probe's record stage saw: the extension's version, whatever it is
// (its header is the core C API's), and its frame.
struct RecordProbeView {
  int32_t major;
  int32_t minor;
  const XLA_FFI_Api* api;
  const record_abi::Frame* frame;
};
struct RecordProbeExtension {
  using Type = RecordProbeView;
  using CExtension = record_abi::Extension;
  static constexpr auto kName = "RecordExtension (probe)";
  static constexpr int64_t kExtensionType = record_abi::kExtensionType;
  static constexpr int32_t kMajorVersion = 0;
  static constexpr int32_t kMinorVersion = 0;
  static bool Support(int32_t, int32_t) { return true; }  // reads the version only
  static RecordProbeView Create(const XLA_FFI_Api* api, const CExtension* extension) {
    return {extension->base.id.major_version, extension->base.id.minor_version, api, extension->frame};
  }
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_RECORD_H_
