// Device-side view of the collective metadata that jax_mosaic_ffi passes to a
// collective kernel as its last parameter. On NVRTC's include path by default:
//
//   #include <jax_mosaic_ffi/collective.cuh>
//   extern "C" __global__ void k(const float* x, float* y, const jmf::CollectiveMetadata* meta) {
//     const float* x_on_peer = jmf::peer_ptr(meta, /*param=*/0, /*rank=*/1, x);
//     ...
//     jmf::exit_barrier(meta);
//   }
//
// The layout (docs/collectives.md) starts with XLA's: a 32-byte header, then
// param_to_peers[P * N], then param_to_multimem[P]; jax_mosaic_ffi appends
// each rank's barrier area. Parameters are numbered inputs first, then
// outputs, as the runtime sees its buffers (not as param_order lists them).
#ifndef JAX_MOSAIC_FFI_COLLECTIVE_CUH_
#define JAX_MOSAIC_FFI_COLLECTIVE_CUH_

namespace jmf {

typedef unsigned long long u64;

struct CollectiveMetadata {
  u64 rank;
  void** param_to_peers;     // [P * N]: buffer p on rank r at p * N + r
  void** param_to_multimem;  // [P]: null, multicast is off
  u64 num_peers;             // N (XLA leaves this word as padding)
};

// Word offsets in a barrier area; csrc/runtime/collective.h has the same numbers.
constexpr int kKernelRow = 72;
constexpr int kKernelArrivals = 137;

#ifndef JMF_BARRIER_TIMEOUT_NS
#define JMF_BARRIER_TIMEOUT_NS 60000000000ull  // a peer that never arrives traps after 60 s
#endif

__device__ __forceinline__ int rank(const CollectiveMetadata* m) { return static_cast<int>(m->rank); }
__device__ __forceinline__ int num_peers(const CollectiveMetadata* m) { return static_cast<int>(m->num_peers); }

// Parameter `param` (inputs then outputs) as seen on `peer_rank`, typed like `like`.
template <typename T>
__device__ __forceinline__ T* peer_ptr(const CollectiveMetadata* m, int param, int peer_rank, T* like = nullptr) {
  return static_cast<T*>(m->param_to_peers[param * m->num_peers + peer_rank]);
}

// Each rank's barrier area, after the XLA part of the metadata.
__device__ __forceinline__ u64* const* barrier_areas(const CollectiveMetadata* m) {
  const u64 params = (reinterpret_cast<const char*>(m->param_to_multimem) -
                      reinterpret_cast<const char*>(m->param_to_peers)) / (sizeof(void*) * m->num_peers);
  return reinterpret_cast<u64* const*>(m->param_to_multimem + params);
}

__device__ __forceinline__ void store_release_sys(u64* address, u64 value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ u64 load_acquire_sys(const u64* address) {
  u64 value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ u64 global_timer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Call as the last thing every block of the kernel does. It returns at once
// in all blocks but the last to finish on this device; that block waits
// until the last blocks of all peers have arrived too, so no rank's kernel
// completes (and no rank moves on to overwrite buffers its peers still read)
// before every rank is done. Blocks need not be co-resident.
__device__ inline void exit_barrier(const CollectiveMetadata* m) {
  __syncthreads();
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return;
  u64* const* areas = barrier_areas(m);
  const int me = rank(m);
  const int peers = num_peers(m);
  u64* own = areas[me];
  __threadfence_system();
  const u64 blocks = static_cast<u64>(gridDim.x) * gridDim.y * gridDim.z;
  const u64 arrived = atomicAdd(reinterpret_cast<unsigned long long*>(own + kKernelArrivals), 1ull) + 1;
  if (arrived % blocks != 0) return;
  const u64 target = arrived / blocks;  // one generation per launch
  for (int p = 0; p < peers; ++p) store_release_sys(areas[p] + kKernelRow + me, target);
  const u64 start = global_timer_ns();
  for (int p = 0; p < peers; ++p) {
    while (load_acquire_sys(own + kKernelRow + p) < target) {
      if (global_timer_ns() - start > JMF_BARRIER_TIMEOUT_NS) __trap();
      __nanosleep(64);
    }
  }
}

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_COLLECTIVE_CUH_
