// SHA-256 of a module, to check a call's kernel_hash against the bytes it
// carries (runtime/kernel_cache.cc), as Python computes it (hashlib.sha256,
// jax_mosaic_ffi/base/module_format.py).
//
// OpenSSL's libcrypto, opened at run time as libz and libcuda are: the one
// CPython's hashlib uses, so a process running JAX has it already, and
// building needs no OpenSSL headers.
#ifndef JAX_MOSAIC_FFI_OPENSSL_SHA256_H_
#define JAX_MOSAIC_FFI_OPENSSL_SHA256_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace jmf {

// Sets *digest to the SHA-256 of `data`; false with *error where libcrypto
// cannot be opened or fails.
bool Sha256(std::string_view data, std::array<uint8_t, 32>* digest, std::string* error);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_OPENSSL_SHA256_H_
