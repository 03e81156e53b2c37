"""One-shot all-reduce and all-gather over NVLink peers, as collective kernels.

Each device reads its peers' input buffers directly (one process drives all
GPUs, so their addresses are valid everywhere once peer access is on): no
staging copies and one launch, which beats a ring algorithm for small
messages. Use them inside `shard_map`:

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    f = jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x"), mesh=mesh,
                      in_specs=P("x"), out_specs=P("x"))
"""

import functools

import jax
import numpy as np

from jax_mosaic_ffi.api import mosaic_kernel
from jax_mosaic_ffi.call.collective import Collective
from jax_mosaic_ffi.call.launch_values import cdiv
from jax_mosaic_ffi.toolchain.kernel import Kernel, cuda_kernel

SOURCE = r'''
#include <jax_mosaic_ffi/collective.cuh>

template <typename T>
__device__ void all_reduce(const T* x, T* out, long long n, const jmf::CollectiveMetadata* meta) {
  const int peers = jmf::num_peers(meta);
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
    T acc = jmf::peer_ptr<const T>(meta, 0, 0)[i];
    for (int r = 1; r < peers; ++r) acc += jmf::peer_ptr<const T>(meta, 0, r)[i];
    out[i] = acc;
  }
  jmf::exit_barrier(meta);  // peers may still be reading our x
}

// 16 bytes per thread per peer: what a memory-bound copy wants.
__device__ void all_reduce_f32x4(const float* x, float* out, long long n, const jmf::CollectiveMetadata* meta) {
  const int peers = jmf::num_peers(meta);
  const long long n4 = n / 4;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 acc = reinterpret_cast<const float4*>(jmf::peer_ptr<const float>(meta, 0, 0))[i];
    for (int r = 1; r < peers; ++r) {
      float4 v = reinterpret_cast<const float4*>(jmf::peer_ptr<const float>(meta, 0, r))[i];
      acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
    reinterpret_cast<float4*>(out)[i] = acc;
  }
  for (long long i = n4 * 4 + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
    float acc = 0.0f;
    for (int r = 0; r < peers; ++r) acc += jmf::peer_ptr<const float>(meta, 0, r)[i];
    out[i] = acc;
  }
  jmf::exit_barrier(meta);
}

extern "C" __global__ void all_reduce_f32(const float* x, float* out, long long n,
                                          const jmf::CollectiveMetadata* meta) {
  all_reduce_f32x4(x, out, n, meta);
}

extern "C" __global__ void all_reduce_i32(const int* x, int* out, long long n,
                                          const jmf::CollectiveMetadata* meta) {
  all_reduce<int>(x, out, n, meta);
}

// out holds every rank's x, rank-major.
extern "C" __global__ void all_gather_f32(const float* x, float* out, long long n,
                                          const jmf::CollectiveMetadata* meta) {
  const int peers = jmf::num_peers(meta);
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (int r = 0; r < peers; ++r) {
    const float* src = jmf::peer_ptr<const float>(meta, 0, r);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
      out[r * n + i] = src[i];
    }
  }
  jmf::exit_barrier(meta);
}
'''

_NAMES = {np.dtype(np.float32): "all_reduce_f32", np.dtype(np.int32): "all_reduce_i32"}


@functools.cache
def kernel(name: str) -> Kernel:
  """One of SOURCE's kernels, compiled once per process."""
  return cuda_kernel(SOURCE, name)


def _grid(n: int, per_thread: int = 4) -> int:
  return int(max(1, min(132 * 4, cdiv(n, 256 * per_thread))))


def all_reduce(x: jax.Array, *, axis_name: str) -> jax.Array:
  """Sums `x` over the devices of `axis_name` (call inside shard_map)."""
  name = _NAMES.get(np.dtype(x.dtype))
  if name is None:
    raise TypeError(f"all_reduce supports float32 and int32, not {x.dtype}")
  call = mosaic_kernel(kernel(name), jax.ShapeDtypeStruct(x.shape, x.dtype), grid=_grid(x.size),
                           block=256, scalars=(np.int64(x.size),), collective=Collective(axis_name))
  return call(x)


def all_gather(x: jax.Array, *, axis_name: str, axis_size: int) -> jax.Array:
  """Stacks `x` from every device of `axis_name` along a new leading axis."""
  if np.dtype(x.dtype) != np.float32:
    raise TypeError("all_gather supports float32")
  call = mosaic_kernel(kernel("all_gather_f32"), jax.ShapeDtypeStruct((axis_size, *x.shape), x.dtype),
                           grid=_grid(x.size, 1), block=256, scalars=(np.int64(x.size),),
                           collective=Collective(axis_name))
  return call(x)
