"""Sources that nvcc accepts compile under NVRTC unchanged (the jmf_compat headers), and advice for the rest.

Every source here is written as nvcc code is: with the includes nvcc code
has, or none where nvcc needs none. Each is compiled to a cubin for sm_90 on
the CPU; values are checked at compile time with static_assert where they
can be, and in the PTX where the point is what the code compiles to.
"""

import re
import shutil
import subprocess

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.cuda.nvrtc import compiler
from jax_mosaic_ffi.cuda.nvrtc import compat as nvrtc_compat
from jax_mosaic_ffi.base.module_format import Arch, ImageKind

from conftest import NO_NVCC, NVCC


def compile_ok(source, name="k", **kwargs):
  return jmf.cuda_kernel(source, name, targets="sm_90", **kwargs)


def ptx_of(kernel) -> str:
  (ptx,) = [i.data.decode() for i in kernel.images if i.kind == ImageKind.PTX]
  return ptx


def compile_error(source, name="k", **kwargs) -> str:
  with pytest.raises(jmf.CompileError) as info:
    compile_ok(source, name, **kwargs)
  return str(info.value)


# --- assert -------------------------------------------------------------------

ASSERT = r'''
#include <%s>
extern "C" __global__ void k(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  assert(n > 0 && "n must be positive");
  if (i < n) y[i] = x[i];
}
'''


@pytest.mark.parametrize("header", ["assert.h", "cassert"])
def test_assert_in_device_code_calls_the_device_assert(isolated_disk_cache, header):
  ptx = ptx_of(compile_ok(ASSERT % header))
  # What nvcc's device assert compiles to: a call to __assertfail with the
  # expression, file, line and function, which prints them and traps.
  assert "call.uni" in ptx and "__assertfail" in ptx


@pytest.mark.parametrize("header", ["assert.h", "cassert"])
def test_ndebug_turns_assert_off(isolated_disk_cache, header):
  assert "__assertfail" not in ptx_of(compile_ok(ASSERT % header, options=["-DNDEBUG"]))
  assert "__assertfail" not in ptx_of(compile_ok("#define NDEBUG\n" + ASSERT % header))


def test_assert_h_follows_ndebug_at_each_include_like_the_c_library(isolated_disk_cache):
  source = r'''
#define NDEBUG
#include <assert.h>
__device__ void unchecked(int n) { assert(n > 0); }
#undef NDEBUG
#include <assert.h>
extern "C" __global__ void k(int n) { unchecked(n); assert(n > 1); }
'''
  ptx = ptx_of(compile_ok(source))
  assert ptx.count("call.uni") == 1 and "__assertfail" in ptx


# --- <math.h> / <cmath> -----------------------------------------------------------

MATH_CONSTANTS = r'''
#include <%s>
static_assert(INFINITY > 3.4e38f && -INFINITY < -3.4e38f, "INFINITY");
static_assert(NAN != NAN, "NAN");
static_assert(HUGE_VALF == INFINITY && HUGE_VAL > 1.7e308, "HUGE_VAL");
static_assert(M_PI > 3.14159265358 && M_PI < 3.14159265359, "M_PI");
static_assert(M_E > 2.718281828 && M_E < 2.718281829, "M_E");
static_assert(M_LOG2E * M_LN2 > 0.999999999 && M_LOG2E * M_LN2 < 1.000000001, "M_LOG2E");
static_assert(M_SQRT2 * M_SQRT1_2 > 0.999999999 && M_SQRT2 * M_SQRT1_2 < 1.000000001, "M_SQRT2");
static_assert(M_PI_2 * 2 == M_PI && M_PI_4 * 4 == M_PI, "M_PI_2");
static_assert(M_1_PI * M_PI > 0.999999999 && M_1_PI * M_PI < 1.000000001, "M_1_PI");
static_assert(M_2_SQRTPI > 1.128379 && M_2_SQRTPI < 1.128380, "M_2_SQRTPI");
static_assert(M_PIf == 3.14159265f, "M_PIf");
constexpr float kNegInf = -INFINITY;  // constexpr, as with glibc's macros

extern "C" __global__ void k(const float* x, float* y, double* z) {
  float v = x[threadIdx.x];
  y[0] = expf(v) + sqrtf(v) + fabsf(v) + tanhf(v) + erff(v) + log1pf(v) + fmaxf(v, kNegInf);
  y[1] = isinf(v) + isnan(v) + isfinite(v) + signbit(v);
  y[2] = exp(v) + pow(v, 2.0f) + floor(v) + fmax(v, 0.0f);  // float overloads, as nvcc has
  z[0] = exp((double)v) + M_PI;
  y[3] = INFINITY; y[4] = NAN;
}
'''


@pytest.mark.parametrize("header", ["math.h", "cmath"])
def test_math_h_constants_and_functions(isolated_disk_cache, header):
  ptx = ptx_of(compile_ok(MATH_CONSTANTS % header))
  assert "0f7F800000" in ptx  # INFINITY stored as a constant


def test_std_math_functions_are_nvrtcs_own(isolated_disk_cache):
  source = r'''
#include <cmath>
template <typename T> __device__ T f(T x) {
  return std::exp(x) + std::log(x) + std::sqrt(x) + std::abs(x) + std::fabs(x) + std::tanh(x) + std::erf(x)
       + std::pow(x, T(2)) + std::fmax(x, T(0)) + std::fmin(x, T(1)) + std::floor(x) + std::ceil(x)
       + std::round(x) + std::fma(x, x, x) + std::exp2(x) + std::log2(x) + std::log1p(x) + std::expm1(x)
       + std::sin(x) + std::cos(x) + std::atan2(x, x) + std::hypot(x, x) + std::copysign(x, x)
       + (std::isinf(x) ? 1 : 0) + (std::isnan(x) ? 1 : 0) + (std::isfinite(x) ? 1 : 0) + std::signbit(x);
}
extern "C" __global__ void k(float* x, double* y, int* z) {
  x[0] = f(x[0]) + std::expf(x[1]) + std::sqrtf(x[2]);
  y[0] = f(y[0]);
  z[0] = std::abs(z[1]);
}
'''
  ptx = ptx_of(compile_ok(source))
  assert "ex2.approx" in ptx and "sqrt.rn.f32" in ptx and "sqrt.rn.f64" in ptx


def test_cuda_std_cmath_and_the_compat_headers_mix(isolated_disk_cache):
  # CCCL #defines INFINITY/NAN itself under NVRTC, and CUB includes it: the
  # compat ones must give way without an error or an ambiguous call, also
  # under `using namespace std;`.
  source = r'''
#include <cmath>
#include <algorithm>
#include <limits>
#include <utility>
#include <cuda/std/cmath>
#include <cub/block/block_reduce.cuh>
using namespace std;
extern "C" __global__ void k(float* x, int i, int j, unsigned u, double d) {
  float a = x[0], b = x[1];
  x[2] = min(a, b) + max(i, j) + exp(a) + abs(a) + sqrt(b) + min(u, 3u) + fabs(d) + pow(a, 2.0f) + isnan(a);
  x[3] = std::min(a, b) + std::max(1.0, d) + std::exp(a) + cuda::std::exp(a);
  swap(a, b);
  x[4] = a + numeric_limits<float>::epsilon() + INFINITY + NAN + HUGE_VALF;
}
'''
  compile_ok(source)


# --- the prelude: what nvcc gives without any include ---------------------------------

NO_INCLUDES = r'''
struct Pair { int a; float b; };
extern "C" __global__ void k(const float* x, float* y, uint n, ushort s, ulong l, u_int8_t b, ssize_t z) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int32_t small = INT_MAX - CHAR_BIT;
  size_t offset = offsetof(Pair, b);
  if (i < n) y[i] = fmaxf(x[i], -INFINITY) * M_PI + std::exp(x[i]) + (float)(s + l + b + z + small + offset);
  if (i == 0) y[0] = NAN + HUGE_VALF + RAND_MAX + EXIT_SUCCESS;
}
'''


def test_names_nvcc_code_uses_without_any_include(isolated_disk_cache):
  # cuda_runtime.h, which nvcc includes before every file, brings these in
  # (through glibc's math.h, stdlib.h, sys/types.h and libstdc++'s cmath).
  kernel = compile_ok(NO_INCLUDES)
  assert kernel.param_sizes == (8, 8, 4, 2, 8, 1, 8)


def test_the_prelude_can_be_turned_off(isolated_disk_cache):
  message = compile_error(NO_INCLUDES, options=["-DJMF_COMPAT_NO_PRELUDE"])
  assert 'identifier "uint" is undefined' in message or '"uint"' in message


def test_the_prelude_needs_no_cccl(isolated_disk_cache, monkeypatch):
  # CCCL is a dependency, but a kernel that needs nothing from it must not
  # fail because the prelude does.
  monkeypatch.setattr(nvrtc_compat, "cuda_include_dirs", lambda: ())
  compile_ok('extern "C" __global__ void k(float* x) { x[0] = -INFINITY + M_PI + std::exp(x[1]); }')


def test_typedefs_nvrtc_code_writes_for_itself_still_compile(isolated_disk_cache):
  # Code written for NVRTC often defines the fixed-width types itself; the
  # same typedefs again are fine in C++.
  source = r'''
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned int uint;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#define M_PI 3.14159265358979323846
extern "C" __global__ void k(uint32_t* x, int64_t n) { if (threadIdx.x < n) x[threadIdx.x] = (uint)INFINITY; }
'''
  compile_ok(source)


# --- integer and float limits, fixed-width types, sys/types.h ------------------------

@pytest.mark.parametrize("headers", [("stdint.h", "limits.h", "float.h"), ("cstdint", "climits", "cfloat")])
def test_fixed_width_types_and_limits(isolated_disk_cache, headers):
  includes = "".join(f"#include <{h}>\n" for h in headers)
  source = includes + r'''
static_assert(sizeof(int8_t) == 1 && sizeof(int16_t) == 2 && sizeof(int32_t) == 4 && sizeof(int64_t) == 8, "");
static_assert(sizeof(uint8_t) == 1 && sizeof(uint64_t) == 8 && sizeof(uintptr_t) == 8, "");
static_assert(INT32_MAX == 2147483647 && INT64_MIN < 0 && UINT32_MAX == 4294967295u && SIZE_MAX > 0, "");
static_assert(INT_MAX == 2147483647 && INT_MIN == -INT_MAX - 1 && UINT_MAX == 4294967295u, "");
static_assert(CHAR_BIT == 8 && SHRT_MAX == 32767 && LLONG_MAX == 9223372036854775807LL, "");
static_assert(FLT_MAX == 3.402823466e+38F && FLT_MIN == 1.175494351e-38F && FLT_EPSILON == 1.192092896e-07F, "");
static_assert(DBL_MAX > 1.7976931348623e308 && DBL_EPSILON == 2.2204460492503131e-16, "");
static_assert(FLT_MANT_DIG == 24 && DBL_MANT_DIG == 53 && FLT_DIG == 6 && FLT_RADIX == 2, "");
extern "C" __global__ void k(const float* x, float* y, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  float m = -FLT_MAX;
  if (i < n) y[i] = fmaxf(m, x[i]) + (float)INT_MAX;
}
'''
  compile_ok(source)


def test_cstdint_names_in_std_and_the_same_types_as_cccl(isolated_disk_cache):
  # CCCL defines int64_t (as long long) itself under NVRTC; the compat
  # header must not define it differently, or CUB and <cstdint> clash.
  source = r'''
#include <cstdint>
#include <cstddef>
#include <sys/types.h>
#include <cub/cub.cuh>
#include <cuda/std/cstdint>
#include <type_traits>
static_assert(std::is_same<std::int64_t, cuda::std::int64_t>::value, "");
static_assert(std::is_same<std::uint8_t, ::uint8_t>::value, "");
static_assert(std::is_same<u_int32_t, uint32_t>::value && sizeof(uint) == 4 && sizeof(ulong) == 8, "");
static_assert(sizeof(ushort) == 2 && sizeof(u_char) == 1 && sizeof(ssize_t) == 8, "");
static_assert(std::is_same<std::size_t, size_t>::value && sizeof(std::ptrdiff_t) == 8, "");
struct S { char c; double d; };
// offsetof is not a constant expression under NVRTC, which has no
// __builtin_offsetof; at run time it is right.
extern "C" __global__ void k(std::uint64_t* x, std::nullptr_t) { x[0] = UINT64_MAX; x[1] = offsetof(S, d); }
'''
  compile_ok(source)


# --- printf, malloc, memcpy --------------------------------------------------------

@pytest.mark.parametrize("headers", [("stdio.h", "stdlib.h", "string.h"), ("cstdio", "cstdlib", "cstring")])
def test_device_printf_malloc_memcpy(isolated_disk_cache, headers):
  includes = "".join(f"#include <{h}>\n" for h in headers)
  std = "std::" if headers[0] == "cstdio" else ""
  source = includes + rf'''
extern "C" __global__ void k(const float* x, float* y) {{
  if (threadIdx.x == 0) {std}printf("block %d: x[0] = %f\n", blockIdx.x, x[0]);
  float* scratch = (float*){std}malloc(4 * sizeof(float));
  {std}memcpy(scratch, x, 4 * sizeof(float));
  {std}memset(y, 0, sizeof(float));
  y[1] = scratch[{std}abs(-1)];
  {std}free(scratch);
}}
'''
  ptx = ptx_of(compile_ok(source))
  assert "vprintf" in ptx and "malloc" in ptx


# --- <type_traits>, <utility>, <limits>, <algorithm> -----------------------------------

def test_type_traits_utility_limits_algorithm(isolated_disk_cache):
  source = r'''
#include <type_traits>
#include <utility>
#include <limits>
#include <algorithm>
#include <cfloat>
#include <cuda_fp16.h>
namespace ops {
template <typename T, typename = std::enable_if_t<std::is_floating_point<T>::value>>
__device__ T relu(T x) { return std::max(x, T(0)); }
template <typename T, int N>
__global__ void k(T* out, const T* in, int n) {
  static_assert(std::is_same_v<std::remove_cv_t<const T>, T>, "");
  static_assert(std::numeric_limits<int>::max() == 2147483647, "");
  static_assert(std::numeric_limits<float>::max() == FLT_MAX, "");
  static_assert(std::numeric_limits<float>::has_infinity, "");
  static_assert(std::min(3, 4) == 3 && std::max({1, 5, 2}) == 5 && std::clamp(7, 0, 5) == 5, "");
  static_assert(std::is_same<std::conditional_t<(N > 2), float, double>, float>::value, "");
  static_assert(std::tuple_size<std::pair<int, float>>::value == 2, "");
  T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::infinity();
  auto p = std::make_pair(lo, hi);
  std::swap(p.first, p.second);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = relu(in[i]) + std::get<0>(p) * T(0) + std::exchange(lo, T(N)) * T(0);
  using idx = std::make_index_sequence<N>;
  static_assert(idx::size() == N, "");
}
}  // namespace ops
'''
  kernel = compile_ok(source, "ops::k<float, 4>")
  assert kernel.symbol.startswith("_ZN3ops1kIfLi4EEEvPT_PKS1_i")


# --- CUB ---------------------------------------------------------------------

def test_cub_umbrella_header_gives_block_and_warp_level_cub(isolated_disk_cache):
  # CCCL's own cub/cub.cuh pulls in cub::Device* (host-side dispatch), which
  # NVRTC refuses; the compat cub/cub.cuh comes first on the include path.
  source = r'''
#include <cub/cub.cuh>
#include <cuda/functional>
template <int BLOCK, int ITEMS>
__global__ void k(const float* in, float* out, int* ranks) {
  using Load = cub::BlockLoad<float, BLOCK, ITEMS, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using Store = cub::BlockStore<float, BLOCK, ITEMS, cub::BLOCK_STORE_WARP_TRANSPOSE>;
  using Reduce = cub::BlockReduce<float, BLOCK>;
  using Scan = cub::BlockScan<int, BLOCK>;
  using Warp = cub::WarpReduce<float>;
  __shared__ union {
    typename Load::TempStorage load;
    typename Store::TempStorage store;
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
    typename Warp::TempStorage warp[BLOCK / 32];
  } temp;
  float items[ITEMS];
  Load(temp.load).Load(in + blockIdx.x * BLOCK * ITEMS, items);
  __syncthreads();
  float total = Reduce(temp.reduce).Sum(items);
  __syncthreads();
  float biggest = Warp(temp.warp[threadIdx.x / 32]).Reduce(items[0], cuda::maximum<>{});
  __syncthreads();
  int rank;
  Scan(temp.scan).ExclusiveSum(1, rank);
  __syncthreads();
  Store(temp.store).Store(out + blockIdx.x * BLOCK * ITEMS, items);
  ranks[blockIdx.x * BLOCK + threadIdx.x] = rank + (int)(total * 0) + (int)(biggest * 0);
  float4 v = cub::ThreadLoad<cub::LOAD_LDG>(reinterpret_cast<const float4*>(in));
  if (threadIdx.x == 0) out[0] += v.x * 0;
}
template __global__ void k<256, 4>(const float*, float*, int*);
'''
  ptx = ptx_of(compile_ok(source, "k<256, 4>"))
  assert "shfl.sync" in ptx and "bar.sync" in ptx


# --- launch bounds, restrict, __ldg, cooperative groups, WMMA, fp16/bf16 -----------------

def test_launch_bounds_restrict_and_ldg(isolated_disk_cache):
  source = r'''
extern "C" __global__ void __launch_bounds__(256, 2)
k(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __ldg(x + i) + __ldg(reinterpret_cast<const float4*>(x)).w;
}
'''
  ptx = ptx_of(compile_ok(source))
  assert ".maxntid 256" in ptx and ".minnctapersm 2" in ptx and "ld.global.nc" in ptx


def test_cooperative_groups_reduce(isolated_disk_cache):
  source = r'''
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
extern "C" __global__ void k(const float* x, float* y, const int* a, int* b) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  float v = x[block.thread_rank()];
  float sum = cg::reduce(warp, v, cg::plus<float>());
  float top = cg::reduce(warp, v, cg::greater<float>());
  int count = cg::reduce(warp, a[block.thread_rank()], cg::plus<int>());
  if (warp.thread_rank() == 0) { y[warp.meta_group_rank()] = sum + top; b[warp.meta_group_rank()] = count; }
  block.sync();
}
'''
  ptx = ptx_of(compile_ok(source))
  assert "shfl.sync" in ptx and "redux.sync" in ptx  # int reductions use sm_80's redux


def test_wmma(isolated_disk_cache):
  source = r'''
#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;
extern "C" __global__ void k(const half* a, const half* b, float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
'''
  ptx = ptx_of(compile_ok(source))
  assert "wmma.mma.sync" in ptx and ".f32.f32" in ptx


def test_half2_and_bfloat162_vector_types(isolated_disk_cache):
  source = r'''
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void k(const __half2* a, __nv_bfloat162* b, __half* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __half2 h = __hfma2(a[i], a[i], __float2half2_rn(1.0f));
  __nv_bfloat162 v = __hmul2(b[i], b[i]);
  float2 f = __bfloat1622float2(v);
  b[i] = __floats2bfloat162_rn(f.x + __low2float(h), f.y + __high2float(h));
  c[i] = __hadd(__low2half(h), __high2half(h));
}
'''
  ptx = ptx_of(compile_ok(source))
  assert "fma.rn.f16x2" in ptx and "bf16x2" in ptx


# --- what stays an error gets advice ---------------------------------------------------

@pytest.mark.parametrize("source, expected", [
    ('#include <vector>\nextern "C" __global__ void k(float* x) {}', "host-side"),
    ('#include <array>\nextern "C" __global__ void k(float* x) {}', "<cuda/std/array>"),
    ('#include "common.h"\nextern "C" __global__ void k(float* x) {}', "headers={'common.h'"),
    # A CUDA library header no toolkit include path has (curand's is in a full toolkit, as on the GPU machine).
    ('#include <cutlass/gemm/device/gemm.h>\nextern "C" __global__ void k(float* x) {}', "-I/path/to/include"),
    ('#include <cub/device/device_reduce.cuh>\nextern "C" __global__ void k(float* x) {}', "cub::Device"),
    ('extern "C" __global__ void k(float* x) {}\nvoid launch(float* x) { k<<<1, 32>>>(x); }',
     "-default-device"),
    ('float table[2] = {1, 2};\nextern "C" __global__ void k(float* x) { x[0] = table[0]; }', "__constant__"),
    ('extern "C" __global__ void k(float* x) { x[0] = __shfl_down(x[0], 1); }', "__shfl_down_sync"),
    ('extern "C" __global__ void k(float* x) { __shared__ float s[16384]; s[threadIdx.x] = x[0]; '
     '__syncthreads(); x[1] = s[threadIdx.x ^ 1]; }', "smem_bytes="),
    ('extern "C" __global__ void k(float* x) { x[0] = std::numeric_limits<float>::max(); }',
     "#include <limits>"),
    ('extern "C" __global__ void k(float* x) { x[0] = FLT_MAX; }', "#include <cfloat>"),
    ('extern "C" __global__ void k(__nv_bfloat16* x) {}', "<cuda_bf16.h>"),
    ('extern "C" __global__ void k(float* x) { nvcuda::wmma::fill_fragment(x, 0); }', "<mma.h>"),
    ('#include <cub/cub.cuh>\nextern "C" __global__ void k(float* x) { x[0] = cub::Max()(x[0], x[1]); }',
     "cuda::maximum"),
    ('extern "C" __global__ void k(float* x) { fprintf(stderr, "x"); }', "host-side"),
    ('extern "C" __global__ void k(float* x) { std::vector<float> v; }', "host-side"),
    ('#include <algorithm>\nextern "C" __global__ void k(float* x) { std::sort(x, x + 4); }', "BlockRadixSort"),
    ('extern "C" __global__ void k(float* x) { throw 1; }', "__trap()"),
])
def test_remaining_errors_keep_the_log_and_get_one_line_of_advice(isolated_disk_cache, source, expected):
  message = compile_error(source)
  assert "NVRTC could not compile kernel" in message and "error" in message  # the log is kept
  advice = re.findall(r"\nadvice: (.*)", message)
  assert len(advice) == 1 and expected in advice[0], message


def test_a_wrong_template_name_gets_advice(isolated_disk_cache):
  source = "namespace kernels { template <typename T, int N> __global__ void scale(T* x) { x[0] *= N; } }"
  assert "all its template arguments" in compile_error(source, "kernels::scale<float>")
  assert "namespaces and template arguments" in compile_error(source, "scale<float, 4>")


def test_advice_is_none_for_plain_mistakes():
  log = 'k.cu(1): error: expected a ";"\n  x[0] = 1 }\n\n1 error detected in the compilation of "k.cu".'
  assert nvrtc_compat.advice(log) is None
  assert nvrtc_compat.advice("") is None


# --- the hook and the cache key ----------------------------------------------------

def test_compat_dir_goes_first_on_the_include_path():
  options = nvrtc_compat.nvrtc_options()
  assert options[0] == f"-I{nvrtc_compat.INCLUDE_DIR}"
  assert any(o.startswith("--pre-include=") and o.endswith("jmf_compat_prelude.h") for o in options)


def test_cache_key_changes_with_the_compat_headers(monkeypatch):
  args = dict(source="src", name="k", options=(), headers={}, targets=(Arch(90),), compiler="nvrtc13.0")
  key = compiler.cache_key(**args)
  monkeypatch.setattr(nvrtc_compat, "HEADERS_HASH", "0" * 16)
  assert compiler.cache_key(**args) != key


def test_headers_hash_covers_every_file(tmp_path, monkeypatch):
  copy = tmp_path / "jmf_compat"
  shutil.copytree(nvrtc_compat.INCLUDE_DIR, copy)
  monkeypatch.setattr(nvrtc_compat, "INCLUDE_DIR", copy)
  assert nvrtc_compat._headers_hash() == nvrtc_compat.HEADERS_HASH
  (copy / "cub" / "cub.cuh").write_text((copy / "cub" / "cub.cuh").read_text() + "\n")
  edited = nvrtc_compat._headers_hash()
  assert edited != nvrtc_compat.HEADERS_HASH
  (copy / "new_header").write_text("")
  assert nvrtc_compat._headers_hash() not in (edited, nvrtc_compat.HEADERS_HASH)


def test_every_compat_header_says_why_it_exists():
  files = [p for p in nvrtc_compat.INCLUDE_DIR.rglob("*") if p.is_file()]
  assert len(files) >= 20
  for path in files:
    assert "Why it exists" in path.read_text(), path


# --- the same sources under nvcc, where there is one ----------------------------------

NVCC_ACCEPTS = [ASSERT % "cassert", MATH_CONSTANTS % "cmath", NO_INCLUDES]


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
@pytest.mark.parametrize("index", range(len(NVCC_ACCEPTS)))
def test_nvcc_accepts_the_same_sources(tmp_path, index):
  # The premise of the compat headers: these are sources nvcc takes as they are.
  source = tmp_path / "k.cu"
  source.write_text(NVCC_ACCEPTS[index])
  result = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"),
                           str(source)], capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
