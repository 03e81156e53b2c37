#include "runtime/handlers.h"

#include <chrono>
#include <mutex>
#include <optional>
#include <string>

#include "cuda.h"
#include "ffi/record.h"
#include "ffi/status.h"
#include "peers/collective.h"
#include "runtime/call_site.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {
struct ApiPointer {};
}  // namespace jmf

// Decodes the calling plugin's XLA_FFI_Api, which the bootstrap registers with.
template <>
struct xla::ffi::CtxDecoding<jmf::ApiPointer> {
  using Type = const XLA_FFI_Api*;
  static std::optional<Type> Decode(const XLA_FFI_Api* api, XLA_FFI_InvokeContext*, DiagnosticEngine&) { return api; }
};

namespace jmf {
namespace {

using Stream = ffi::PlatformStream<CUstream>;
using SiteState = ffi::State<CallSite>;

ffi::ErrorOr<std::unique_ptr<CallSite>> Instantiate(ffi::Dictionary attrs, bool collective,
                                                    bool programs_allowed = false) {
  const auto start = std::chrono::steady_clock::now();
  auto site = CallSite::Create(attrs, collective, programs_allowed);
  CacheStats& stats = GetCacheStats();
  stats.instantiations++;
  stats.instantiate_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  return site;
}

// The plain launch targets (v1, v2) refuse NVSHMEM calls, which need their own target's prepare and initialize.
ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiatePlainTarget(ffi::Dictionary attrs, const char* target,
                                                               bool programs_allowed) {
  auto site = Instantiate(attrs, /*collective=*/false, programs_allowed);
  if (site.has_value() && (*site)->spec().nvshmem) {
    return ffi::Error::InvalidArgument((*site)->who() + ": an NVSHMEM call (nvshmem_symmetric) must use target " +
                                       kNvshmemTarget + ", not " + target);
  }
  if (site.has_value() && (*site)->host_launch()) {
    return ffi::Error::InvalidArgument((*site)->who() + ": a CuTe DSL call (host_args) must use target " + kCuteTarget +
                                       ", not " + target);
  }
  return site;
}

ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiateCute(ffi::Dictionary attrs) {
  auto site = Instantiate(attrs, /*collective=*/false);
  if (site.has_value() && !(*site)->host_launch()) {
    return ffi::Error::InvalidArgument((*site)->who() + ": target " + kCuteTarget +
                                       " needs the host_args attribute (the CuTe DSL host function's arguments)");
  }
  return site;
}

ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiatePlain(ffi::Dictionary attrs) {
  return InstantiatePlainTarget(attrs, kLaunchTarget, /*programs_allowed=*/false);
}

ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiateNvshmem(ffi::Dictionary attrs) {
  auto site = Instantiate(attrs, /*collective=*/false);
  if (site.has_value() && !(*site)->spec().nvshmem) {
    return ffi::Error::InvalidArgument((*site)->who() + ": target " + kNvshmemTarget +
                                       " needs the nvshmem_symmetric attribute (one 0/1 flag per buffer)");
  }
  return site;
}

ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiatePlainV2(ffi::Dictionary attrs) {
  return InstantiatePlainTarget(attrs, kLaunchTargetV2, /*programs_allowed=*/true);
}

ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiateCollective(ffi::Dictionary attrs) {
  return Instantiate(attrs, /*collective=*/true);
}

CUcontext CurrentContext(const CallSite& site) {
  CUcontext context = nullptr;
  site.driver().cuCtxGetCurrent(&context);
  return context;
}

ffi::Error Execute(CUstream stream, int32_t device, CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  Buffers buffers;
  JMF_RETURN_IF_ERROR(site->GatherBuffers(args, rets, &buffers));
  if (site->has_programs()) [[unlikely]] {
    JMF_RETURN_IF_ERROR(site->ResolveLaunchPrograms(args, rets));
  }
  return site->Launch(stream, device, buffers);
}

ffi::Error ExecuteCute(CUstream stream, int32_t device, CallSite* site, ffi::RemainingArgs args,
                       ffi::RemainingRets rets) {
  Buffers buffers;
  JMF_RETURN_IF_ERROR(site->GatherBuffers(args, rets, &buffers));
  return site->LaunchHost(stream, device, buffers);
}

ffi::Error Record(RecordFrame record, int32_t device, CallSite* site, ffi::RemainingArgs args,
                  ffi::RemainingRets rets) {
  Buffers buffers;
  JMF_RETURN_IF_ERROR(site->GatherBuffers(args, rets, &buffers));
  if (site->has_programs()) [[unlikely]] {
    JMF_RETURN_IF_ERROR(site->ResolveLaunchPrograms(args, rets));
  }
  return site->Record(record, device, buffers);
}

// The collective stages run only after the device ordinal passed Prepare's
// range check: XLA runs prepare before initialize and execute.
ffi::Error CollectivePrepare(int32_t device, CallSite* site) {
  GetCacheStats().collective_prepares.fetch_add(1, std::memory_order_relaxed);
  CUcontext context = CurrentContext(*site);
  JMF_RETURN_IF_ERROR(site->Prepare(device, context));
  return site->collective()->Prepare(device, context);
}

ffi::Error CollectiveInitialize(CUstream stream, ffi::RunId run_id, int32_t device, CallSite* site,
                                ffi::RemainingArgs args, ffi::RemainingRets rets) {
  GetCacheStats().collective_initializes.fetch_add(1, std::memory_order_relaxed);
  Buffers buffers;
  JMF_RETURN_IF_ERROR(site->GatherBuffers(args, rets, &buffers));
  return site->collective()->Initialize(device, run_id.run_id, stream, buffers);
}

ffi::Error CollectiveExecute(CUstream stream, int32_t device, CallSite* site, ffi::RemainingArgs args,
                             ffi::RemainingRets rets) {
  Buffers buffers;
  JMF_RETURN_IF_ERROR(site->GatherBuffers(args, rets, &buffers));
  JMF_RETURN_IF_ERROR(site->collective()->BeforeLaunch(device, stream, buffers));
  JMF_RETURN_IF_ERROR(site->Launch(stream, device, buffers));
  return site->collective()->AfterLaunch(device, stream, buffers);
}

// NVSHMEM calls: started and loaded at prepare, symmetric buffers at
// initialize, both before any stream capture; O(1) once done.
ffi::Error NvshmemPrepare(int32_t device, CallSite* site) { return site->Prepare(device, CurrentContext(*site)); }

ffi::Error NvshmemInitialize(int32_t device, CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  (void)device;
  if (site->nvshmem()->ready()) return ffi::Error::Success();
  Buffers buffers;
  JMF_RETURN_IF_ERROR(site->GatherBuffers(args, rets, &buffers));
  return site->nvshmem()->Allocate(buffers);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_instantiate_nvshmem, InstantiateNvshmem, ffi::Ffi::BindInstantiate().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_nvshmem_prepare, NvshmemPrepare,
                              ffi::Ffi::BindPrepare().Ctx<ffi::DeviceOrdinal>().Ctx<SiteState>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jmf_nvshmem_initialize, NvshmemInitialize,
    ffi::Ffi::BindInitialize().Ctx<ffi::DeviceOrdinal>().Ctx<SiteState>().RemainingArgs().RemainingRets(),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_instantiate_plain, InstantiatePlain, ffi::Ffi::BindInstantiate().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_instantiate_cute, InstantiateCute, ffi::Ffi::BindInstantiate().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jmf_execute_cute, ExecuteCute,
    ffi::Ffi::BindExecute().Ctx<Stream>().Ctx<ffi::DeviceOrdinal>().Ctx<SiteState>().RemainingArgs().RemainingRets(),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jmf_execute_cute_nograph, ExecuteCute,
    ffi::Ffi::BindExecute().Ctx<Stream>().Ctx<ffi::DeviceOrdinal>().Ctx<SiteState>().RemainingArgs().RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_instantiate_plain_v2, InstantiatePlainV2, ffi::Ffi::BindInstantiate().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_instantiate_collective, InstantiateCollective, ffi::Ffi::BindInstantiate().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jmf_execute, Execute,
    ffi::Ffi::BindExecute().Ctx<Stream>().Ctx<ffi::DeviceOrdinal>().Ctx<SiteState>().RemainingArgs().RemainingRets(),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_record, Record,
                              ffi::Ffi::BindRecord()
                                  .Ctx<ffi::Extension<RecordExtension>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<SiteState>()
                                  .RemainingArgs()
                                  .RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_collective_prepare, CollectivePrepare,
                              ffi::Ffi::BindPrepare().Ctx<ffi::DeviceOrdinal>().Ctx<SiteState>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_collective_initialize, CollectiveInitialize,
                              ffi::Ffi::BindInitialize()
                                  .Ctx<Stream>()
                                  .Ctx<ffi::RunId>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<SiteState>()
                                  .RemainingArgs()
                                  .RemainingRets(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jmf_collective_execute, CollectiveExecute,
    ffi::Ffi::BindExecute().Ctx<Stream>().Ctx<ffi::DeviceOrdinal>().Ctx<SiteState>().RemainingArgs().RemainingRets(),
    {ffi::Traits::kCmdBufferCompatible});

std::vector<TargetBundle> Targets() {
  return {
      {kLaunchTarget, {jmf_instantiate_plain, nullptr, nullptr, jmf_execute, jmf_record}},
      {kLaunchTargetV2, {jmf_instantiate_plain_v2, nullptr, nullptr, jmf_execute, jmf_record}},
      {kCollectiveTarget,
       {jmf_instantiate_collective, jmf_collective_prepare, jmf_collective_initialize, jmf_collective_execute,
        jmf_record}},
      {kNvshmemTarget, {jmf_instantiate_nvshmem, jmf_nvshmem_prepare, jmf_nvshmem_initialize, jmf_execute, jmf_record}},
      {kCuteTarget, {jmf_instantiate_cute, nullptr, nullptr, jmf_execute_cute, jmf_record}},
      {kCuteNoGraphTarget, {jmf_instantiate_cute, nullptr, nullptr, jmf_execute_cute_nograph, nullptr}, false},
  };
}

namespace {

std::mutex registration_mutex;
RecordRegistration registration;
const XLA_FFI_Api* bootstrap_api = nullptr;  // the calling plugin's, kept for RegisterRecordTargets

std::string VersionText(int major, int minor) { return std::to_string(major) + "." + std::to_string(minor); }

// The probe: its record stage reads the running record extension's version
// and calls nothing the version does not prove (ffi/record.h).
ffi::Error ProbeExecute(ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) { return ffi::Error::Success(); }

ffi::Error ProbeRecord(RecordProbeView view, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) {
  const record_abi::Layout layout = record_abi::LayoutFor(view.major, view.minor);
  {
    std::lock_guard<std::mutex> lock(registration_mutex);
    registration.probe_seen = true;
    registration.record_major = view.major;
    registration.record_minor = view.minor;
  }
  if (layout == record_abi::Layout::kNone) {
    // Nothing of the frame is touched: its layout is unknown. The failed probe program is the answer.
    return ffi::Error(ffi::ErrorCode::kUnimplemented, "record extension " + VersionText(view.major, view.minor) +
                                                          " has no layout declared in this build of jax_mosaic_ffi");
  }
  return RecordFrame(view.api, view.frame, layout).RequestStreamCapture("the record probe");
}

ffi::Error Bootstrap(const XLA_FFI_Api* api, ffi::Result<ffi::AnyBuffer>) {
  std::lock_guard<std::mutex> lock(registration_mutex);
  if (registration.attempted) return ffi::Error::Success();
  registration.attempted = true;
  // Older-built handlers run on newer runtimes of the same major version; the
  // core API is known good up to the newest minor we checked.
  const int major = api->api_version.major_version;
  const int minor = api->api_version.minor_version;
  if (major != XLA_FFI_API_MAJOR || minor < XLA_FFI_API_MINOR || minor > kNewestCheckedFfiApiMinor) {
    registration.message = "the running XLA FFI API is " + VersionText(major, minor) +
                           "; record handlers are used from " + VersionText(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR) +
                           " (built against) to " + VersionText(XLA_FFI_API_MAJOR, kNewestCheckedFfiApiMinor) +
                           " (checked)";
    return ffi::Error::Success();
  }
  if (XLA_FFI_Error* error = ffi::Ffi::RegisterStaticHandler(api, kRecordProbeTarget, "CUDA", RecordProbeBundle(),
                                                             XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE)) {
    registration.message =
        std::string("registering ") + kRecordProbeTarget + ": " + ffi::internal::GetErrorMessage(api, error);
    ffi::internal::DestroyError(api, error);
    return ffi::Error::Success();
  }
  bootstrap_api = api;
  registration.probe_registered = true;
  registration.message = "the record probe is registered";
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_record_probe_execute, ProbeExecute,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jmf_record_probe_record, ProbeRecord,
    ffi::Ffi::BindRecord().Ctx<ffi::Extension<RecordProbeExtension>>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_Handler_Bundle RecordProbeBundle() {
  return {nullptr, nullptr, nullptr, jmf_record_probe_execute, jmf_record_probe_record};
}

bool RegisterRecordTargets() {
  std::lock_guard<std::mutex> lock(registration_mutex);
  if (registration.registered) return true;
  const record_abi::Layout layout = record_abi::LayoutFor(registration.record_major, registration.record_minor);
  if (bootstrap_api == nullptr || !registration.probe_seen || layout == record_abi::Layout::kNone) {
    registration.message = "no record layout was proven";
    return false;
  }
  ProvenRecordLayout().store(layout, std::memory_order_relaxed);  // before any handler can be called
  for (const TargetBundle& target : Targets()) {
    const XLA_FFI_Handler_Traits traits = target.command_buffer ? XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE : 0;
    if (XLA_FFI_Error* error =
            ffi::Ffi::RegisterStaticHandler(bootstrap_api, target.name, "CUDA", target.bundle, traits)) {
      registration.message =
          std::string("registering ") + target.name + ": " + ffi::internal::GetErrorMessage(bootstrap_api, error);
      ffi::internal::DestroyError(bootstrap_api, error);
      return false;
    }
  }
  registration.registered = true;
  registration.message = std::string("registered with record handlers (record extension ") +
                         VersionText(registration.record_major, registration.record_minor) + ", layout " +
                         record_abi::LayoutName(layout) + ")";
  return true;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_bootstrap, Bootstrap,
                              ffi::Ffi::BindExecute().Ctx<ApiPointer>().Ret<ffi::AnyBuffer>());

XLA_FFI_Handler* BootstrapHandler() { return jmf_bootstrap; }

RecordRegistration GetRecordRegistration() {
  std::lock_guard<std::mutex> lock(registration_mutex);
  return registration;
}

}  // namespace jmf
