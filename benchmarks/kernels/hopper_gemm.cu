// jax_mosaic_ffi's own Hopper GEMM: C = A @ B^T in bf16 with f32 accumulation,
// for sm_90a (wgmma needs the arch-specific target). Written for this project
// from the PTX ISA (wgmma.mma_async, cp.async.bulk.tensor, mbarrier,
// setmaxnreg), in the well-known warp-specialized shape of public Hopper GEMM
// tutorials; no code was copied (docs/benchmarks.md says why it is ours).
//
// A is (M, K) and B is (N, K), both row-major (K-major), C is (M, N)
// row-major. The TMA descriptors of A and B are kernel parameters that
// jax_mosaic_ffi builds (jmf.TensorMap in param_order):
//   a_map: box (BM rows, 64 k), 128-byte swizzle;  b_map: box (BN rows, 64 k), 128-byte swizzle.
// M must be a multiple of BM, N of BN, K of 64 (the Python wrapper checks).
//
// One CTA computes one BM x BN tile of C with 3 warpgroups (384 threads):
//  - warpgroup 0, the producer: one thread streams A and B tiles of 64 k
//    into a STAGES-deep ring of shared memory with TMA, each stage
//    completing on its `full` mbarrier (byte count), and waits on the
//    stage's `empty` mbarrier before reusing it;
//  - warpgroups 1 and 2, the consumers: each owns BM/2 = 64 rows and issues
//    wgmma.m64nBNk16 from shared-memory descriptors (4 per stage), keeps one
//    stage of wgmmas in flight (wait_group 1) and frees the stage before,
//    then writes its f32 accumulators to C as bf16.
// setmaxnreg moves registers from the producer (40) to the consumers (232),
// which hold a 64 x 256 f32 accumulator: 128 registers a thread.
// CTAs are rasterized in groups of GROUP_M row tiles, so that the CTAs
// running at once share A and B tiles in L2.
#include <cuda_bf16.h>
#include <jax_mosaic_ffi/tma.cuh>

#define BM 128
#define BN 256
#define BK 64
#ifndef STAGES
#define STAGES 4
#endif
#ifndef GROUP_M
#define GROUP_M 16
#endif
// CLUSTER_M 2: CTAs of adjacent row tiles (same column tile) run as a
// cluster of 2 and share the B tile: each loads half of it (b_map box
// BN/2 x 64) with TMA multicast into both CTAs' shared memory, and a stage
// is reused only when the consumers of both CTAs released it.
#ifndef CLUSTER_M
#define CLUSTER_M 1
#endif

namespace {

struct alignas(1024) Smem {
  __nv_bfloat16 a[STAGES][BM * BK];  // 16 KiB a stage, 1024-byte aligned (128-byte swizzle atoms)
  __nv_bfloat16 b[STAGES][BN * BK];  // 32 KiB a stage
  unsigned long long full[STAGES];
  unsigned long long empty[STAGES];
};

// A shared-memory matrix descriptor (PTX ISA, wgmma "matrix descriptor") for
// a K-major tile written by TMA with the 128-byte swizzle: rows of 128 bytes,
// 8-row core-matrix groups 1024 bytes apart (stride byte offset), leading
// byte offset unused for swizzled K-major layouts (1), swizzle mode 1 = 128B.
__device__ __forceinline__ unsigned long long smem_desc(const void* p) {
  const unsigned long long address = jmf::smem_address(p);
  return ((address & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// d (64 x 256, f32, this thread's 128 values) += A (64 x 16) * B (256 x 16)^T.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], unsigned long long a, unsigned long long b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},\n"
      " %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void consume(Smem& s, __nv_bfloat16* __restrict__ c, int warpgroup, int tid, int m0,
                                        int n0, int N, int k_tiles, unsigned peer);

}  // namespace

extern "C" __global__ void __launch_bounds__(384, 1)
    hopper_gemm(const __grid_constant__ jmf::TensorMap a_map, const __grid_constant__ jmf::TensorMap b_map,
                __nv_bfloat16* __restrict__ c, int M, int N, int K) {
  extern __shared__ unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;

  // Grouped rasterization: GROUP_M row tiles side by side, then the next column.
  const int tiles_m = M / BM, tiles_n = N / BN;
  const int per_group = GROUP_M * tiles_n;
  const int group = blockIdx.x / per_group, first_m = group * GROUP_M;
  const int rows_in_group = min(tiles_m - first_m, GROUP_M);
  const int within = blockIdx.x % per_group;
  const int m0 = (first_m + within % rows_in_group) * BM, n0 = (within / rows_in_group) * BN;
  const int k_tiles = K / BK;

  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) {
      jmf::mbarrier_init(&s.full[i], 1);
      jmf::mbarrier_init(&s.empty[i], 2 * CLUSTER_M);  // one arrival per consumer warpgroup of the cluster
    }
    jmf::fence_barrier_init();
  }
#if CLUSTER_M > 1
  const unsigned rank = jmf::cluster_rank(), peer = rank ^ 1;
  jmf::cluster_sync();  // the peer's barriers are initialised before anything signals them
#else
  const unsigned peer = 0;  // no cluster
  __syncthreads();
#endif

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int stage = kt % STAGES;
        if (kt >= STAGES) jmf::mbarrier_wait(&s.empty[stage], ((kt / STAGES) - 1) & 1);
        // Every stage receives a whole A and B tile, from this CTA and (multicast) its peer.
        jmf::mbarrier_arrive_expect_tx(&s.full[stage], (BM + BN) * BK * sizeof(__nv_bfloat16));
        jmf::tma_load_2d(s.a[stage], &a_map, kt * BK, m0, &s.full[stage]);
#if CLUSTER_M > 1
        jmf::tma_load_2d_multicast(&s.b[stage][rank * (BN / 2) * BK], &b_map, kt * BK, n0 + rank * (BN / 2),
                                   &s.full[stage], 0x3);
#else
        jmf::tma_load_2d(s.b[stage], &b_map, kt * BK, n0, &s.full[stage]);
#endif
      }
    }
  } else {
    consume(s, c, warpgroup, tid, m0, n0, N, k_tiles, peer);
  }
#if CLUSTER_M > 1
  jmf::cluster_sync();  // no CTA leaves while its peer may still signal its barriers
#endif
}

namespace {

// A consumer warpgroup: 64 rows of the tile, all BN columns.
__device__ __forceinline__ void consume(Smem& s, __nv_bfloat16* __restrict__ c, int warpgroup, int tid, int m0,
                                        int n0, int N, int k_tiles, unsigned peer) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  (void)peer;  // used with clusters only
  const int row0 = (warpgroup - 1) * 64;  // this consumer's rows of the tile
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt % STAGES;
    jmf::mbarrier_wait(&s.full[stage], (kt / STAGES) & 1);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < BK / 16; ++k) {
      wgmma_m64n256k16(d, smem_desc(&s.a[stage][row0 * BK + k * 16]), smem_desc(&s.b[stage][k * 16]));
    }
    wgmma_commit();
    wgmma_wait<1>();  // the stage before this one is read: give it back to the producer
    if (kt > 0 && tid == 0) {
      jmf::mbarrier_arrive(&s.empty[(kt - 1) % STAGES]);
#if CLUSTER_M > 1
      jmf::mbarrier_arrive_cluster(&s.empty[(kt - 1) % STAGES], peer);
#endif
    }
  }
  wgmma_wait<0>();

  // The accumulator fragment of wgmma m64nN: value i of thread t sits at row
  // 16 * warp + lane / 4 (+ 8 for i % 4 >= 2), column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
  const int warp = tid / 32, lane = tid % 32;
  const int row = m0 + row0 + 16 * warp + lane / 4;
  __nv_bfloat16* out = c + static_cast<long long>(row) * N + n0 + 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
    *reinterpret_cast<__nv_bfloat162*>(out + 8 * static_cast<long long>(N) + 8 * j) =
        __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
  }
}

}  // namespace
