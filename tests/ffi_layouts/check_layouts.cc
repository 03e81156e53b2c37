// Compiled (syntax only) against one jaxlib release's XLA FFI headers by
// tests/test_record_layouts.py: proves that the layout our record stage calls
// for that release's record extension (csrc/ffi/record_layouts.h) is the one
// the release declares, member by member and signature by signature, with
// only our own names for XLA's types. A release whose record version has no
// layout of ours fails here with the version.
#include <cstddef>
#include <type_traits>

#include "ffi/record_layouts.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/record_c_api.h"

namespace abi = jmf::record_abi;

// XLA's type -> ours, for comparing signatures.
template <class T>
struct Ours {
  using type = T;
};
template <>
struct Ours<XLA_FFI_RecordContext*> {
  using type = abi::Context*;
};
template <>
struct Ours<const XLA_FFI_Command*> {
  using type = const abi::Command*;
};
template <>
struct Ours<const XLA_FFI_Command* const*> {
  using type = const abi::Command* const*;
};
template <>
struct Ours<const XLA_FFI_Command**> {
  using type = const abi::Command**;
};
template <>
struct Ours<const XLA_FFI_KernelArgs*> {
  using type = const abi::KernelArgs*;
};
template <>
struct Ours<XLA_FFI_LaunchDims> {
  using type = abi::LaunchDims;
};
template <>
struct Ours<XLA_FFI_SourceFormat> {
  using type = abi::SourceFormat;
};
#if XLA_FFI_Extension_Record_MajorVersion == 0 && XLA_FFI_Extension_Record_MinorVersion == 5
template <>
struct Ours<const XLA_FFI_RecordKernel*> {
  using type = const abi::v0_5::Kernel*;
};
template <>
struct Ours<const XLA_FFI_KernelLaunchParams*> {
  using type = const abi::v0_5::LaunchParams*;
};
#endif

template <class F>
struct OursFn;
template <class R, class... A>
struct OursFn<R (*)(A...)> {
  using type = typename Ours<R>::type (*)(typename Ours<A>::type...);
};

#define JMF_SAME_PLACE(ours, our_field, theirs, their_field)                             \
  static_assert(offsetof(ours, our_field) == offsetof(theirs, their_field), #our_field); \
  static_assert(sizeof(ours::our_field) == sizeof(theirs::their_field), #our_field " (size)")
#define JMF_SAME_FN(ours, theirs, member)                                                                 \
  static_assert(std::is_same_v<OursFn<decltype(theirs::member)>::type, decltype(ours::member)>, #member); \
  JMF_SAME_PLACE(ours, member, theirs, member)

// What every layout shares.
static_assert(abi::kExtensionType == XLA_FFI_Extension_Record);
static_assert(sizeof(abi::Dim3) == sizeof(XLA_FFI_Dim3));
JMF_SAME_PLACE(abi::Dim3, x, XLA_FFI_Dim3, x);
JMF_SAME_PLACE(abi::Dim3, y, XLA_FFI_Dim3, y);
JMF_SAME_PLACE(abi::Dim3, z, XLA_FFI_Dim3, z);
static_assert(sizeof(abi::LaunchDims) == sizeof(XLA_FFI_LaunchDims));
JMF_SAME_PLACE(abi::LaunchDims, grid, XLA_FFI_LaunchDims, grid);
JMF_SAME_PLACE(abi::LaunchDims, block, XLA_FFI_LaunchDims, block);
JMF_SAME_PLACE(abi::LaunchDims, cluster, XLA_FFI_LaunchDims, cluster);
static_assert(sizeof(abi::KernelArgType) == sizeof(XLA_FFI_KernelArgType));
static_assert(abi::kDevicePtr == XLA_FFI_KernelArgType_DevicePtr && abi::kHostValue == XLA_FFI_KernelArgType_HostValue);
static_assert(sizeof(abi::KernelArg) == sizeof(XLA_FFI_KernelArg));
JMF_SAME_PLACE(abi::KernelArg, address, XLA_FFI_KernelArg, arg_address);
JMF_SAME_PLACE(abi::KernelArg, size, XLA_FFI_KernelArg, size);
JMF_SAME_PLACE(abi::KernelArg, type, XLA_FFI_KernelArg, type);
static_assert(sizeof(abi::KernelArgs) == sizeof(XLA_FFI_KernelArgs));
JMF_SAME_PLACE(abi::KernelArgs, args, XLA_FFI_KernelArgs, args);
JMF_SAME_PLACE(abi::KernelArgs, count, XLA_FFI_KernelArgs, num_args);
static_assert(sizeof(abi::SourceFormat) == sizeof(XLA_FFI_SourceFormat));
static_assert(abi::kPtx == XLA_FFI_SourceFormat_PTX && abi::kCubin == XLA_FFI_SourceFormat_CUBIN);
static_assert(sizeof(abi::Action) == sizeof(XLA_FFI_RecordAction));
static_assert(abi::kCreate == XLA_FFI_RecordAction_Create && abi::kUpdate == XLA_FFI_RecordAction_Update);
static_assert(sizeof(abi::Frame) == sizeof(XLA_FFI_RecordFrame));
JMF_SAME_PLACE(abi::Frame, context, XLA_FFI_RecordFrame, record_ctx);
JMF_SAME_PLACE(abi::Frame, api, XLA_FFI_RecordFrame, api);
JMF_SAME_PLACE(abi::Frame, action, XLA_FFI_RecordFrame, action);
JMF_SAME_PLACE(abi::Frame, commands, XLA_FFI_RecordFrame, commands);
JMF_SAME_PLACE(abi::Frame, num_commands, XLA_FFI_RecordFrame, num_commands);
JMF_SAME_PLACE(abi::Frame, max_commands, XLA_FFI_RecordFrame, max_commands);
static_assert(sizeof(abi::Extension) == sizeof(XLA_FFI_Record_Extension));
JMF_SAME_PLACE(abi::Extension, base, XLA_FFI_Record_Extension, extension_base);
JMF_SAME_PLACE(abi::Extension, frame, XLA_FFI_Record_Extension, record_frame);

// The layout of this release's record version, as LayoutFor picks it.
constexpr abi::Layout kLayout =
    abi::LayoutFor(XLA_FFI_Extension_Record_MajorVersion, XLA_FFI_Extension_Record_MinorVersion);

#if XLA_FFI_Extension_Record_MajorVersion == 0 && \
    (XLA_FFI_Extension_Record_MinorVersion == 1 || XLA_FFI_Extension_Record_MinorVersion == 2)
static_assert(kLayout == abi::Layout::kV0_1);
using OurApi = abi::v0_1::Api;
#elif XLA_FFI_Extension_Record_MajorVersion == 0 && XLA_FFI_Extension_Record_MinorVersion == 5
static_assert(kLayout == abi::Layout::kV0_5);
using OurApi = abi::v0_5::Api;
static_assert(abi::v0_5::kKernelStructSize == XLA_FFI_RecordKernel_STRUCT_SIZE);
static_assert(sizeof(abi::v0_5::Kernel) == sizeof(XLA_FFI_RecordKernel));
JMF_SAME_PLACE(abi::v0_5::Kernel, struct_size, XLA_FFI_RecordKernel, struct_size);
JMF_SAME_PLACE(abi::v0_5::Kernel, extension_start, XLA_FFI_RecordKernel, extension_start);
JMF_SAME_PLACE(abi::v0_5::Kernel, registered_kernel, XLA_FFI_RecordKernel, kernel);
JMF_SAME_PLACE(abi::v0_5::Kernel, function, XLA_FFI_RecordKernel, function);
JMF_SAME_PLACE(abi::v0_5::Kernel, function_name, XLA_FFI_RecordKernel, function_name);
static_assert(abi::v0_5::kLaunchParamsStructSize == XLA_FFI_KernelLaunchParams_STRUCT_SIZE);
static_assert(sizeof(abi::v0_5::LaunchParams) == sizeof(XLA_FFI_KernelLaunchParams));
JMF_SAME_PLACE(abi::v0_5::LaunchParams, struct_size, XLA_FFI_KernelLaunchParams, struct_size);
JMF_SAME_PLACE(abi::v0_5::LaunchParams, extension_start, XLA_FFI_KernelLaunchParams, extension_start);
JMF_SAME_PLACE(abi::v0_5::LaunchParams, launch_dims, XLA_FFI_KernelLaunchParams, launch_dims);
JMF_SAME_PLACE(abi::v0_5::LaunchParams, shared_mem_bytes, XLA_FFI_KernelLaunchParams, shared_mem_bytes);
JMF_SAME_PLACE(abi::v0_5::LaunchParams, uses_pdl, XLA_FFI_KernelLaunchParams, uses_pdl);
JMF_SAME_PLACE(abi::v0_5::LaunchParams, args, XLA_FFI_KernelLaunchParams, args);
#else
#error "this jaxlib's record extension version has no layout in csrc/ffi/record_layouts.h: declare one and port"
#endif

static_assert(sizeof(OurApi) == sizeof(XLA_FFI_RecordApi));
JMF_SAME_FN(OurApi, XLA_FFI_RecordApi, create_launch);
JMF_SAME_FN(OurApi, XLA_FFI_RecordApi, update_launch);
JMF_SAME_FN(OurApi, XLA_FFI_RecordApi, create_memcpy_d2d);
JMF_SAME_FN(OurApi, XLA_FFI_RecordApi, update_memcpy_d2d);
JMF_SAME_FN(OurApi, XLA_FFI_RecordApi, request_stream_capture);
JMF_SAME_FN(OurApi, XLA_FFI_RecordApi, create_empty_command);
