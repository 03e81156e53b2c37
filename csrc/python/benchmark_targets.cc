// jax_mosaic_ffi._benchmark_targets: baselines the benchmarks compare
// mosaic_kernel with, built only on request (-DJMF_BENCHMARK_TARGETS=ON; see
// scripts/gpu_check.sh). Not part of the custom-call contract.
//
// A hand-made jax.ffi custom call of the usual kind: it decodes its
// attributes on every call and launches a CUfunction (passed as an integer
// attribute) on XLA's stream with cuLaunchKernel. And an empty handler,
// which measures XLA's own cost of a custom call.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "driver/cuda_driver.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {
namespace {

namespace ffi = xla::ffi;

ffi::Error BaselineLaunch(CUstream stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, int64_t function,
                          int32_t grid, int32_t block, int32_t n) {
  static const Driver* driver = GetDriver(nullptr);
  if (driver == nullptr) return ffi::Error::Internal("no CUDA driver");
  void* in = x.untyped_data();
  void* out = y->untyped_data();
  void* params[] = {&in, &out, &n};
  CUresult r = driver->cuLaunchKernel(reinterpret_cast<CUfunction>(function), grid, 1, 1, block, 1, 1, 0, stream,
                                      params, nullptr);
  if (r != CUDA_SUCCESS) return ffi::Error::Internal("launch failed: " + CudaErrorText(*driver, r));
  return ffi::Error::Success();
}

// Launches nothing: what XLA itself spends on a custom call.
ffi::Error NoLaunch(CUstream, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) { return ffi::Error::Success(); }

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jmf_empty_ffi_execute, NoLaunch,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>(),
    {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jmf_baseline_ffi_execute, BaselineLaunch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("function")
                                  .Attr<int32_t>("grid")
                                  .Attr<int32_t>("block")
                                  .Attr<int32_t>("n"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jmf

NB_MODULE(_benchmark_targets, m) {
  m.doc() = "Benchmark baselines for jax_mosaic_ffi (not API).";
  m.def(
      "baseline_ffi_handler", [] { return nanobind::capsule(reinterpret_cast<void*>(jmf::jmf_baseline_ffi_execute)); },
      "A plain hand-made FFI launch handler.");
  m.def(
      "empty_ffi_handler", [] { return nanobind::capsule(reinterpret_cast<void*>(jmf::jmf_empty_ffi_execute)); },
      "An FFI handler that does nothing: XLA's own cost of a custom call.");
}
