// jax_mosaic_ffi NVRTC compatibility header: <assert.h>.
//
// Why it exists: NVRTC defines `assert` itself but ships no <assert.h>, so
// `#include <assert.h>` fails. Like the C library's, this header may be
// included again and each time redefines assert by the NDEBUG seen then. The
// expansion is NVRTC's own built-in one (and what nvcc's device assert
// compiles to): a call to the device builtin __assertfail, which prints
// "Assertion `...` failed." with the file, line and function and traps, so the
// launch fails with cudaErrorAssert.
// No include guard, on purpose (C11 7.2).
#undef assert
#ifdef NDEBUG
#define assert(e) (static_cast<void>(0))
#else
#define assert(e) \
  (static_cast<bool>(e) ? static_cast<void>(0) \
                        : __assertfail(#e, __FILE__, __LINE__, __PRETTY_FUNCTION__, sizeof(char)))
#endif
