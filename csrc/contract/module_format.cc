#include "contract/module_format.h"

#include <cstring>
#include <iterator>
#include <string>

#include "contract/contract.h"
#include "contract/cute_object.h"

namespace jmf {
namespace {

constexpr char kMagic[8] = {'J', 'M', 'F', 'F', 'I', 'M', 'O', 'D'};

// Reads little-endian integers from a bounded byte range.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  bool U32(uint32_t* value) { return Read(value, 4); }
  bool U64(uint64_t* value) { return Read(value, 8); }
  bool Bytes(uint64_t size, std::string_view* out) {
    if (size > bytes_.size() - offset_) return false;
    *out = bytes_.substr(offset_, size);
    offset_ += size;
    return true;
  }
  size_t remaining() const { return bytes_.size() - offset_; }

 private:
  template <typename T>
  bool Read(T* value, size_t size) {
    if (size > bytes_.size() - offset_) return false;
    T result = 0;
    for (size_t i = 0; i < size; ++i) {
      result |= static_cast<T>(static_cast<unsigned char>(bytes_[offset_ + i])) << (8 * i);
    }
    offset_ += size;
    *value = result;
    return true;
  }

  std::string_view bytes_;
  size_t offset_ = 0;
};

bool Fail(std::string* error, std::string message) {
  *error = "malformed kernel module: " + std::move(message);
  return false;
}

// A CuTe DSL object's payload (module_format.h): the DSL release, the host function's arguments, the ELF object,
// which must be one the DSL made with the module's symbol as its prefix (contract/cute_object.h).
bool ParseCuteObject(std::string_view payload, uint32_t i, std::string_view symbol, Image* image, std::string* error) {
  const std::string which = "CuTe DSL object " + std::to_string(i);
  if (symbol != kCutePrefix) {
    return Fail(error, which + " is in a module whose symbol is '" + Label(symbol.substr(0, 64)) +
                           "'; CuTe DSL modules are jax_mosaic_ffi's, of symbol '" + kCutePrefix + "'");
  }
  Reader reader(payload);
  uint32_t version_length, num_args;
  std::string_view version;
  if (!reader.U32(&version_length)) return Fail(error, which + " is truncated before its DSL version");
  if (version_length == 0 || version_length > kMaxCuteVersionLength || !reader.Bytes(version_length, &version)) {
    return Fail(error, which + " declares a DSL version of " + std::to_string(version_length) + " bytes (1.." +
                           std::to_string(kMaxCuteVersionLength) + ", within the image)");
  }
  for (char c : version) {
    if (c < 0x21 || c > 0x7e) return Fail(error, which + "'s DSL version is not printable ASCII");
  }
  if (!reader.U32(&num_args) || num_args > kMaxHostArgs) {
    return Fail(error, which + " declares " + std::to_string(num_args) + " host arguments (0.." +
                           std::to_string(kMaxHostArgs) + ")");
  }
  image->host_arg_kinds.resize(num_args);
  for (uint32_t k = 0; k < num_args; ++k) {
    uint32_t kind;
    if (!reader.U32(&kind)) return Fail(error, which + "'s host arguments are truncated");
    if (kind != kHostArgPointer && kind != kHostArgInt64) {
      return Fail(error, which + "'s host argument " + std::to_string(k) + " has unknown kind " + std::to_string(kind));
    }
    image->host_arg_kinds[k] = kind;
  }
  std::string_view object;
  reader.Bytes(reader.remaining(), &object);
  if (object.size() < 4 || object.substr(0, 4) != std::string_view("\x7f"
                                                                   "ELF",
                                                                   4)) {
    return Fail(error, which + " does not hold an ELF object after its header");
  }
  std::string why;
  if (!CheckCuteObject(object, symbol, &why)) {
    return Fail(error, which + " is refused before NVIDIA's runtime would link it into this process: " + why);
  }
  image->dsl_version.assign(version);
  image->data.assign(object);
  return true;
}

// A zlib image's payload (module_format.h): the declared size bounded, then inflated.
bool Inflate(std::string_view payload, uint32_t i, InflateFn inflate, uint64_t* inflated_total, std::string* out,
             std::string* error) {
  const std::string which = "image " + std::to_string(i);
  Reader reader(payload);
  uint64_t size;
  std::string_view stream;
  if (!reader.U64(&size)) return Fail(error, which + " is compressed but too short to say its inflated size");
  reader.Bytes(reader.remaining(), &stream);
  if (size == 0 || stream.empty() || size / kMaxDeflateRatio > stream.size() ||
      size > kMaxInflatedModuleBytes - *inflated_total) {
    return Fail(error, which + " declares " + std::to_string(size) + " bytes inflated from " +
                           std::to_string(stream.size()) + " (1 to " + std::to_string(kMaxDeflateRatio) +
                           " times as many, and " + std::to_string(kMaxInflatedModuleBytes) +
                           " for all of a module's compressed images)");
  }
  if (inflate == nullptr) return Fail(error, which + " is compressed, and this reader was given no zlib");
  std::string why;
  if (!inflate(stream, size, out, &why)) return Fail(error, which + " does not inflate: " + why);
  *inflated_total += size;
  return true;
}

// Image `i`'s header and bytes, checked, appended to `module`.
bool ParseImage(Reader& reader, uint32_t i, InflateFn inflate, uint64_t* inflated_total, ParsedModule* module,
                std::string* error) {
  uint32_t kind, arch, suffix, encoding;
  uint64_t size;
  std::string_view payload;
  if (!reader.U32(&kind) || !reader.U32(&arch) || !reader.U32(&suffix) || !reader.U32(&encoding) ||
      !reader.U64(&size)) {
    return Fail(error, "the header of image " + std::to_string(i) + " is truncated");
  }
  if (kind != static_cast<uint32_t>(ImageKind::kCubin) && kind != static_cast<uint32_t>(ImageKind::kPtx) &&
      kind != static_cast<uint32_t>(ImageKind::kCuteObject)) {
    return Fail(error, "image " + std::to_string(i) + " has unknown kind " + std::to_string(kind));
  }
  if (suffix >= std::size(kArchSuffixes) || arch < kMinArch || arch > kMaxArch) {
    return Fail(error, "image " + std::to_string(i) + " has arch " + std::to_string(arch) + " suffix " +
                           std::to_string(suffix) + "; archs are " + std::to_string(kMinArch) + ".." +
                           std::to_string(kMaxArch) + " with a suffix below " +
                           std::to_string(std::size(kArchSuffixes)));
  }
  if (module->version == 1 && encoding != kEncodingStored) {
    return Fail(error, "image " + std::to_string(i) + " has a nonzero reserved field");
  }
  if (encoding != kEncodingStored && encoding != kEncodingZlib) {
    return Fail(error, "image " + std::to_string(i) + " has unknown encoding " + std::to_string(encoding) +
                           "; upgrade jax_mosaic_ffi");
  }
  if (size == 0 || !reader.Bytes(size, &payload)) {
    return Fail(error, "image " + std::to_string(i) + " declares " + std::to_string(size) +
                           " bytes but the module has " + std::to_string(reader.remaining()) + " left");
  }
  Image image{static_cast<ImageKind>(kind), arch, suffix, {}, {}, {}, encoding};
  if (encoding == kEncodingZlib) {
    if (!Inflate(payload, i, inflate, inflated_total, &image.data, error)) return false;
  } else {
    image.data.assign(payload);
  }
  const std::string_view data = image.data;
  // The driver reads a cubin as an ELF file and PTX as a C string.
  if (kind == static_cast<uint32_t>(ImageKind::kCubin) && data.substr(0, 4) != std::string_view("\x7f"
                                                                                                "ELF",
                                                                                                4)) {
    return Fail(error, "image " + std::to_string(i) + " is declared a cubin but is not an ELF file");
  }
  if (kind == static_cast<uint32_t>(ImageKind::kPtx) && data.find('\0') != std::string_view::npos) {
    return Fail(error, "image " + std::to_string(i) + " is PTX text with a NUL byte inside");
  }
  if (kind == static_cast<uint32_t>(ImageKind::kCuteObject)) {
    const std::string whole = std::move(image.data);
    if (!ParseCuteObject(whole, i, module->symbol, &image, error)) return false;
  }
  module->images.push_back(std::move(image));
  return true;
}

}  // namespace

bool ParseModule(std::string_view bytes, InflateFn inflate, ParsedModule* module, std::string* error) {
  Reader reader(bytes);
  std::string_view magic;
  if (!reader.Bytes(sizeof(kMagic), &magic) || std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0) {
    return Fail(error, "it does not start with the JMFFIMOD magic (was it made by jax_mosaic_ffi?)");
  }
  uint32_t version, flags, num_images, symbol_length;
  if (!reader.U32(&version) || !reader.U32(&flags) || !reader.U32(&num_images) || !reader.U32(&symbol_length)) {
    return Fail(error, "the header is truncated");
  }
  if (version > kModuleFormatVersion) {
    return Fail(error, "format version " + std::to_string(version) + " is newer than this runtime reads (" +
                           std::to_string(kModuleFormatVersion) + "); upgrade jax_mosaic_ffi");
  }
  if (version < kOldestModuleFormatVersion) {
    return Fail(error, "format version " + std::to_string(version) + " was never written (the first is " +
                           std::to_string(kOldestModuleFormatVersion) + ")");
  }
  module->version = version;
  if ((flags & ~kKnownFlags) != 0) {
    return Fail(error, "unknown flags " + std::to_string(flags) + "; upgrade jax_mosaic_ffi");
  }
  module->flags = flags;
  if (num_images == 0 || num_images > kMaxImages) {
    return Fail(
        error, "it declares " + std::to_string(num_images) + " images (1.." + std::to_string(kMaxImages) + " allowed)");
  }
  if (symbol_length == 0 || symbol_length > kMaxSymbolLength) {
    return Fail(error, "the kernel symbol is " + std::to_string(symbol_length) + " bytes long");
  }
  std::string_view symbol;
  if (!reader.Bytes(symbol_length, &symbol)) return Fail(error, "the kernel symbol is truncated");
  if (symbol.find('\0') != std::string_view::npos) return Fail(error, "the kernel symbol holds a NUL byte");
  module->symbol.assign(symbol);
  module->images.clear();
  module->images.reserve(num_images);
  uint64_t inflated_total = 0;
  for (uint32_t i = 0; i < num_images; ++i) {
    if (!ParseImage(reader, i, inflate, &inflated_total, module, error)) return false;
  }
  if (reader.remaining() != 0) {
    return Fail(error, std::to_string(reader.remaining()) + " trailing bytes after the last image");
  }
  size_t cute = 0;
  for (const Image& image : module->images) cute += image.kind == ImageKind::kCuteObject;
  if (cute != 0 && cute != module->images.size()) {
    return Fail(error, "it mixes CuTe DSL objects with cubins or PTX; a module holds one or the other");
  }
  module->cute = cute != 0;
  if (module->cute && module->flags != 0) return Fail(error, "a module of CuTe DSL objects takes no flags");
  return true;
}

std::string ArchName(const Image& image) { return std::to_string(image.arch) + kArchSuffixes[image.suffix]; }

std::string DescribeImages(const ParsedModule& module) {
  std::string out;
  for (const Image& image : module.images) {
    if (!out.empty()) out += ", ";
    out += image.kind == ImageKind::kCubin ? "cubin:sm_" : image.kind == ImageKind::kPtx ? "ptx:compute_" : "cute:sm_";
    out += ArchName(image);
  }
  return out;
}

}  // namespace jmf
