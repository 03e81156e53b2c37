#include "driver/cute_dsl_runtime.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "driver/dl_symbols.h"

namespace jmf {
namespace {

constexpr char kInstall[] =
    "CuTe DSL kernels run through NVIDIA's CuTe DSL runtime library (libcute_dsl_runtime.so, in "
    "nvidia-cutlass-dsl's cu13 libraries): pip install 'jax_mosaic_ffi[cute]'";

std::mutex mutex;
std::string wanted_path, wanted_release;  // under mutex
std::string problem;                      // under mutex: why Python could not find the library, if it could not
std::atomic<const CuteDslRuntime*> opened{nullptr};

}  // namespace

std::string CuteDslRuntime::ErrorText(CuteDslError error) const {
  const char* name = get_error_name ? get_error_name(error) : nullptr;
  const char* text = get_error_string ? get_error_string(error) : nullptr;
  return std::string(name ? name : "CuteDSLRT error") + " " + std::to_string(error) +
         (text ? std::string(" (") + text + ")" : "");
}

bool SetCuteDslRuntimeLibrary(const std::string& path, const std::string& release, std::string* error) {
  std::lock_guard<std::mutex> lock(mutex);
  if (const CuteDslRuntime* runtime = opened.load(); runtime != nullptr && runtime->path != path) {
    *error =
        "the CuTe DSL runtime library is already open from " + runtime->path + "; it cannot be switched to " + path;
    return false;
  }
  wanted_path = path;
  wanted_release = release;
  return true;
}

std::string CuteDslRuntimeLibraryPath() {
  std::lock_guard<std::mutex> lock(mutex);
  return wanted_path;
}

void SetCuteDslRuntimeProblem(const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex);
  problem = text;
}

std::string CuteDslRuntimeProblem() {
  std::lock_guard<std::mutex> lock(mutex);
  return problem;
}

const CuteDslRuntime* GetCuteDslRuntime(std::string* error) {
  if (const CuteDslRuntime* runtime = opened.load(std::memory_order_acquire)) return runtime;
  std::lock_guard<std::mutex> lock(mutex);
  if (const CuteDslRuntime* runtime = opened.load()) return runtime;
  if (wanted_path.empty() && !problem.empty()) {
    *error = problem;
    return nullptr;
  }
  if (wanted_path.empty()) {
    *error = std::string(
                 "no CuTe DSL runtime library was found in this process (jax_mosaic_ffi looks for it when it "
                 "registers its kernel targets, at the first program jax lowers or at jmf.register()). ") +
             kInstall;
    return nullptr;
  }
  // RTLD_LOCAL: nothing else in the process should bind to its symbols; the objects it loads name it
  // explicitly (the shared_libs of CuteDSLRT_Module_Create_From_Bytes).
  void* library = dlopen(wanted_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* reason = dlerror();
    *error = "the CuTe DSL runtime library (" + wanted_path +
             ") could not be loaded: " + (reason ? reason : "unknown reason") + ". " + kInstall;
    return nullptr;
  }
  auto* runtime = new CuteDslRuntime();  // process-wide, like the library itself
  std::string missing;
  ResolveSymbol(library, "CuteDSLRT_Module_Create_From_Bytes", &runtime->module_create_from_bytes, &missing);
  ResolveSymbol(library, "CuteDSLRT_Module_Get_Function", &runtime->module_get_function, &missing);
  ResolveSymbol(library, "CuteDSLRT_Function_Run", &runtime->function_run, &missing);
  ResolveSymbol(library, "CuteDSLRT_Module_Destroy", &runtime->module_destroy, &missing);
  ResolveSymbol(library, "CuteDSLRT_GetErrorName", &runtime->get_error_name, &missing);
  ResolveSymbol(library, "CuteDSLRT_GetErrorString", &runtime->get_error_string, &missing);
  if (!missing.empty()) {
    *error = "the CuTe DSL runtime library (" + wanted_path + ") lacks entry points jax_mosaic_ffi needs (" + missing +
             "). " + kInstall;
    delete runtime;
    dlclose(library);
    return nullptr;
  }
  runtime->path = wanted_path;
  runtime->release = wanted_release;
  opened.store(runtime, std::memory_order_release);
  return runtime;
}

}  // namespace jmf
