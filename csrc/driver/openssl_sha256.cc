#include "driver/openssl_sha256.h"

#include <dlfcn.h>

#include "driver/dl_symbols.h"

namespace jmf {
namespace {

// evp.h's one-shot digest, stable from OpenSSL 1.1 to 3.x. EVP_MD and ENGINE
// stay opaque.
using EvpSha256 = const void* (*)();
using EvpDigest = int (*)(const void* data, size_t count, unsigned char* md, unsigned int* size, const void* type,
                          void* engine);

struct Crypto {
  EvpSha256 sha256 = nullptr;
  EvpDigest digest = nullptr;
  std::string error;  // why it could not be opened
};

const Crypto& GetCrypto() {
  static const Crypto crypto = [] {
    Crypto c;
    std::string why;
    for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1"}) {
      void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (library == nullptr) {
        const char* error = dlerror();
        why += std::string(why.empty() ? "" : "; ") + (error != nullptr ? error : name);
        continue;
      }
      std::string missing;
      ResolveSymbol(library, "EVP_sha256", &c.sha256, &missing);
      ResolveSymbol(library, "EVP_Digest", &c.digest, &missing);
      if (missing.empty()) return c;
      why += std::string(why.empty() ? "" : "; ") + name + " has no " + missing;
    }
    // A Python linked with OpenSSL statically may still export it.
    c.sha256 = reinterpret_cast<EvpSha256>(dlsym(RTLD_DEFAULT, "EVP_sha256"));
    c.digest = reinterpret_cast<EvpDigest>(dlsym(RTLD_DEFAULT, "EVP_Digest"));
    if (c.sha256 == nullptr || c.digest == nullptr) {
      c.digest = nullptr;
      c.error =
          "OpenSSL's libcrypto (libcrypto.so.3 or .so.1.1), which checks each module against its kernel_hash, "
          "cannot be opened (" +
          why + "); install OpenSSL (Debian/Ubuntu: libssl3, Fedora/RHEL: openssl-libs)";
    }
    return c;
  }();
  return crypto;
}

}  // namespace

bool Sha256(std::string_view data, std::array<uint8_t, 32>* digest, std::string* error) {
  const Crypto& crypto = GetCrypto();
  if (crypto.digest == nullptr) {
    *error = crypto.error;
    return false;
  }
  unsigned int size = 0;
  if (crypto.digest(data.data(), data.size(), digest->data(), &size, crypto.sha256(), nullptr) != 1 ||
      size != digest->size()) {
    *error = "OpenSSL's EVP_Digest could not hash a module of " + std::to_string(data.size()) + " bytes";
    return false;
  }
  return true;
}

}  // namespace jmf
