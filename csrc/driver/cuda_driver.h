// ===== csrc/driver/: the CUDA driver API and the runtime's own kernels =====
// May include: the standard library, POSIX headers, cuda.h, and
// csrc/contract/. Not XLA, not nanobind, not the folders above: errors are
// reported as std::string, the way the contract reports them. Layers:
// contract <- driver <- ffi <- peers <- runtime <- python
// (scripts/check_csrc_layers.py).
//
// The CUDA driver API, loaded from libcuda at first use.
//
// The extension must import on machines without a GPU (CI, export hosts), so
// nothing links against libcuda: the entry points are resolved through
// cuGetProcAddress the first time a handler needs the driver.
#ifndef JAX_MOSAIC_FFI_CUDA_DRIVER_H_
#define JAX_MOSAIC_FFI_CUDA_DRIVER_H_

#include <string>

#include "cuda.h"

namespace jmf {

#define JMF_DRIVER_FUNCTIONS(X)         \
  X(cuInit)                             \
  X(cuDriverGetVersion)                 \
  X(cuGetErrorName)                     \
  X(cuGetErrorString)                   \
  X(cuCtxGetCurrent)                    \
  X(cuCtxGetDevice)                     \
  X(cuStreamGetCtx)                     \
  X(cuCtxPushCurrent)                   \
  X(cuCtxPopCurrent)                    \
  X(cuDeviceGet)                        \
  X(cuDeviceGetCount)                   \
  X(cuDeviceGetName)                    \
  X(cuDeviceGetAttribute)               \
  X(cuDevicePrimaryCtxRetain)           \
  X(cuDeviceCanAccessPeer)              \
  X(cuCtxEnablePeerAccess)              \
  X(cuModuleLoadDataEx)                 \
  X(cuModuleUnload)                     \
  X(cuModuleGetFunction)                \
  X(cuFuncSetAttribute)                 \
  X(cuFuncGetAttribute)                 \
  X(cuFuncGetParamInfo)                 \
  X(cuLaunchKernel)                     \
  X(cuLaunchKernelEx)                   \
  X(cuOccupancyMaxPotentialClusterSize) \
  X(cuMemAlloc)                         \
  X(cuMemFree)                          \
  X(cuMemsetD8)                         \
  X(cuMemsetD8Async)                    \
  X(cuMemcpyHtoD)                       \
  X(cuMemcpyHtoDAsync)                  \
  X(cuMemGetInfo)                       \
  X(cuStreamSynchronize)                \
  X(cuStreamIsCapturing)                \
  X(cuTensorMapEncodeTiled)             \
  X(cuCtxSynchronize)                   \
  X(cuMemcpyDtoDAsync)                  \
  X(cuIpcGetMemHandle)                  \
  X(cuIpcOpenMemHandle)                 \
  X(cuIpcCloseMemHandle)

struct Driver {
#define JMF_DECLARE_DRIVER_FIELD(name) decltype(&::name) name = nullptr;
  JMF_DRIVER_FUNCTIONS(JMF_DECLARE_DRIVER_FIELD)
#undef JMF_DECLARE_DRIVER_FIELD
  int version = 0;  // e.g. 13000
};

// The process-wide driver, or nullptr with `*error` saying why (no libcuda,
// cuInit failed). Thread-safe; loads once.
const Driver* GetDriver(std::string* error);

// "CUDA_ERROR_INVALID_VALUE (invalid argument)".
std::string CudaErrorText(const Driver& driver, CUresult result);

// Makes `context` current for the lifetime of the guard.
class ScopedContext {
 public:
  ScopedContext(const Driver& driver, CUcontext context);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver& driver_;
  bool pushed_ = false;
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CUDA_DRIVER_H_
