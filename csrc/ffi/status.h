// ===== csrc/ffi/: what every FFI stage is written with =====
// Error plumbing (this file), a call's buffers (buffers.h) and the
// command-buffer record extension (record.h). May include: the standard
// library, POSIX headers, cuda.h, the XLA FFI headers (xla/ffi/api/),
// csrc/driver/ and csrc/contract/. Not nanobind, not peers/, runtime/ or
// python/. Layers: contract <- driver <- ffi <- peers <- runtime <- python
// (scripts/check_csrc_layers.py).
//
// Error plumbing for the FFI stages: early returns, CUDA results with context,
// and durations as messages write them.
#ifndef JAX_MOSAIC_FFI_STATUS_H_
#define JAX_MOSAIC_FFI_STATUS_H_

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "driver/cuda_driver.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

namespace ffi = xla::ffi;

#define JMF_CONCAT_INNER(a, b) a##b
#define JMF_CONCAT(a, b) JMF_CONCAT_INNER(a, b)

// Returns the error of an ffi::Error expression that failed.
#define JMF_RETURN_IF_ERROR(expr)                                      \
  do {                                                                 \
    if (::xla::ffi::Error jmf_error_ = (expr); jmf_error_.failure()) { \
      return jmf_error_;                                               \
    }                                                                  \
  } while (0)

// `JMF_ASSIGN_OR_RETURN(auto x, ErrorOr expression)`: the value, or return the error.
#define JMF_ASSIGN_OR_RETURN(lhs, expr) JMF_ASSIGN_OR_RETURN_IMPL(JMF_CONCAT(jmf_or_, __LINE__), lhs, expr)
#define JMF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.has_value()) return tmp.error();       \
  lhs = std::move(*tmp)

// An ffi::Error for a failed driver call: "<who>: <what>: CUDA_ERROR_... (text)".
inline ffi::Error CudaFailure(const Driver& driver, CUresult result, const std::string& who, const std::string& what,
                              ffi::ErrorCode code = ffi::ErrorCode::kInternal) {
  return ffi::Error(code, who + ": " + what + ": " + CudaErrorText(driver, result));
}

// Success, or CudaFailure for a driver result.
inline ffi::Error CudaCheck(const Driver& driver, CUresult result, const std::string& who, const char* what) {
  if (result == CUDA_SUCCESS) [[likely]]
    return ffi::Error::Success();
  return CudaFailure(driver, result, who, what);
}

// A duration in seconds as messages write it ("10", "0.2"): how long a peer was waited for.
inline std::string Seconds(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", duration.count() / 1000.0);
  return text;
}

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_STATUS_H_
