#include "driver/zlib_inflate.h"

#include <dlfcn.h>

#include <memory>
#include <new>
#include <string>

#include "driver/dl_symbols.h"

namespace jmf {
namespace {

// zlib.h's uncompress2 (zlib >= 1.2.9), with uLong spelled out: unlike
// uncompress, it says how much of the stream it read, so bytes after the
// stream's end are refused rather than ignored.
using Uncompress2 = int (*)(unsigned char* dest, unsigned long* dest_length, const unsigned char* source,
                            unsigned long* source_length);
constexpr int kZOk = 0;
constexpr int kZMemError = -4;
constexpr int kZBufError = -5;

struct Zlib {
  Uncompress2 uncompress2 = nullptr;
  std::string error;  // why it could not be opened
};

const Zlib& GetZlib() {
  static const Zlib zlib = [] {
    Zlib z;
    void* library = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      // A Python linked with zlib statically may still export it.
      z.uncompress2 = reinterpret_cast<Uncompress2>(dlsym(RTLD_DEFAULT, "uncompress2"));
      if (z.uncompress2 == nullptr) {
        z.error = std::string("zlib (libz.so.1) cannot be opened: ") + (why != nullptr ? why : "unknown reason") +
                  "; install zlib (Debian/Ubuntu: zlib1g, Fedora/RHEL: zlib)";
      }
      return z;
    }
    std::string missing;
    if (!ResolveSymbol(library, "uncompress2", &z.uncompress2, &missing)) {
      z.error = "zlib (libz.so.1) has no " + missing + "; it needs zlib 1.2.9 or newer";
    }
    return z;
  }();
  return zlib;
}

}  // namespace

bool InflateZlib(std::string_view stream, uint64_t size, std::string* out, std::string* error) {
  const Zlib& zlib = GetZlib();
  if (zlib.uncompress2 == nullptr) {
    *error = zlib.error;
    return false;
  }
  // One byte more than declared: a stream that inflates to more than `size`
  // fills it and is caught below instead of being cut short. Not zero-filled:
  // only the pages zlib writes are touched.
  std::unique_ptr<unsigned char[]> buffer(new (std::nothrow) unsigned char[size + 1]);
  if (buffer == nullptr) {
    *error = "cannot allocate the " + std::to_string(size) + " bytes it declares";
    return false;
  }
  unsigned long out_length = static_cast<unsigned long>(size + 1);
  unsigned long in_length = static_cast<unsigned long>(stream.size());
  const int status =
      zlib.uncompress2(buffer.get(), &out_length, reinterpret_cast<const unsigned char*>(stream.data()), &in_length);
  if (status == kZBufError && out_length == size + 1) {
    *error = "it inflates to more than the " + std::to_string(size) + " bytes it declares";
  } else if (status == kZMemError) {
    *error = "zlib ran out of memory";
  } else if (status != kZOk) {
    *error = "not a complete zlib stream (zlib status " + std::to_string(status) + ")";
  } else if (out_length != size) {
    *error =
        "it inflates to " + std::to_string(out_length) + " bytes, not the " + std::to_string(size) + " it declares";
  } else if (in_length != stream.size()) {
    *error = std::to_string(stream.size() - in_length) + " bytes follow the end of its zlib stream";
  } else {
    out->assign(reinterpret_cast<const char*>(buffer.get()), size);
    return true;
  }
  return false;
}

}  // namespace jmf
