// Our own declarations of each layout of XLA's command-buffer record extension
// that the record stage calls (xla/ffi/api/record_c_api.h in jaxlib).
//
// The record extension's ABI changed inside jaxlib's patch releases under an
// unchanged FFI API version (0.12.0.1 -> 0.12.1: record 0.2 -> 0.5, a new
// create_launch), and the headers we build against (the oldest jaxlib in the
// range) cannot describe a newer one. So the record stage never uses XLA's
// record declarations: it uses these, one set per layout, chosen at run time
// from the running extension's own (major, minor) by an exact match
// (LayoutFor), never by ">=". A version with no layout here gets no record
// handlers at all: XLA then captures our stream launches into its graphs.
//
// Each layout is checked against the real headers of every jaxlib release in
// the supported range that uses it (tests/ffi_layouts/check_layouts.cc compiles
// with each release's headers and asserts every size, offset and signature;
// scripts/ffi_headers.py and csrc/ffi/checked_ffi_headers.json fail CI when a
// release's declarations differ from what was checked). Adding a layout: declare
// it here, map its version in LayoutFor, port RecordFrame (ffi/record.h), add
// the release to the check.
//
// Only the core C API (c_api.h: XLA_FFI_Extension, XLA_FFI_ByteSpan,
// XLA_FFI_Error) is taken from XLA's headers: it is versioned by the FFI API
// version, which the bootstrap checks.
#ifndef JAX_MOSAIC_FFI_RECORD_LAYOUTS_H_
#define JAX_MOSAIC_FFI_RECORD_LAYOUTS_H_

#include <cstddef>
#include <cstdint>

#include "xla/ffi/api/c_api.h"

namespace jmf::record_abi {

// The extension's type id in the invoke context.
inline constexpr int64_t kExtensionType = 128;

// Opaque to us, as to every client.
struct Context;
struct Command;

// The same in every layout so far (each layout's check asserts it).
struct Dim3 {
  int32_t x, y, z;
};
struct LaunchDims {
  Dim3 grid, block;
  Dim3 cluster;  // {0, 0, 0}: no cluster
};
enum KernelArgType : int32_t { kDevicePtr = 0, kHostValue = 1 };
struct KernelArg {
  const void* address;  // a device pointer's value, or where a host value is
  int64_t size;         // 0 for a device pointer
  KernelArgType type;
};
struct KernelArgs {
  const KernelArg* args;
  int64_t count;
};
enum SourceFormat : int32_t { kPtx = 0, kCubin = 1 };
enum Action : int32_t { kCreate = 0, kUpdate = 1 };

using UpdateLaunchFn = XLA_FFI_Error* (*)(Context*, const Command*, const KernelArgs*);
using CreateMemcpyFn = XLA_FFI_Error* (*)(Context*, void*, void*, int64_t, const Command* const*, uint32_t,
                                          const Command**);
using UpdateMemcpyFn = XLA_FFI_Error* (*)(Context*, const Command*, void*, void*, int64_t);
using RequestCaptureFn = XLA_FFI_Error* (*)(Context*);
using CreateEmptyFn = XLA_FFI_Error* (*)(Context*, const Command* const*, uint32_t, const Command**);

// The record API of a layout: every layout so far differs only in create_launch.
template <typename CreateLaunchFn>
struct ApiWith {
  CreateLaunchFn create_launch;
  UpdateLaunchFn update_launch;
  CreateMemcpyFn create_memcpy_d2d;
  UpdateMemcpyFn update_memcpy_d2d;
  RequestCaptureFn request_stream_capture;
  CreateEmptyFn create_empty_command;
};

// Record 0.1 (jaxlib 0.11.x) and 0.2 (0.12.0.x, which only added a source
// format we do not use): the launch takes the kernel's image bytes.
namespace v0_1 {
using CreateLaunchFn = XLA_FFI_Error* (*)(Context*, const char* kernel_name, const void* kernel_data,
                                          int64_t kernel_size, SourceFormat format, LaunchDims dims,
                                          uint32_t shared_mem_bytes, int32_t uses_pdl, const KernelArgs* args,
                                          const Command* const* dependencies, uint32_t num_dependencies,
                                          const Command** out);
using Api = ApiWith<CreateLaunchFn>;
}  // namespace v0_1

// Record 0.5 (jaxlib 0.12.1): the launch takes a kernel loaded by the caller
// (a CUfunction; XLA's other choice, a kernel registered through its
// KernelRegistry extension, has no header in the jaxlib wheel) and a
// parameter block; update_launch is unchanged.
namespace v0_5 {
struct Kernel {
  size_t struct_size;
  void* extension_start;
  const void* registered_kernel;   // XLA_FFI_Kernel*: null, we pass `function`
  void* function;                  // a CUfunction the caller keeps loaded while the graph lives
  XLA_FFI_ByteSpan function_name;  // for XLA's logs
};
inline constexpr size_t kKernelStructSize = offsetof(Kernel, function_name) + sizeof(XLA_FFI_ByteSpan);

struct LaunchParams {
  size_t struct_size;
  void* extension_start;
  LaunchDims launch_dims;
  uint32_t shared_mem_bytes;
  int32_t uses_pdl;
  const KernelArgs* args;
};
inline constexpr size_t kLaunchParamsStructSize = offsetof(LaunchParams, args) + sizeof(const KernelArgs*);

using CreateLaunchFn = XLA_FFI_Error* (*)(Context*, const Kernel* kernel, const LaunchParams* params,
                                          const Command* const* dependencies, uint32_t num_dependencies,
                                          const Command** out);
using Api = ApiWith<CreateLaunchFn>;
}  // namespace v0_5

// The frame and the extension are the same in every layout so far; `api`
// points at the layout's Api.
struct Frame {
  Context* context;
  const void* api;
  Action action;
  const Command** commands;
  int64_t* num_commands;
  int64_t max_commands;
};
struct Extension {
  XLA_FFI_Extension base;
  Frame* frame;
};

// The members every layout shares sit at the same places, so one access path serves them all.
static_assert(offsetof(v0_1::Api, update_launch) == offsetof(v0_5::Api, update_launch));
static_assert(offsetof(v0_1::Api, request_stream_capture) == offsetof(v0_5::Api, request_stream_capture));
static_assert(offsetof(v0_1::Api, create_empty_command) == offsetof(v0_5::Api, create_empty_command));

enum class Layout : int32_t { kNone = 0, kV0_1 = 1, kV0_5 = 5 };

// The layout of record extension (major, minor): an exact list, so a version
// nobody checked (0.3, 0.4, 0.6, 1.x) has none.
constexpr Layout LayoutFor(int32_t major, int32_t minor) {
  if (major != 0) return Layout::kNone;
  switch (minor) {
    case 1:
    case 2:
      return Layout::kV0_1;
    case 5:
      return Layout::kV0_5;
    default:
      return Layout::kNone;
  }
}

constexpr const char* LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kV0_1:
      return "record-0.1";
    case Layout::kV0_5:
      return "record-0.5";
    default:
      return "";
  }
}

}  // namespace jmf::record_abi

#endif  // JAX_MOSAIC_FFI_RECORD_LAYOUTS_H_
