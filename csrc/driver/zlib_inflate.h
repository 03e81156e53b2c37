// zlib's inflate for compressed module images (contract/module_format.h).
//
// zlib is opened at run time (libz.so.1, which every CPython with its zlib
// module has loaded already), as libcuda is: building needs no zlib headers,
// and a process without zlib still runs modules whose images are stored.
#ifndef JAX_MOSAIC_FFI_ZLIB_INFLATE_H_
#define JAX_MOSAIC_FFI_ZLIB_INFLATE_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace jmf {

// An InflateFn (contract/module_format.h): `stream` must inflate to exactly
// `size` bytes and end where `stream` ends.
bool InflateZlib(std::string_view stream, uint64_t size, std::string* out, std::string* error);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_ZLIB_INFLATE_H_
