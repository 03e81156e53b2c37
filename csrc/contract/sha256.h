// SHA-256 (FIPS 180-4): the runtime checks a call's kernel_hash against the
// module bytes it parses (runtime/kernel_cache.cc), as Python computes it
// (hashlib.sha256 of the module, jax_mosaic_ffi/base/module_format.py). Here,
// not a dlopen'ed library: the contract links nothing, so the check holds on
// every machine and the fuzz driver builds it as it is; tests compare it with
// hashlib's on thousands of inputs.
#ifndef JAX_MOSAIC_FFI_SHA256_H_
#define JAX_MOSAIC_FFI_SHA256_H_

#include <array>
#include <cstdint>
#include <string_view>

namespace jmf {

std::array<uint8_t, 32> Sha256(std::string_view data);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_SHA256_H_
