// Parser for the serialized kernel module (jax_mosaic_ffi/base/module_format.py
// writes it; docs/contract.md specifies it). The bytes come from a program
// the user may have loaded from anywhere, so every length and offset is
// checked before it is used.
#ifndef JAX_MOSAIC_FFI_MODULE_FORMAT_H_
#define JAX_MOSAIC_FFI_MODULE_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace jmf {

// The version written. Version 1 (an image's encoding field was reserved, 0) is
// still read: artifacts exported before compression keep running.
inline constexpr uint32_t kModuleFormatVersion = 2;
inline constexpr uint32_t kOldestModuleFormatVersion = 1;
inline constexpr uint32_t kMaxSymbolLength = 4096;
inline constexpr uint32_t kMaxImages = 64;
// Compute capability as major * 10 + minor: sm_10 .. sm_999.
inline constexpr uint32_t kMinArch = 10;
inline constexpr uint32_t kMaxArch = 999;
// Module flags. kFlagPdlWait: the kernel's entry waits for the prerequisite
// grid (griddepcontrol.wait) before touching memory, in every image, so it
// may be launched with programmatic dependent launch.
inline constexpr uint32_t kFlagPdlWait = 1;
// kFlagNvshmem: the kernel is linked with NVSHMEM's device library, so the
// runtime must start NVSHMEM and register the module with it
// (nvshmemx_cumodule_init), and only NVSHMEM calls may launch it.
inline constexpr uint32_t kFlagNvshmem = 2;
inline constexpr uint32_t kKnownFlags = kFlagPdlWait | kFlagNvshmem;
// arch_suffix values: index 0 none, 1 'a' (arch-specific), 2 'f' (family).
inline constexpr const char* kArchSuffixes[] = {"", "a", "f"};
inline constexpr uint32_t kSuffixArchSpecific = 1;  // runs on its own arch only
inline constexpr uint32_t kSuffixFamily = 2;        // runs on its arch and later minor ones of its major version

// kCuteObject: a CuTe DSL object (`JitCompiledFunction.dump_to_object`): an ELF
// relocatable holding the host launch function and the cubin, run through
// NVIDIA's CuTe DSL runtime library (driver/cute_dsl_runtime.h). Its payload:
//   u32 version_length (1..kMaxCuteVersionLength) | the DSL release that made it (printable ASCII)
//   u32 num_args (0..kMaxHostArgs) | u32 kind per argument after the stream (kHostArg*)
//   the object (an ELF file): the rest
// A module holds either CuTe objects only or cubins and PTX only.
enum class ImageKind : uint32_t { kCubin = 1, kPtx = 2, kCuteObject = 3 };

// How an image's payload is stored (format 2). kEncodingZlib: u64 inflated
// size | a zlib stream (RFC 1950) that inflates to exactly that many bytes,
// with nothing after it. Kernels are compressed because they travel in every
// StableHLO text, jax.export artifact and cache entry: PTX shrinks about 7x,
// cubins about 4x.
inline constexpr uint32_t kEncodingStored = 0;
inline constexpr uint32_t kEncodingZlib = 1;
// Checked before anything is allocated: a crafted size cannot make the runtime
// reserve memory that the stream does not fill. Deflate cannot expand data
// more than 1032-fold, so a larger claim is a lie.
inline constexpr uint64_t kMaxInflatedModuleBytes = uint64_t{1} << 30;  // all of a module's inflated images
inline constexpr uint64_t kMaxDeflateRatio = 1032;

inline constexpr uint32_t kMaxCuteVersionLength = 64;
inline constexpr uint32_t kMaxHostArgs = 256;
// What the host function takes after the stream, each by pointer to an 8-byte value.
inline constexpr uint32_t kHostArgPointer = 1;  // a device pointer (void*)
inline constexpr uint32_t kHostArgInt64 = 2;    // an int64_t

struct Image {
  ImageKind kind;
  uint32_t arch;     // compute capability, major * 10 + minor
  uint32_t suffix;   // index into kArchSuffixes
  std::string data;  // std::string keeps PTX NUL-terminated for the driver; the ELF object for kCuteObject
  // kCuteObject only.
  std::string dsl_version;
  std::vector<uint32_t> host_arg_kinds;
  uint32_t encoding = kEncodingStored;  // how the module carried it; `data` is always the inflated bytes
};

struct ParsedModule {
  uint32_t version = kModuleFormatVersion;
  uint32_t flags = 0;
  std::string symbol;
  std::vector<Image> images;
  bool cute = false;  // its images are CuTe DSL objects
};

// Inflates `stream` (zlib, RFC 1950) into `*out`, which must come out exactly
// `size` bytes long with the whole stream read; on failure returns false and
// says why in `*error`. The contract links no library, so the caller brings
// one (driver/zlib_inflate.h).
using InflateFn = bool (*)(std::string_view stream, uint64_t size, std::string* out, std::string* error);

// Parses `bytes`, inflating compressed images with `inflate` (nullptr: a
// compressed image is refused); on failure returns false and says why in `*error`.
bool ParseModule(std::string_view bytes, InflateFn inflate, ParsedModule* module, std::string* error);

// "cubin:sm_90, ptx:compute_90"
std::string DescribeImages(const ParsedModule& module);

// "90a"
std::string ArchName(const Image& image);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_MODULE_FORMAT_H_
