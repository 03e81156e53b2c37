// The two caches of the runtime.
//
// * Parsed kernels, process-wide, keyed by the 32-byte kernel hash: the
//   parsed module, shared by every call site and executable that uses it.
// * Loaded modules, keyed by (compiled kernel, CUDA context): a CUmodule is
//   loaded once per device and shared by all executables, and unloaded when
//   the last call-site state holding it is destroyed.
#ifndef JAX_MOSAIC_FFI_KERNEL_CACHE_H_
#define JAX_MOSAIC_FFI_KERNEL_CACHE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "contract/module_format.h"
#include "driver/cuda_driver.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

namespace ffi = xla::ffi;

using KernelHash = std::array<uint8_t, 32>;

// Dynamic shared memory any kernel may take without opting in to more.
inline constexpr int kDefaultDynamicSmemBytes = 48 * 1024;

struct ParsedKernel {
  KernelHash hash;
  ParsedModule module;
};

struct CacheStats {
  std::atomic<int64_t> module_parses{0};           // instantiate found no parsed kernel and parsed the module
  std::atomic<int64_t> parse_cache_hits{0};        // instantiate found it parsed already
  std::atomic<int64_t> module_loads{0};            // cuModuleLoadData calls
  std::atomic<int64_t> loaded_modules{0};          // CUmodules alive now
  std::atomic<int64_t> records_created{0};         // launch commands made by the record stage
  std::atomic<int64_t> instantiations{0};          // instantiate stages run
  std::atomic<int64_t> instantiate_ns{0};          // time spent in them
  std::atomic<int64_t> collective_prepares{0};     // prepare stages run by collective call sites
  std::atomic<int64_t> collective_initializes{0};  // initialize stages likewise
  std::atomic<int64_t> tensor_map_encodes{0};      // cuTensorMapEncodeTiled calls (a buffer moved)
};
CacheStats& GetCacheStats();

// The parsed kernel for `hash`, parsed from `module_bytes` on a miss. The
// parse runs outside the lock; when call sites race, the first result wins
// and all of them share it.
ffi::ErrorOr<std::shared_ptr<const ParsedKernel>> GetOrParseKernel(const KernelHash& hash,
                                                                   std::string_view module_bytes);
void ClearKernelCache();
int64_t KernelCacheSize();

// One kernel loaded into one CUDA context.
class LoadedModule {
 public:
  // Loads `kernel` into `context` (the one its launches will use).
  static ffi::ErrorOr<std::shared_ptr<LoadedModule>> GetOrLoad(const Driver& driver,
                                                               std::shared_ptr<const ParsedKernel> kernel,
                                                               CUcontext context);

  ~LoadedModule();
  LoadedModule(const LoadedModule&) = delete;
  LoadedModule& operator=(const LoadedModule&) = delete;

  CUfunction function() const { return function_; }
  CUcontext context() const { return context_; }
  CUdevice device() const { return device_; }
  const Image& image() const { return *image_; }
  const std::vector<size_t>& param_sizes() const { return param_sizes_; }
  int static_smem_bytes() const { return static_smem_; }
  int max_threads_per_block() const { return max_threads_; }
  int max_dynamic_smem_optin() const { return smem_optin_; }
  int num_registers() const { return num_regs_; }

  // Raises the function's dynamic shared memory limit to `bytes` (and allows
  // non-portable cluster sizes) if a call site needs more than is set.
  ffi::Error Configure(int dynamic_smem_bytes, bool non_portable_cluster, const std::string& who);

 private:
  LoadedModule(const Driver& driver, std::shared_ptr<const ParsedKernel> kernel)
      : driver_(driver), kernel_(std::move(kernel)) {}

  const Driver& driver_;
  std::shared_ptr<const ParsedKernel> kernel_;
  CUcontext context_ = nullptr;
  CUdevice device_ = 0;
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  const Image* image_ = nullptr;
  std::vector<size_t> param_sizes_;
  int static_smem_ = 0;
  int max_threads_ = 0;
  int smem_optin_ = 0;
  int num_regs_ = 0;
  std::mutex configure_mutex_;
  int dynamic_smem_set_ = kDefaultDynamicSmemBytes;
  bool non_portable_cluster_set_ = false;
  bool nvshmem_registered_ = false;  // nvshmemx_cumodule_init ran on module_
};

// The image a device of compute capability `arch` should load, or nullptr.
const Image* SelectImage(const ParsedModule& module, int arch);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_KERNEL_CACHE_H_
