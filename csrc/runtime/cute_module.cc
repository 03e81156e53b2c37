#include "runtime/cute_module.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace jmf {
namespace {

struct CuteModuleCache {
  std::mutex mutex;
  std::map<const Image*, std::weak_ptr<CuteModule>> modules;
};

CuteModuleCache& GetCuteModuleCache() {
  static auto* cache = new CuteModuleCache();  // never destroyed: outlives XLA's states
  return *cache;
}

}  // namespace

const Image* SelectCuteImage(const ParsedModule& module, int arch) {
  const Image* best = nullptr;
  for (const Image& image : module.images) {
    if (image.kind != ImageKind::kCuteObject) continue;
    if (static_cast<int>(image.arch) == arch) return &image;
    // A generic (no suffix) build of the same major version and a lower minor one runs too.
    if (image.suffix == 0 && static_cast<int>(image.arch) / 10 == arch / 10 && static_cast<int>(image.arch) < arch &&
        (best == nullptr || image.arch > best->arch)) {
      best = &image;
    }
  }
  return best;
}

ffi::ErrorOr<std::shared_ptr<CuteModule>> CuteModule::GetOrCreate(std::shared_ptr<const ParsedKernel> kernel,
                                                                  const Image& image) {
  std::string error;
  const CuteDslRuntime* runtime = GetCuteDslRuntime(&error);
  if (runtime == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, error);
  if (image.dsl_version != runtime->release) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "the kernel was compiled by CuTe DSL (nvidia-cutlass-dsl) " + image.dsl_version +
                          ", but the runtime library installed here is " + runtime->release + " (" + runtime->path +
                          "); the DSL's objects run only on the runtime of their own release. Install "
                          "nvidia-cutlass-dsl[cu13]==" +
                          image.dsl_version + ", or compile (and export) the kernel again with " + runtime->release);
  }
  CuteModuleCache& cache = GetCuteModuleCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (auto it = cache.modules.find(&image); it != cache.modules.end()) {
    if (auto alive = it->second.lock()) return alive;
  }
  std::shared_ptr<CuteModule> created(new CuteModule());
  created->kernel_ = std::move(kernel);
  created->image_ = &image;
  created->runtime_ = runtime;
  const char* libraries[] = {runtime->path.c_str()};
  if (CuteDslError e = runtime->module_create_from_bytes(&created->module_,
                                                         reinterpret_cast<const unsigned char*>(image.data.data()),
                                                         image.data.size(), libraries, 1);
      e != 0) {
    created->module_ = nullptr;
    return ffi::Error::Internal("the CuTe DSL runtime could not load the kernel's object (" +
                                std::to_string(image.data.size()) + " bytes, sm_" + ArchName(image) +
                                "): " + runtime->ErrorText(e));
  }
  const std::string& prefix = created->kernel_->module.symbol;
  if (CuteDslError e = runtime->module_get_function(&created->function_, created->module_, prefix.c_str()); e != 0) {
    return ffi::Error::Internal("the kernel's CuTe DSL object has no function '" + prefix +
                                "': " + runtime->ErrorText(e));
  }
  GetCacheStats().module_loads++;
  GetCacheStats().loaded_modules++;
  for (auto it = cache.modules.begin(); it != cache.modules.end();) {
    it = it->second.expired() ? cache.modules.erase(it) : std::next(it);
  }
  cache.modules[&image] = created;
  return created;
}

CuteModule::~CuteModule() {
  if (module_ == nullptr) return;
  runtime_->module_destroy(module_);
  if (function_ != nullptr) GetCacheStats().loaded_modules--;
}

}  // namespace jmf
