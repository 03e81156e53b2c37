// A CuTe DSL object checked before NVIDIA's runtime library sees it.
//
// The object (`dump_to_object`) is an x86-64 ELF relocatable that NVIDIA's
// CuTe DSL runtime links into this process and runs (its `_cuda_init` runs at
// instantiate): native host code, which can arrive from an artifact anyone
// edited (docs/threat_model.md). What it must be is checked here with bounded
// parsing, so that a file that is not such an object never reaches that
// runtime, which aborts the process on some of them (a missing entry point
// throws through its C API): the ELF header (64-bit little-endian x86-64
// relocatable), a sane section table with every offset and size within the
// file, one symbol table whose names and sections are in range, relocations
// that name symbols and offsets in range, and the entry points the runtime
// looks up by the module's prefix, defined where they must be: the host
// function's name (which names a function of the object), the kernel table
// (JSON the runtime reads: kernel names mapping attribute numbers to
// integers), the object format's version (1.0 or 1.1), and the CUDA init and
// load functions. What its code does is not checked: that is the trust model.
#ifndef JAX_MOSAIC_FFI_CUTE_OBJECT_H_
#define JAX_MOSAIC_FFI_CUTE_OBJECT_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace jmf {

// The function prefix jax_mosaic_ffi compiles every CuTe DSL object with, and
// the symbol of every module of CuTe DSL objects (objects load apart, so one
// name serves all).
inline constexpr char kCutePrefix[] = "jmf_cute";
inline constexpr uint32_t kMaxElfSections = 4096;
inline constexpr uint64_t kMaxElfSymbols = uint64_t{1} << 20;
inline constexpr uint64_t kMaxCuteKernelInfoBytes = uint64_t{1} << 20;

// Checks `object` as a CuTe DSL object whose entry points carry `prefix`; on
// failure returns false and says why in `*error`.
bool CheckCuteObject(std::string_view object, std::string_view prefix, std::string* error);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CUTE_OBJECT_H_
