#include "driver/nvshmem_host.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "driver/dl_symbols.h"

namespace jmf {
namespace {

std::mutex load_mutex;
std::atomic<const NvshmemHost*> loaded{nullptr};

}  // namespace

const NvshmemHost* LoadNvshmemHost(const std::string& path, std::string* error) {
  std::lock_guard<std::mutex> lock(load_mutex);
  if (const NvshmemHost* host = loaded.load()) {
    if (host->path == path) return host;
    *error = "NVSHMEM's host library is already loaded from " + host->path + "; it cannot be loaded again from " + path;
    return nullptr;
  }
  // RTLD_GLOBAL: NVSHMEM opens its bootstrap and transport plugins, which
  // resolve symbols of the host library.
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) {
    const char* reason = dlerror();
    *error = "NVSHMEM's host library (" + path + ") could not be loaded: " + (reason ? reason : "unknown reason");
    return nullptr;
  }
  auto* host = new NvshmemHost();  // process-wide, like the library itself
  std::string missing;
  ResolveSymbol(library, "nvshmemx_vendor_get_version_info", &host->vendor_get_version_info, &missing);
  ResolveSymbol(library, "nvshmemx_get_uniqueid", &host->get_uniqueid, &missing);
  ResolveSymbol(library, "nvshmemx_set_attr_uniqueid_args", &host->set_attr_uniqueid_args, &missing);
  ResolveSymbol(library, "nvshmemx_hostlib_init_attr", &host->hostlib_init_attr, &missing);
  ResolveSymbol(library, "nvshmemx_init_status", &host->init_status, &missing);
  ResolveSymbol(library, "nvshmemx_hostlib_finalize", &host->hostlib_finalize, &missing);
  ResolveSymbol(library, "nvshmem_malloc", &host->malloc, &missing);
  ResolveSymbol(library, "nvshmem_free", &host->free, &missing);
  ResolveSymbol(library, "nvshmemx_cumodule_init", &host->cumodule_init, &missing);
  ResolveSymbol(library, "nvshmemx_cumodule_finalize", &host->cumodule_finalize, &missing);
  ResolveSymbol(library, "nvshmem_my_pe", &host->my_pe, &missing);
  ResolveSymbol(library, "nvshmem_n_pes", &host->n_pes, &missing);
  if (!missing.empty()) {
    *error = "NVSHMEM's host library (" + path + ") lacks entry points jax_mosaic_ffi needs (" + missing +
             "); install NVSHMEM 3.x: pip install 'jax_mosaic_ffi[nvshmem]'";
    delete host;
    dlclose(library);
    return nullptr;
  }
  host->vendor_get_version_info(&host->version.major, &host->version.minor, &host->version.patch);
  if (host->version.major != 3) {
    *error = "NVSHMEM's host library (" + path + ") is release " + std::to_string(host->version.major) + "." +
             std::to_string(host->version.minor) + "; jax_mosaic_ffi knows the init structures of 3.x only";
    delete host;
    dlclose(library);
    return nullptr;
  }
  host->path = path;
  loaded.store(host);
  return host;
}

const NvshmemHost* LoadedNvshmemHost() { return loaded.load(); }

}  // namespace jmf
