#include "peers/nvshmem_runtime.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "ffi/status.h"

namespace jmf {
namespace {

struct State {
  std::mutex mutex;
  NvshmemStarter starter;
  std::atomic<bool> started{false};
  bool finalized = false;
  NvshmemJob job;
  const NvshmemHost* host = nullptr;
};

State& GetState() {
  static State* state = new State();  // outlives every call site, as NVSHMEM does
  return *state;
}

}  // namespace

void SetNvshmemStarter(NvshmemStarter starter) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.starter = std::move(starter);
}

NvshmemJob GetNvshmemJob() {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mutex);
  NvshmemJob job = s.job;
  job.started = s.started.load() && !s.finalized;
  return job;
}

ffi::Error EnsureNvshmemStarted(int32_t device, const std::string& who) {
  State& s = GetState();
  NvshmemStarter starter;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.finalized) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        who + ": NVSHMEM was finalized (the process is exiting); no NVSHMEM kernel can run now");
    }
    if (s.started.load()) {
      if (s.job.device != device) {
        return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                          who + ": NVSHMEM runs one PE per process, bound to GPU " + std::to_string(s.job.device) +
                              " here; this call runs on GPU " + std::to_string(device) +
                              ". Give each process one GPU (CUDA_VISIBLE_DEVICES or local_device_ids)");
      }
      return ffi::Error::Success();
    }
    starter = s.starter;
  }
  if (!starter) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who +
                          ": the kernel uses NVSHMEM, but nothing can start it: import jax_mosaic_ffi in the "
                          "process that runs this program");
  }
  // Without the lock: the starter waits for peers and calls StartNvshmem.
  JMF_RETURN_IF_ERROR(starter(device, who));
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.started.load()) {
    return ffi::Error::Internal(who + ": the NVSHMEM starter returned without starting NVSHMEM");
  }
  return ffi::Error::Success();
}

ffi::Error MakeNvshmemUniqueId(const std::string& path, std::string* id) {
  std::string error;
  const NvshmemHost* host = LoadNvshmemHost(path, &error);
  if (host == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, error);
  NvshmemUniqueId uid{};
  uid.version = NvshmemStructVersion<NvshmemUniqueId>();
  if (int status = host->get_uniqueid(&uid); status != 0) {
    return ffi::Error::Internal("nvshmemx_get_uniqueid failed with status " + std::to_string(status));
  }
  id->assign(reinterpret_cast<const char*>(&uid), sizeof(uid));
  return ffi::Error::Success();
}

ffi::Error StartNvshmem(const Driver& driver, const std::string& path, const std::string& id, int rank, int nranks,
                        int32_t device) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.started.load()) return ffi::Error::Success();
  if (s.finalized) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "NVSHMEM was finalized already");
  if (id.size() != sizeof(NvshmemUniqueId)) {
    return ffi::Error::InvalidArgument("an NVSHMEM unique id is " + std::to_string(sizeof(NvshmemUniqueId)) +
                                       " bytes, got " + std::to_string(id.size()));
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return ffi::Error::InvalidArgument("NVSHMEM rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  }
  std::string error;
  const NvshmemHost* host = LoadNvshmemHost(path, &error);
  if (host == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, error);
  // NVSHMEM binds its PE to the current device: make it this GPU's primary context, XLA's.
  CUdevice cu_device = 0;
  CUcontext context = nullptr;
  if (CUresult r = driver.cuDeviceGet(&cu_device, device); r != CUDA_SUCCESS) {
    return ffi::Error::Internal("cuDeviceGet(" + std::to_string(device) + "): " + CudaErrorText(driver, r));
  }
  if (CUresult r = driver.cuDevicePrimaryCtxRetain(&context, cu_device); r != CUDA_SUCCESS) {
    return ffi::Error::Internal("cuDevicePrimaryCtxRetain: " + CudaErrorText(driver, r));
  }
  ScopedContext scoped(driver, context);
  NvshmemUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  NvshmemInitAttr attr{};
  attr.version = NvshmemStructVersion<NvshmemInitAttr>();
  attr.args.version = NvshmemStructVersion<NvshmemInitArgs>();
  attr.args.uid_args.version = NvshmemStructVersion<NvshmemUniqueIdArgs>();
  attr.args.uid_args.myrank = attr.args.uid_args.nranks = -1;
  if (int status = host->set_attr_uniqueid_args(rank, nranks, &uid, &attr); status != 0) {
    return ffi::Error::Internal("nvshmemx_set_attr_uniqueid_args failed with status " + std::to_string(status));
  }
  if (int status = host->hostlib_init_attr(kNvshmemInitWithUniqueId, &attr); status != 0) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "NVSHMEM did not start (nvshmemx_hostlib_init_attr with a unique id, PE " + std::to_string(rank) +
                          " of " + std::to_string(nranks) + " on GPU " + std::to_string(device) + "): status " +
                          std::to_string(status) +
                          ". NVSHMEM printed why on stderr; NVSHMEM_DEBUG=INFO says more. A common cause: its heap "
                          "(NVSHMEM_SYMMETRIC_SIZE, default 1G) does not fit next to XLA's memory pool, which takes "
                          "75% of the GPU at start; lower XLA_PYTHON_CLIENT_MEM_FRACTION or the heap");
  }
  s.host = host;
  s.job.pe = host->my_pe();
  s.job.npes = host->n_pes();
  s.job.device = device;
  s.started.store(true);
  return ffi::Error::Success();
}

void FinalizeNvshmem() {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.started.load() || s.finalized) return;
  s.finalized = true;
  s.host->hostlib_finalize();
}

ffi::Error RegisterNvshmemModule(CUmodule module, const std::string& who) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.started.load() || s.finalized) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, who + ": NVSHMEM is not running");
  }
  if (int status = s.host->cumodule_init(module); status != 0) {
    return ffi::Error::Internal(who + ": nvshmemx_cumodule_init failed with status " + std::to_string(status) +
                                " (was the kernel linked with another NVSHMEM release than " + s.host->path + "?)");
  }
  s.job.registered_modules++;
  return ffi::Error::Success();
}

void UnregisterNvshmemModule(CUmodule module) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.started.load() || s.finalized) return;  // finalize let go of every module
  s.host->cumodule_finalize(module);
  s.job.registered_modules--;
}

ffi::ErrorOr<void*> NvshmemAlloc(size_t bytes, const std::string& who) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.started.load() || s.finalized) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, who + ": NVSHMEM is not running");
  }
  void* ptr = s.host->malloc(bytes);
  if (ptr == nullptr) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      who + ": NVSHMEM's symmetric heap has no room for " + std::to_string(bytes) + " more bytes (" +
                          std::to_string(s.job.symmetric_bytes) + " bytes in " +
                          std::to_string(s.job.symmetric_buffers) +
                          " buffers already held by jax_mosaic_ffi). Set NVSHMEM_SYMMETRIC_SIZE larger (e.g. 4G) "
                          "before the first NVSHMEM call; it is read once, when NVSHMEM starts");
  }
  s.job.symmetric_bytes += bytes;
  s.job.symmetric_buffers++;
  return ptr;
}

void NvshmemFree(void* ptr, size_t bytes) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (ptr == nullptr || !s.started.load() || s.finalized) return;
  s.host->free(ptr);
  s.job.symmetric_bytes -= bytes;
  s.job.symmetric_buffers--;
}

}  // namespace jmf
