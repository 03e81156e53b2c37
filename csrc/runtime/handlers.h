// ===== csrc/runtime/: the FFI stages and the state behind them =====
// Call-site state (launch, record stage, tensor maps, launch programs), the
// kernel caches, and the handler bundles that expose them to XLA. May
// include: the standard library, POSIX headers, the XLA FFI headers
// (xla/ffi/api/), cuda.h and every folder below (peers/, ffi/, driver/,
// contract/). Not nanobind, not python/: nothing here knows Python is there.
// Layers: contract <- driver <- ffi <- peers <- runtime <- python
// (scripts/check_csrc_layers.py).
//
// The XLA FFI handler bundles of jax_mosaic_ffi and how they get registered.
#ifndef JAX_MOSAIC_FFI_HANDLERS_H_
#define JAX_MOSAIC_FFI_HANDLERS_H_

#include <string>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jmf {

// Custom-call target names: the contract (jax_mosaic_ffi/base/contract.py).
inline constexpr char kLaunchTarget[] = "jax_mosaic_ffi_launch_v1";
inline constexpr char kCollectiveTarget[] = "jax_mosaic_ffi_collective_v1";
// Kernels that use NVSHMEM: the plain launch plus a prepare stage (NVSHMEM
// started, the module registered) and an initialize stage (symmetric buffers
// allocated), so that neither runs inside a stream capture.
inline constexpr char kNvshmemTarget[] = "jax_mosaic_ffi_nvshmem_v1";
// Contract v2: the v1 launch plus launch programs (a grid and scalars from symbolic shapes).
inline constexpr char kLaunchTargetV2[] = "jax_mosaic_ffi_launch_v2";
// CuTe DSL kernels: the module's host function launches (host_args). The nograph target is the same
// without the command-buffer trait, so XLA never puts it in a CUDA graph (cute_call's allow_cuda_graph=False).
inline constexpr char kCuteTarget[] = "jax_mosaic_ffi_cute_v1";
inline constexpr char kCuteNoGraphTarget[] = "jax_mosaic_ffi_cute_nograph_v1";
inline constexpr char kBootstrapTarget[] = "jax_mosaic_ffi_bootstrap";
// A target of the bootstrap's own: a program of its calls, put in a command
// buffer, shows the record stage's extension version before any kernel
// target gets a record handler (jax_mosaic_ffi/call/registration.py).
inline constexpr char kRecordProbeTarget[] = "jax_mosaic_ffi_record_probe";

struct TargetBundle {
  const char* name;
  XLA_FFI_Handler_Bundle bundle;  // with the record handler
  bool command_buffer = true;     // registered command-buffer compatible
};

// Every target this runtime serves.
std::vector<TargetBundle> Targets();

// The bootstrap target's execute handler: keeps the XLA_FFI_Api of the plugin
// that calls it and registers the record probe through it, where the core
// API's version is one we checked.
XLA_FFI_Handler* BootstrapHandler();
// The probe's handlers: a no-op execute, and a record stage that notes the
// record extension's version and requests stream capture where a layout of
// ours proves that call (else it fails, touching nothing).
XLA_FFI_Handler_Bundle RecordProbeBundle();
// After a probe proved the layout: registers Targets(), record handlers
// included, through the bootstrap's API. False (and why in the message) otherwise.
bool RegisterRecordTargets();

struct RecordRegistration {
  bool attempted = false;         // the bootstrap ran
  bool probe_registered = false;  // the core API is checked, and the probe target registered
  bool probe_seen = false;        // a probe record stage ran: record_major/minor are the extension's
  int record_major = -1;
  int record_minor = -1;
  bool registered = false;  // the targets have record handlers
  std::string message;
};
RecordRegistration GetRecordRegistration();

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_HANDLERS_H_
