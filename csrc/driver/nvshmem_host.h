// NVSHMEM's host library (libnvshmem_host.so.3), opened at run time.
//
// Kernels that call NVSHMEM need its host library to start it and to register
// their modules; the extension must import and run without it (the wheel does
// not depend on NVSHMEM), so nothing links against it: the path comes from
// Python (jax_mosaic_ffi/base/nvshmem_package.py) and the entry points are
// resolved with dlsym. NVSHMEM's headers are not available when the extension
// is built either: the few structures the init path passes are mirrored here,
// with the sizes NVSHMEM 3.x's own headers assert (device_host/nvshmem_types.h,
// bootstrap_device_host/nvshmem_uniqueid.h), and each carries its version word.
#ifndef JAX_MOSAIC_FFI_NVSHMEM_HOST_H_
#define JAX_MOSAIC_FFI_NVSHMEM_HOST_H_

#include <cstddef>
#include <string>

#include "cuda.h"

namespace jmf {

// nvshmemx_uniqueid_v1: an opaque 128-byte id, made by one PE, given to all.
struct NvshmemUniqueId {
  int version;
  char internal[124];
};
static_assert(sizeof(NvshmemUniqueId) == 128);

struct NvshmemUniqueIdArgs {  // nvshmemx_uniqueid_args_v1
  int version;
  NvshmemUniqueId* id;
  int myrank;
  int nranks;
};
static_assert(sizeof(NvshmemUniqueIdArgs) == 24);

struct NvshmemInitArgs {  // nvshmemx_init_args_v1
  int version;
  NvshmemUniqueIdArgs uid_args;
  char content[96];
};
static_assert(sizeof(NvshmemInitArgs) == 128);

struct NvshmemInitAttr {  // nvshmemx_init_attr_v1
  int version;
  void* mpi_comm;
  NvshmemInitArgs args;
};
static_assert(sizeof(NvshmemInitAttr) == 144);

struct NvshmemVersion {  // nvshmemi_version_t
  int major, minor, patch;
};

// NVSHMEMX_INIT_WITH_UNIQUEID.
inline constexpr unsigned kNvshmemInitWithUniqueId = 1u << 3;
// The version words of the mirrored structures: (1 << 16) + size.
template <typename T>
constexpr int NvshmemStructVersion() {
  return (1 << 16) + static_cast<int>(sizeof(T));
}

struct NvshmemHost {
  void (*vendor_get_version_info)(int*, int*, int*) = nullptr;
  int (*get_uniqueid)(NvshmemUniqueId*) = nullptr;
  int (*set_attr_uniqueid_args)(int, int, const NvshmemUniqueId*, NvshmemInitAttr*) = nullptr;
  // The host library's own init and finalize. nvshmemx_init_attr (an inline of the headers) calls
  // nvshmemi_init_thread, which lives in the static device library an nvcc program links and registers
  // that program's device state, and exit(-1)s on failure; our kernels' device state is registered per
  // module instead (cumodule_init), which is what the hostlib entry points are for.
  int (*hostlib_init_attr)(unsigned, NvshmemInitAttr*) = nullptr;
  int (*init_status)() = nullptr;
  void (*hostlib_finalize)() = nullptr;
  void* (*malloc)(size_t) = nullptr;
  void (*free)(void*) = nullptr;
  int (*cumodule_init)(CUmodule) = nullptr;
  int (*cumodule_finalize)(CUmodule) = nullptr;
  int (*my_pe)() = nullptr;
  int (*n_pes)() = nullptr;
  NvshmemVersion version{};
  std::string path;
};

// The host library at `path`, opened on the first call (later calls must
// name the same file), or nullptr with `*error` saying why.
const NvshmemHost* LoadNvshmemHost(const std::string& path, std::string* error);

// The library opened by LoadNvshmemHost, or nullptr.
const NvshmemHost* LoadedNvshmemHost();

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_NVSHMEM_HOST_H_
