#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace jmf {
namespace {

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);

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
  auto get_proc = reinterpret_cast<GetProcAddressFn>(dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    result.error = "the CUDA driver is too old: it has no cuGetProcAddress_v2 (needs CUDA 12+)";
    return result;
  }
  Driver& d = result.driver;
  std::string missing;
  // Ask for the ABI of the headers we compiled against (CUDA_VERSION).
#define JMF_RESOLVE(name)                                                          \
  {                                                                                \
    void* fn = nullptr;                                                            \
    CUdriverProcAddressQueryResult status;                                         \
    if (get_proc(#name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) != \
            CUDA_SUCCESS ||                                                        \
        fn == nullptr) {                                                           \
      missing += std::string(missing.empty() ? "" : ", ") + #name;                 \
    }                                                                              \
    d.name = reinterpret_cast<decltype(d.name)>(fn);                               \
  }
  JMF_DRIVER_FUNCTIONS(JMF_RESOLVE)
#undef JMF_RESOLVE
  if (!missing.empty()) {
    result.error = "the CUDA driver lacks entry points jax_mosaic_ffi needs (" + missing +
                   "); update the NVIDIA driver";
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
