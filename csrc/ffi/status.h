// Error plumbing for the FFI stages: early returns and CUDA results with context.
#ifndef JAX_MOSAIC_FFI_STATUS_H_
#define JAX_MOSAIC_FFI_STATUS_H_

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

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_STATUS_H_
