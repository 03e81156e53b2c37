// jax_mosaic_ffi NVRTC compatibility header: <math.h>.
//
// Why it exists: NVRTC has the CUDA math library built in (expf, ::exp(float),
// isnan, ...) but ships no <math.h>, so `#include <math.h>` fails, and the C
// macros that nvcc users get from glibc's <math.h> (INFINITY, NAN, HUGE_VALF,
// M_PI, ...) are undefined. This header adds only those constants and puts
// the built-in functions into namespace std, as libstdc++'s <math.h> does. It
// declares no function of its own, so nothing can clash with NVRTC's
// built-in declarations. Values are glibc's.
#ifndef JMF_COMPAT_MATH_H_
#define JMF_COMPAT_MATH_H_

// INFINITY and NAN are constexpr variables here, not macros as in glibc: CUB
// and <cuda/std/cmath> #define them again under NVRTC, and a macro of ours
// would make every kernel that uses CUB log "incompatible redefinition of
// macro" warnings ahead of its real errors. A variable is shadowed by their
// macro silently, and behaves the same in expressions (constexpr, usable in
// device code and templates). The one difference: `#ifdef INFINITY` is false
// until such a header defines the macro. NVRTC has no __builtin_inff.
#ifndef INFINITY
static constexpr float INFINITY = __builtin_bit_cast(float, 0x7f800000U);
#endif
#ifndef NAN
static constexpr float NAN = __builtin_bit_cast(float, 0x7fc00000U);
#endif
#ifndef HUGE_VALF
#define HUGE_VALF INFINITY
#endif
#ifndef HUGE_VAL
#define HUGE_VAL (__builtin_bit_cast(double, 0x7ff0000000000000ULL))
#endif

#ifndef FP_NAN
#define FP_NAN 0
#endif
#ifndef FP_INFINITE
#define FP_INFINITE 1
#endif
#ifndef FP_ZERO
#define FP_ZERO 2
#endif
#ifndef FP_SUBNORMAL
#define FP_SUBNORMAL 3
#endif
#ifndef FP_NORMAL
#define FP_NORMAL 4
#endif

// double constants (glibc, _DEFAULT_SOURCE, which g++ and so nvcc define)
#define M_E 2.7182818284590452354
#define M_LOG2E 1.4426950408889634074
#define M_LOG10E 0.43429448190325182765
#define M_LN2 0.69314718055994530942
#define M_LN10 2.30258509299404568402
#define M_PI 3.14159265358979323846
#define M_PI_2 1.57079632679489661923
#define M_PI_4 0.78539816339744830962
#define M_1_PI 0.31830988618379067154
#define M_2_PI 0.63661977236758134308
#define M_2_SQRTPI 1.12837916709551257390
#define M_SQRT2 1.41421356237309504880
#define M_SQRT1_2 0.70710678118654752440

// float constants (glibc >= 2.35, _GNU_SOURCE, which g++ defines)
#define M_Ef 2.718281828459045235360287471352662498f
#define M_LOG2Ef 1.442695040888963407359924681001892137f
#define M_LOG10Ef 0.434294481903251827651128918916605082f
#define M_LN2f 0.693147180559945309417232121458176568f
#define M_LN10f 2.302585092994045684017991454684364208f
#define M_PIf 3.141592653589793238462643383279502884f
#define M_PI_2f 1.570796326794896619231321691639751442f
#define M_PI_4f 0.785398163397448309615660845819875721f
#define M_1_PIf 0.318309886183790671537767526745028724f
#define M_2_PIf 0.636619772367581343075535053490057448f
#define M_2_SQRTPIf 1.128379167095512573896158903121545172f
#define M_SQRT2f 1.414213562373095048801688724209698079f
#define M_SQRT1_2f 0.707106781186547524400844362104849039f

// The functions NVRTC declares for float and double, as std:: names too:
// `std::exp(x)` works under nvcc without any include (cuda_runtime.h pulls in
// <cmath>). What NVRTC lacks (isnormal, fpclassify, integer overloads) stays
// missing rather than being half-done here.
namespace std {
#define JMF_COMPAT_STD_MATH(fn) using ::fn; using ::fn##f;
JMF_COMPAT_STD_MATH(acos) JMF_COMPAT_STD_MATH(asin) JMF_COMPAT_STD_MATH(atan) JMF_COMPAT_STD_MATH(atan2)
JMF_COMPAT_STD_MATH(cos) JMF_COMPAT_STD_MATH(sin) JMF_COMPAT_STD_MATH(tan)
JMF_COMPAT_STD_MATH(acosh) JMF_COMPAT_STD_MATH(asinh) JMF_COMPAT_STD_MATH(atanh)
JMF_COMPAT_STD_MATH(cosh) JMF_COMPAT_STD_MATH(sinh) JMF_COMPAT_STD_MATH(tanh)
JMF_COMPAT_STD_MATH(exp) JMF_COMPAT_STD_MATH(exp2) JMF_COMPAT_STD_MATH(expm1)
JMF_COMPAT_STD_MATH(log) JMF_COMPAT_STD_MATH(log10) JMF_COMPAT_STD_MATH(log1p) JMF_COMPAT_STD_MATH(log2)
JMF_COMPAT_STD_MATH(logb) JMF_COMPAT_STD_MATH(ilogb)
JMF_COMPAT_STD_MATH(sqrt) JMF_COMPAT_STD_MATH(cbrt) JMF_COMPAT_STD_MATH(hypot) JMF_COMPAT_STD_MATH(pow)
JMF_COMPAT_STD_MATH(erf) JMF_COMPAT_STD_MATH(erfc) JMF_COMPAT_STD_MATH(tgamma) JMF_COMPAT_STD_MATH(lgamma)
JMF_COMPAT_STD_MATH(ceil) JMF_COMPAT_STD_MATH(floor) JMF_COMPAT_STD_MATH(trunc) JMF_COMPAT_STD_MATH(round)
JMF_COMPAT_STD_MATH(rint) JMF_COMPAT_STD_MATH(nearbyint) JMF_COMPAT_STD_MATH(lround) JMF_COMPAT_STD_MATH(llround)
JMF_COMPAT_STD_MATH(lrint) JMF_COMPAT_STD_MATH(llrint)
JMF_COMPAT_STD_MATH(fabs) JMF_COMPAT_STD_MATH(fmod) JMF_COMPAT_STD_MATH(remainder) JMF_COMPAT_STD_MATH(remquo)
JMF_COMPAT_STD_MATH(fmax) JMF_COMPAT_STD_MATH(fmin) JMF_COMPAT_STD_MATH(fdim) JMF_COMPAT_STD_MATH(fma)
JMF_COMPAT_STD_MATH(copysign) JMF_COMPAT_STD_MATH(nextafter) JMF_COMPAT_STD_MATH(frexp) JMF_COMPAT_STD_MATH(ldexp)
JMF_COMPAT_STD_MATH(modf) JMF_COMPAT_STD_MATH(scalbn) JMF_COMPAT_STD_MATH(scalbln) JMF_COMPAT_STD_MATH(nan)
#undef JMF_COMPAT_STD_MATH
using ::abs;
using ::isinf;
using ::isnan;
using ::isfinite;
using ::signbit;
}  // namespace std

#endif  // JMF_COMPAT_MATH_H_
