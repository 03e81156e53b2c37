// Entry points of a library opened at run time (dlopen): NVSHMEM's host
// library, NVIDIA's CuTe DSL runtime library. Never linked, so each entry
// point is looked up by name, and the ones a library lacks are named together.
#ifndef JAX_MOSAIC_FFI_DL_SYMBOLS_H_
#define JAX_MOSAIC_FFI_DL_SYMBOLS_H_

#include <dlfcn.h>

#include <string>

namespace jmf {

// Sets *fn to `name` in `library`; where it is absent, adds the name to
// `*missing` (comma-separated) and returns false.
template <typename Fn>
bool ResolveSymbol(void* library, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (*fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *fn != nullptr;
}

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_DL_SYMBOLS_H_
