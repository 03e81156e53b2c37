// TMA (the tensor memory accelerator, sm_90+) for kernels launched by
// jax_mosaic_ffi: the descriptor type a jmf.TensorMap parameter arrives as,
// and thin wrappers over the PTX that uses it (PTX ISA: mbarrier,
// cp.async.bulk.tensor). Nothing here allocates or launches.
//
//   #include <jax_mosaic_ffi/tma.cuh>
//   extern "C" __global__ void k(const __grid_constant__ jmf::TensorMap x, ...)
//
// Coordinates are innermost first: for an (M, K) array, {k, m}.
#ifndef JAX_MOSAIC_FFI_TMA_CUH_
#define JAX_MOSAIC_FFI_TMA_CUH_

namespace jmf {

// The 128-byte CUtensorMap the runtime encodes; opaque to the kernel.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// An mbarrier that completes a phase after `count` arrivals and the bytes announced.
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
}

// After initialising barriers, before the copy engine may use them (then __syncthreads()).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One arrival that also announces `bytes` the copy engine will deliver.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait(unsigned long long* bar, unsigned phase) {
  unsigned done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(phase)
      : "memory");
  return done != 0;
}

// Waits until the barrier's phase of parity `phase` (0, 1, 0, ...) completed.
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned phase) {
  while (!mbarrier_try_wait(bar, phase)) {
  }
}

// A 2-D box of `map` at {c0, c1} into shared memory; completes on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, int c0, int c1, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(smem_address(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(smem_address(bar))
      : "memory");
}

// The same box delivered to the same shared-memory offset (and barrier offset)
// in every CTA of the cluster named in `cta_mask` (bit i: cluster rank i).
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const TensorMap* map, int c0, int c1,
                                                      unsigned long long* bar, unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(smem_address(bar)), "h"(cta_mask)
      : "memory");
}

// This CTA's rank in its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// Every thread of every CTA in the cluster: arrive, then wait for all.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// One arrival on the barrier at the same shared-memory offset in CTA `cta` of the cluster.
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned long long* bar, unsigned cta) {
  asm volatile(
      "{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}" ::"r"(smem_address(bar)),
      "r"(cta)
      : "memory");
}

// Makes this thread's ordinary shared-memory writes visible to the copy engine.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// A 2-D box from shared memory to `map` at {c0, c1}; parts outside the array are dropped.
__device__ __forceinline__ void tma_store_2d(const TensorMap* map, int c0, int c1, const void* src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(c0), "r"(c1), "r"(smem_address(src))
               : "memory");
}

// Ends a group of stores, and waits until their shared memory has been read.
__device__ __forceinline__ void tma_store_commit_and_wait() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_TMA_CUH_
