#include "driver/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace jmf {
namespace {

// The exported symbol our declaration of `name` refers to: cuda.h maps
// names to ABI versions with macros (cuMemAlloc -> cuMemAlloc_v2), so the
// name is stringified after expansion. Looking up the exact symbol avoids
// cuGetProcAddress's version mapping, which can hand back a newer ABI of
// the same name (cuStreamGetCtx -> cuStreamGetCtx_v2, with another signature).
#define JMF_SYMBOL(name) JMF_SYMBOL_EXPANDED(name)
#define JMF_SYMBOL_EXPANDED(name) #name

struct LoadResult {
  Driver driver;
  std::string error;
  bool ok = false;
};

LoadResult Load() {
  LoadResult result;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* reason = dlerror();
    result.error = std::string("the CUDA driver (libcuda.so.1) could not be loaded: ") +
                   (reason ? reason : "unknown reason") +
                   ". jax_mosaic_ffi launches kernels only on a machine with an NVIDIA GPU and driver";
    return result;
  }
  Driver& d = result.driver;
  std::string missing;
#define JMF_RESOLVE(name)                                                        \
  d.name = reinterpret_cast<decltype(d.name)>(dlsym(library, JMF_SYMBOL(name))); \
  if (d.name == nullptr) missing += std::string(missing.empty() ? "" : ", ") + JMF_SYMBOL(name);
  JMF_DRIVER_FUNCTIONS(JMF_RESOLVE)
#undef JMF_RESOLVE
  if (!missing.empty()) {
    result.error =
        "the CUDA driver lacks entry points jax_mosaic_ffi needs (" + missing + "); update the NVIDIA driver";
    return result;
  }
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    result.error = "cuInit failed: " + CudaErrorText(d, r);
    return result;
  }
  d.cuDriverGetVersion(&d.version);
  result.ok = true;
  return result;
}

}  // namespace

const Driver* GetDriver(std::string* error) {
  static const LoadResult* loaded = new LoadResult(Load());
  if (!loaded->ok) {
    if (error != nullptr) *error = loaded->error;
    return nullptr;
  }
  return &loaded->driver;
}

std::string CudaErrorText(const Driver& driver, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.cuGetErrorName != nullptr) driver.cuGetErrorName(result, &name);
  if (driver.cuGetErrorString != nullptr) driver.cuGetErrorString(result, &text);
  return std::string(name ? name : "CUDA_ERROR_UNKNOWN") + " (" +
         (text ? text : "error " + std::to_string(static_cast<int>(result))) + ")";
}

ScopedContext::ScopedContext(const Driver& driver, CUcontext context) : driver_(driver) {
  pushed_ = context != nullptr && driver_.cuCtxPushCurrent(context) == CUDA_SUCCESS;
}

ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext ignored;
    driver_.cuCtxPopCurrent(&ignored);
  }
}

}  // namespace jmf
