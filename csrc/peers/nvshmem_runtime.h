// The NVSHMEM job of this process: one PE, bound to one local GPU.
//
// Started once, on the first call site that loads a kernel using NVSHMEM,
// through a starter Python registers (jax_mosaic_ffi/call/peers/nvshmem.py: who the
// peers are, the unique id traded through jax.distributed's key-value store,
// the checks that peers agree); the starter calls StartNvshmem. Modules that
// use NVSHMEM are registered with it as they load (nvshmemx_cumodule_init).
// Symmetric buffers come from nvshmem_malloc. Finalized by Python at exit.
#ifndef JAX_MOSAIC_FFI_NVSHMEM_RUNTIME_H_
#define JAX_MOSAIC_FFI_NVSHMEM_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "driver/cuda_driver.h"
#include "driver/nvshmem_host.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

namespace ffi = xla::ffi;

// Starts NVSHMEM for local GPU `device` (by calling StartNvshmem), or says why not.
using NvshmemStarter = std::function<ffi::Error(int32_t device, const std::string& who)>;
void SetNvshmemStarter(NvshmemStarter starter);

struct NvshmemJob {
  bool started = false;
  int pe = -1, npes = 0;
  int32_t device = -1;
  size_t symmetric_bytes = 0;  // live nvshmem_malloc bytes of the runtime
  int64_t symmetric_buffers = 0;
  int64_t registered_modules = 0;
};
NvshmemJob GetNvshmemJob();

// NVSHMEM runs for `device`, started now (by the starter) if it was not.
ffi::Error EnsureNvshmemStarted(int32_t device, const std::string& who);

// A fresh unique id (128 bytes) from the host library at `path`: PE 0 makes it, every PE inits with it.
ffi::Error MakeNvshmemUniqueId(const std::string& path, std::string* id);

// nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID) as PE `rank` of `nranks` on local GPU `device`.
ffi::Error StartNvshmem(const Driver& driver, const std::string& path, const std::string& id, int rank, int nranks,
                        int32_t device);

// nvshmemx_hostlib_finalize, once; modules still loaded are then left alone.
void FinalizeNvshmem();

// nvshmemx_cumodule_init / _finalize of a loaded module (its context current).
ffi::Error RegisterNvshmemModule(CUmodule module, const std::string& who);
void UnregisterNvshmemModule(CUmodule module);

// nvshmem_malloc (collective: every PE allocates the same sizes in the same order), and nvshmem_free.
ffi::ErrorOr<void*> NvshmemAlloc(size_t bytes, const std::string& who);
void NvshmemFree(void* ptr, size_t bytes);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_NVSHMEM_RUNTIME_H_
