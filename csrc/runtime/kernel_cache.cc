#include "runtime/kernel_cache.h"

#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "driver/openssl_sha256.h"
#include "driver/zlib_inflate.h"
#include "ffi/status.h"
#include "peers/nvshmem_runtime.h"

namespace jmf {
namespace {

struct KernelCache {
  std::mutex mutex;
  std::map<KernelHash, std::shared_ptr<const ParsedKernel>> kernels;
};

KernelCache& GetKernelCache() {
  static auto* cache = new KernelCache();  // never destroyed: outlives XLA's states
  return *cache;
}

struct LoadedModuleCache {
  std::mutex mutex;
  std::map<std::pair<const ParsedKernel*, CUcontext>, std::weak_ptr<LoadedModule>> modules;
};

LoadedModuleCache& GetLoadedModuleCache() {
  static auto* cache = new LoadedModuleCache();
  return *cache;
}

}  // namespace

CacheStats& GetCacheStats() {
  static auto* stats = new CacheStats();
  return *stats;
}

ffi::ErrorOr<std::shared_ptr<const ParsedKernel>> GetOrParseKernel(const KernelHash& hash,
                                                                   std::string_view module_bytes) {
  KernelCache& cache = GetKernelCache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (auto it = cache.kernels.find(hash); it != cache.kernels.end()) {
      GetCacheStats().parse_cache_hits++;
      return it->second;
    }
  }
  // Once per module, here on a miss: the cache is keyed by the hash, so a module parsed under a hash that is not
  // its own would be what every later call of that hash runs (and what JAX_MOSAIC_FFI_HOST_CODE=lowered trusts).
  KernelHash digest;
  std::string digest_error;
  if (!Sha256(module_bytes, &digest, &digest_error)) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, digest_error);
  }
  if (digest != hash) {
    return ffi::Error::InvalidArgument(
        "kernel_hash is not the sha256 of the module the call carries (" + std::to_string(module_bytes.size()) +
        " bytes): the program was edited after it was lowered. Lower it again with jax_mosaic_ffi");
  }
  auto kernel = std::make_shared<ParsedKernel>();
  kernel->hash = hash;
  std::string error;
  if (!ParseModule(module_bytes, &InflateZlib, &kernel->module, &error)) {
    return ffi::Error::InvalidArgument(error);
  }
  GetCacheStats().module_parses++;
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto [it, inserted] = cache.kernels.try_emplace(hash, std::move(kernel));
  return it->second;
}

void ClearKernelCache() {
  KernelCache& cache = GetKernelCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.kernels.clear();
}

int64_t KernelCacheSize() {
  KernelCache& cache = GetKernelCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return static_cast<int64_t>(cache.kernels.size());
}

const Image* SelectImage(const ParsedModule& module, int arch) {
  const Image* best = nullptr;
  // 1. A cubin built for exactly this arch.
  for (const Image& image : module.images) {
    if (image.kind == ImageKind::kCubin && static_cast<int>(image.arch) == arch) return &image;
  }
  // 2. A generic or family cubin (sm_100f runs on sm_103) of the same major
  // version and a lower minor one. An arch-specific one (sm_90a) runs on its
  // own arch only.
  for (const Image& image : module.images) {
    if (image.kind == ImageKind::kCubin && image.suffix != kSuffixArchSpecific &&
        static_cast<int>(image.arch) / 10 == arch / 10 && static_cast<int>(image.arch) < arch &&
        (best == nullptr || image.arch > best->arch)) {
      best = &image;
    }
  }
  if (best != nullptr) return best;
  // 3. PTX the driver can compile for this arch: generic PTX for any arch at
  // or above its own, family PTX within its major version, arch-specific PTX
  // for its own arch only.
  for (const Image& image : module.images) {
    const int own = static_cast<int>(image.arch);
    const bool fits = image.suffix == kSuffixArchSpecific ? own == arch
                      : image.suffix == kSuffixFamily     ? own / 10 == arch / 10 && own <= arch
                                                          : own <= arch;
    if (image.kind == ImageKind::kPtx && fits && (best == nullptr || image.arch > best->arch)) {
      best = &image;
    }
  }
  return best;
}

ffi::ErrorOr<std::shared_ptr<LoadedModule>> LoadedModule::GetOrLoad(const Driver& driver,
                                                                    std::shared_ptr<const ParsedKernel> kernel,
                                                                    CUcontext context) {
  LoadedModuleCache& cache = GetLoadedModuleCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto key = std::make_pair(kernel.get(), context);
  if (auto it = cache.modules.find(key); it != cache.modules.end()) {
    if (auto alive = it->second.lock()) return alive;
  }
  const ParsedModule& parsed = kernel->module;
  std::shared_ptr<LoadedModule> loaded(new LoadedModule(driver, kernel));
  loaded->context_ = context;
  ScopedContext scoped(driver, context);
  auto fail = [&](const std::string& what, CUresult r) {
    return ffi::Error::Internal("loading kernel '" + parsed.symbol + "': " + what + ": " + CudaErrorText(driver, r));
  };
  if (CUresult r = driver.cuCtxGetDevice(&loaded->device_); r != CUDA_SUCCESS) {
    return fail("cuCtxGetDevice", r);
  }
  int major = 0, minor = 0;
  driver.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, loaded->device_);
  driver.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, loaded->device_);
  const int arch = major * 10 + minor;
  loaded->image_ = SelectImage(parsed, arch);
  if (loaded->image_ == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "kernel '" + parsed.symbol + "' has no code this GPU (sm_" + std::to_string(arch) +
                          ") can run: the module holds " + DescribeImages(parsed) + ". Compile it with targets=('sm_" +
                          std::to_string(arch) + "',)");
  }
  char error_log[16384] = {0};
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof(error_log) - 1))};
  CUresult r = driver.cuModuleLoadDataEx(&loaded->module_, loaded->image_->data.c_str(), 2, options, values);
  if (r != CUDA_SUCCESS) {
    std::string message = "the driver could not load the " +
                          std::string(loaded->image_->kind == ImageKind::kPtx ? "PTX (compute_" : "cubin (sm_") +
                          ArchName(*loaded->image_) + ") on sm_" + std::to_string(arch) + ": " +
                          CudaErrorText(driver, r);
    if (error_log[0] != '\0') message += "\nJIT log:\n" + std::string(error_log);
    if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
      message += "\nThe PTX is newer than this driver (CUDA " + std::to_string(driver.version / 1000) + "." +
                 std::to_string(driver.version % 1000 / 10) + ") compiles; build a cubin for this GPU (targets=('sm_" +
                 std::to_string(arch) + "',)) or use an NVRTC no newer than the driver";
    }
    loaded->module_ = nullptr;
    return ffi::Error::Internal("kernel '" + parsed.symbol + "': " + message);
  }
  GetCacheStats().module_loads++;
  GetCacheStats().loaded_modules++;
  if ((parsed.flags & kFlagNvshmem) != 0) {  // its NVSHMEM device state must point at this process's job
    JMF_RETURN_IF_ERROR(RegisterNvshmemModule(loaded->module_, "kernel '" + parsed.symbol + "'"));
    loaded->nvshmem_registered_ = true;
  }
  if (CUresult r = driver.cuModuleGetFunction(&loaded->function_, loaded->module_, parsed.symbol.c_str());
      r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_NOT_FOUND) {
      return ffi::Error(ffi::ErrorCode::kNotFound,
                        "the module has no kernel named '" + parsed.symbol +
                            "'. For a C++ kernel in a cubin pass its mangled name (cuobjdump "
                            "--dump-elf-symbols lists them), or declare it extern \"C\"");
    }
    return fail("cuModuleGetFunction", r);
  }
  for (size_t i = 0; i < 4096; ++i) {
    size_t offset = 0, size = 0;
    if (driver.cuFuncGetParamInfo(loaded->function_, i, &offset, &size) != CUDA_SUCCESS) break;
    loaded->param_sizes_.push_back(size);
  }
  driver.cuFuncGetAttribute(&loaded->static_smem_, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, loaded->function_);
  driver.cuFuncGetAttribute(&loaded->max_threads_, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, loaded->function_);
  driver.cuFuncGetAttribute(&loaded->num_regs_, CU_FUNC_ATTRIBUTE_NUM_REGS, loaded->function_);
  driver.cuDeviceGetAttribute(&loaded->smem_optin_, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                              loaded->device_);
  for (auto it = cache.modules.begin(); it != cache.modules.end();) {
    it = it->second.expired() ? cache.modules.erase(it) : std::next(it);
  }
  cache.modules[key] = loaded;
  return loaded;
}

LoadedModule::~LoadedModule() {
  if (module_ == nullptr) return;
  ScopedContext scoped(driver_, context_);
  if (nvshmem_registered_) UnregisterNvshmemModule(module_);
  driver_.cuModuleUnload(module_);
  GetCacheStats().loaded_modules--;
}

ffi::Error LoadedModule::Configure(int dynamic_smem_bytes, bool non_portable_cluster, const std::string& who) {
  std::lock_guard<std::mutex> lock(configure_mutex_);
  if (dynamic_smem_bytes > dynamic_smem_set_) {
    if (CUresult r =
            driver_.cuFuncSetAttribute(function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem_bytes);
        r != CUDA_SUCCESS) {
      return ffi::Error::InvalidArgument(who + ": cannot give the kernel " + std::to_string(dynamic_smem_bytes) +
                                         " bytes of dynamic shared memory: " + CudaErrorText(driver_, r) +
                                         ". This GPU allows " + std::to_string(smem_optin_) +
                                         " bytes per block, and the kernel already uses " +
                                         std::to_string(static_smem_) + " bytes statically; lower smem_bytes");
    }
    dynamic_smem_set_ = dynamic_smem_bytes;
  }
  if (non_portable_cluster && !non_portable_cluster_set_) {
    if (CUresult r = driver_.cuFuncSetAttribute(function_, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
        r != CUDA_SUCCESS) {
      return ffi::Error::InvalidArgument(
          who + ": this GPU does not allow clusters of more than 8 blocks: " + CudaErrorText(driver_, r));
    }
    non_portable_cluster_set_ = true;
  }
  return ffi::Error::Success();
}

}  // namespace jmf
