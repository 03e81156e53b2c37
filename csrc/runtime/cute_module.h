// CuTe DSL objects loaded by NVIDIA's runtime library (driver/cute_dsl_runtime.h).
//
// One module per compiled kernel in the process: the runtime library loads an
// object's cubin as a context-independent CUDA library, for every device at
// once, so unlike a CUmodule it is not per context. It is created at
// instantiate (never inside a stream capture: its creation loads code and sets
// function attributes, which are not stream work) and destroyed with
// CuteDSLRT_Module_Destroy when the last call-site state holding it dies.
#ifndef JAX_MOSAIC_FFI_CUTE_MODULE_H_
#define JAX_MOSAIC_FFI_CUTE_MODULE_H_

#include <memory>
#include <string>

#include "contract/module_format.h"
#include "driver/cute_dsl_runtime.h"
#include "runtime/kernel_cache.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

class CuteModule {
 public:
  // The module of `image` (a CuTe DSL object of `kernel`), created on a miss.
  static ffi::ErrorOr<std::shared_ptr<CuteModule>> GetOrCreate(std::shared_ptr<const ParsedKernel> kernel,
                                                               const Image& image);
  ~CuteModule();
  CuteModule(const CuteModule&) = delete;
  CuteModule& operator=(const CuteModule&) = delete;

  const CuteDslRuntime& runtime() const { return *runtime_; }
  void* function() const { return function_; }
  const Image& image() const { return *image_; }

 private:
  CuteModule() = default;

  std::shared_ptr<const ParsedKernel> kernel_;
  const Image* image_ = nullptr;
  const CuteDslRuntime* runtime_ = nullptr;
  void* module_ = nullptr;
  void* function_ = nullptr;
};

// The CuTe DSL object of `module` that a GPU of compute capability `arch` runs, or nullptr.
const Image* SelectCuteImage(const ParsedModule& module, int arch);

// Host code this process made. A CuTe DSL object is native code NVIDIA's runtime links into the process, so
// JAX_MOSAIC_FFI_HOST_CODE may restrict which run (docs/threat_model.md): "any" (the default) runs every one;
// "lowered" only those of kernels this process lowered itself, which Python's lowering notes here by kernel hash
// (the runtime checks each module against its hash when it parses it, so a noted hash names exactly the bytes
// that were lowered); any other value runs none. A deserialized jax.export artifact or executable whose CuTe DSL
// object this process did not lower is then refused at instantiate, before the runtime library sees it.
void NoteLoweredHostCode(const KernelHash& hash);
bool HostCodeLowered(const KernelHash& hash);
// Success, or the error refusing the object of kernel `hash` under JAX_MOSAIC_FFI_HOST_CODE (read each time).
ffi::Error CheckHostCodePolicy(const KernelHash& hash);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CUTE_MODULE_H_
