"""One-shot all-reduce and all-gather over NVLink peers, as collective kernels, through CUDA IPC or NVSHMEM.

Each device reads its peers' input buffers directly (one process drives all
GPUs, so their addresses are valid everywhere once peer access is on): no
staging copies and one launch, which beats a ring algorithm for small
messages. Use them inside `shard_map`:

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    f = jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x"), mesh=mesh,
                      in_specs=P("x"), out_specs=P("x"))

With ``transport="nvshmem"`` the same operations are NVSHMEM kernels (`NVSHMEM_SOURCE`): the input is staged
on NVSHMEM's symmetric heap and peers are read through ``nvshmem_ptr`` where they are load/store reachable
(NVLink, the same GPU) and with ``nvshmem_getmem`` otherwise (InfiniBand), so they also run across hosts.
"""

import functools

import jax
import numpy as np

from jax_mosaic_ffi.api import mosaic_kernel
from jax_mosaic_ffi.call.collective import Collective
from jax_mosaic_ffi.call.launch_values import cdiv
from jax_mosaic_ffi.cuda.kernel import cuda_kernel
from jax_mosaic_ffi.toolchain.kernel import Kernel

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

# The same operations written against NVSHMEM. The runtime launches them cooperatively (every block resident),
# so a grid-wide sync orders the block-0 barriers with every block's reads. x is symmetric (staged on the
# heap by the runtime before the launch); the first barrier waits for every PE's copy, the last for every PE
# to finish reading ours before the next call's copy overwrites it.
NVSHMEM_SOURCE = r'''
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cooperative_groups.h>

// Element i of x on `pe`: a load where the peer is load/store reachable (`direct`, from nvshmem_ptr once
// per peer), a get otherwise.
template <typename T>
__device__ T peer_value(const T* x, const T* direct, long long i, int pe) {
  if (direct != nullptr) return direct[i];
  T value;
  nvshmem_getmem(&value, x + i, sizeof(T), pe);
  return value;
}

__device__ void barrier_all_of_grid() {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  grid.sync();
  if (grid.thread_rank() == 0) nvshmem_barrier_all();
  grid.sync();
}

template <typename T>
__device__ void nvshmem_all_reduce(const T* x, T* out, long long n) {
  barrier_all_of_grid();
  const int pes = nvshmem_n_pes();
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (int pe = 0; pe < pes; ++pe) {  // each thread revisits its own elements of out: no race
    const T* direct = static_cast<const T*>(nvshmem_ptr(x, pe));
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
      const T value = peer_value(x, direct, i, pe);
      out[i] = pe == 0 ? value : out[i] + value;
    }
  }
  barrier_all_of_grid();
}

extern "C" __global__ void nvshmem_all_reduce_f32(const float* x, float* out, long long n) {
  nvshmem_all_reduce<float>(x, out, n);
}

extern "C" __global__ void nvshmem_all_reduce_i32(const int* x, int* out, long long n) {
  nvshmem_all_reduce<int>(x, out, n);
}

// out holds every PE's x, PE-major.
extern "C" __global__ void nvshmem_all_gather_f32(const float* x, float* out, long long n) {
  barrier_all_of_grid();
  const int pes = nvshmem_n_pes();
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (int pe = 0; pe < pes; ++pe) {
    const float* direct = static_cast<const float*>(nvshmem_ptr(x, pe));
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
      out[pe * n + i] = peer_value(x, direct, i, pe);
    }
  }
  barrier_all_of_grid();
}
'''

_NAMES = {np.dtype(np.float32): "all_reduce_f32", np.dtype(np.int32): "all_reduce_i32"}
TRANSPORTS = ("ipc", "nvshmem")


@functools.cache
def kernel(name: str) -> Kernel:
  """One of SOURCE's kernels (NVSHMEM_SOURCE's for names starting with "nvshmem_"), compiled once per process."""
  return cuda_kernel(NVSHMEM_SOURCE if name.startswith("nvshmem_") else SOURCE, name)


def _collective(axis_name: str, transport: str) -> Collective:
  if transport not in TRANSPORTS:
    raise ValueError(f"transport must be one of {', '.join(map(repr, TRANSPORTS))}, got {transport!r}")
  if transport == "nvshmem":  # x on the symmetric heap, out written locally
    return Collective(axis_name, symmetric=(True, False), transport="nvshmem")
  return Collective(axis_name)


def _kernel_name(name: str, transport: str) -> str:
  return f"nvshmem_{name}" if transport == "nvshmem" else name


def _nvshmem_grid(n: int) -> int:
  # Cooperative launch: every block must be resident at once (8 of 256 threads per SM fit on any GPU we run).
  return int(max(1, min(132, cdiv(n, 256 * 4))))


def _grid(n: int, per_thread: int = 4) -> int:
  return int(max(1, min(132 * 4, cdiv(n, 256 * per_thread))))


def all_reduce(x: jax.Array, *, axis_name: str, transport: str = "ipc") -> jax.Array:
  """Sums `x` over the devices of `axis_name` (call inside shard_map). ``transport="nvshmem"``: over
  NVSHMEM, whose PEs are the processes of the jax.distributed job (`Collective`)."""
  name = _NAMES.get(np.dtype(x.dtype))
  if name is None:
    raise TypeError(f"all_reduce supports float32 and int32, not {x.dtype}")
  collective = _collective(axis_name, transport)
  grid = _nvshmem_grid(x.size) if collective.nvshmem else _grid(x.size)
  call = mosaic_kernel(kernel(_kernel_name(name, transport)), jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
                       block=256, scalars=(np.int64(x.size),), collective=collective)
  return call(x)


def all_gather(x: jax.Array, *, axis_name: str, axis_size: int, transport: str = "ipc") -> jax.Array:
  """Stacks `x` from every device of `axis_name` along a new leading axis (``transport`` as for all_reduce)."""
  if np.dtype(x.dtype) != np.float32:
    raise TypeError("all_gather supports float32")
  collective = _collective(axis_name, transport)
  grid = _nvshmem_grid(x.size) if collective.nvshmem else _grid(x.size, 1)
  call = mosaic_kernel(kernel(_kernel_name("all_gather_f32", transport)),
                       jax.ShapeDtypeStruct((axis_size, *x.shape), x.dtype), grid=grid, block=256,
                       scalars=(np.int64(x.size),), collective=collective)
  return call(x)
