// out = alpha * in, VEC elements per thread through one aligned vector
// load/store, for any element type; the kernel is named by its C++ name
// ("kernels::scale<float, 4>").
//
// Mirrors: PyTorch-style vectorized elementwise templates (a kernel template
// over the scalar type and vector width in a namespace, an aligned_vector
// struct, <type_traits> checks, int64_t sizes, a scalar tail).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <cstdint>
#include <type_traits>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace kernels {

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) aligned_vector {
  T val[VEC];
};

template <typename T, int VEC>
__global__ void scale(T* __restrict__ out, const T* __restrict__ in, float alpha, int64_t n) {
  static_assert(VEC > 0 && (VEC & (VEC - 1)) == 0, "VEC is a power of two");
  static_assert(std::is_trivially_copyable<T>::value, "");
  using vec_t = aligned_vector<T, VEC>;
  const int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * VEC;
  if (i + VEC <= n) {
    vec_t x = *reinterpret_cast<const vec_t*>(in + i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) x.val[k] = static_cast<T>(static_cast<float>(x.val[k]) * alpha);
    *reinterpret_cast<vec_t*>(out + i) = x;
  } else {
    for (int64_t k = i; k < n; ++k) out[k] = static_cast<T>(static_cast<float>(in[k]) * alpha);
  }
}

}  // namespace kernels
