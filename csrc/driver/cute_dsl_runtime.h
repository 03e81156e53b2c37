// NVIDIA's CuTe DSL runtime library (libcute_dsl_runtime.so), opened at run time.
//
// A CuTe DSL kernel reaches us as an object (`dump_to_object`: the host launch
// function plus the cubin) that this library loads and runs. The library is
// under NVIDIA's EULA, so it is never linked, shipped or vendored: it is the
// user's installed nvidia-cutlass-dsl's, whose path and release Python finds
// (jax_mosaic_ffi/cute/package.py) and hands over when the process
// registers the kernel targets (at its first lowering of any program, before
// any executable is compiled, so before a CuTe call's instantiate); it is
// opened on first use and its entry points resolved with dlsym. The few declarations we
// use mirror its public header, CuteDSLRuntime.h.
#ifndef JAX_MOSAIC_FFI_CUTE_DSL_RUNTIME_H_
#define JAX_MOSAIC_FFI_CUTE_DSL_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace jmf {

// CuteDSLRT_Error_t: 0 is success.
using CuteDslError = int;

struct CuteDslRuntime {
  CuteDslError (*module_create_from_bytes)(void** module, const unsigned char* bytes, size_t size,
                                           const char** shared_libs, size_t shared_libs_size) = nullptr;
  CuteDslError (*module_get_function)(void** function, void* module, const char* prefix) = nullptr;
  CuteDslError (*function_run)(void* function, void** args, size_t num_args) = nullptr;
  CuteDslError (*module_destroy)(void* module) = nullptr;
  const char* (*get_error_name)(CuteDslError) = nullptr;
  const char* (*get_error_string)(CuteDslError) = nullptr;
  std::string path;     // the library's own path: the objects it loads resolve their runtime symbols there
  std::string release;  // its nvidia-cutlass-dsl release, as Python read it from the installed package

  // "CuteDSLRT_Error_CudaError (a CUDA error occurred ...)".
  std::string ErrorText(CuteDslError error) const;
};

// Where the library is (its path and release), from Python; may be called
// again with the same values. False with `*error` when it names another
// library than the one already opened.
bool SetCuteDslRuntimeLibrary(const std::string& path, const std::string& release, std::string* error);

// Where Python said the library is: its path, empty until told.
std::string CuteDslRuntimeLibraryPath();

// Why Python could not find the library (a damaged nvidia-cutlass-dsl install), with what to do: what
// GetCuteDslRuntime says while it was never told where the library is, in place of "not installed".
void SetCuteDslRuntimeProblem(const std::string& problem);
std::string CuteDslRuntimeProblem();

// The library, opened on the first call, or nullptr with `*error` saying
// why (never told where it is, or why Python could not find it; missing, or lacking an entry point).
const CuteDslRuntime* GetCuteDslRuntime(std::string* error);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CUTE_DSL_RUNTIME_H_
