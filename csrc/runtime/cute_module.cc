#include "runtime/cute_module.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
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

struct LoweredHostCode {
  std::mutex mutex;
  std::set<KernelHash> hashes;
};

LoweredHostCode& GetLoweredHostCode() {
  static auto* lowered = new LoweredHostCode();
  return *lowered;
}

constexpr char kHostCodeEnv[] = "JAX_MOSAIC_FFI_HOST_CODE";

std::string Hex(const KernelHash& hash) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : hash) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

}  // namespace

void NoteLoweredHostCode(const KernelHash& hash) {
  LoweredHostCode& lowered = GetLoweredHostCode();
  std::lock_guard<std::mutex> lock(lowered.mutex);
  lowered.hashes.insert(hash);
}

bool HostCodeLowered(const KernelHash& hash) {
  LoweredHostCode& lowered = GetLoweredHostCode();
  std::lock_guard<std::mutex> lock(lowered.mutex);
  return lowered.hashes.count(hash) != 0;
}

ffi::Error CheckHostCodePolicy(const KernelHash& hash) {
  const char* set = std::getenv(kHostCodeEnv);
  const std::string policy = set != nullptr ? set : "";
  if (policy.empty() || policy == "any") return ffi::Error::Success();
  if (policy != "lowered") {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(kHostCodeEnv) + "=" + policy.substr(0, 64) +
                          " is neither 'any' nor 'lowered', so no CuTe DSL object runs in this process; set it to "
                          "'lowered' (only objects this process lowered) or 'any'");
  }
  if (HostCodeLowered(hash)) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kPermissionDenied,
                    "HostCodeRefused: the kernel's CuTe DSL object (kernel hash " + Hex(hash).substr(0, 16) +
                        "...) was not lowered by this process, and " + kHostCodeEnv +
                        "=lowered runs only host code this process made: a CuTe DSL object is native x86-64 code "
                        "that would run in this process, so an artifact holding one (a jax.export, a serialized "
                        "executable, a compilation cache entry) is code, like a pickle. Lower the program in this "
                        "process (call the function rather than the artifact), or set " +
                        kHostCodeEnv + "=any where you trust where the artifact came from");
}

const Image* SelectCuteImage(const ParsedModule& module, int arch) {
  const Image* best = nullptr;
  for (const Image& image : module.images) {
    if (image.kind != ImageKind::kCuteObject) continue;
    if (static_cast<int>(image.arch) == arch) return &image;
    // A generic or family build (sm_100f runs on sm_103) of the same major version and a lower minor one runs
    // too, as for cubins (SelectImage); an arch-specific one (sm_100a) on its own arch only.
    if (image.suffix != kSuffixArchSpecific && static_cast<int>(image.arch) / 10 == arch / 10 &&
        static_cast<int>(image.arch) < arch && (best == nullptr || image.arch > best->arch)) {
      best = &image;
    }
  }
  return best;
}

ffi::ErrorOr<std::shared_ptr<CuteModule>> CuteModule::GetOrCreate(std::shared_ptr<const ParsedKernel> kernel,
                                                                  const Image& image) {
  if (ffi::Error refused = CheckHostCodePolicy(kernel->hash); refused.failure()) return refused;
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
