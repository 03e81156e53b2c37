"""A Hopper (sm_90a) warp-specialized persistent dense GEMM in CuTe DSL, written the way the DSL's Hopper examples
write one, for benchmarks/cute_native.py and tests/test_cute_kernels.py.

    C = A @ B^T      A: (M, K), B: (N, K), C: (M, N), all row-major; bf16 (or fp16) in, f32 accumulation

The launcher, `hopper_gemm(stream, a, b, c, **constexprs)`, has the signature `cutlass.jax.cutlass_call` and
`jmf.cute_call` take. Its constexprs are the tuning knobs, so an autotuner can sweep them:

- tile_n: 256 or 128 columns per CTA tile (the tile is 128 x tile_n x 64);
- cluster_m: 1, or 2 for clusters of two CTAs along M that share each B tile through TMA multicast;
- raster_group: how many cluster rows of tiles are walked together (grouped order, for L2 reuse);
- max_clusters: how many clusters stay resident (persistent grid); 0 means one CTA per SM of an H200 (132).

How it works. Each CTA has three warpgroups. Warpgroup 0 is the producer: after giving registers back
(`setmaxnreg`), one warp streams 128 x 64 tiles of A and tile_n x 64 tiles of B with TMA (128-byte swizzle) into a
ring of shared-memory stages guarded by the DSL's `PipelineTmaAsync` (a full and an empty mbarrier per stage;
with a cluster, each CTA loads half of B and multicasts it to both). Warpgroups 1 and 2 are the consumers: each
issues `wgmma` on 64 rows of the tile with f32 accumulators in registers, keeps one stage of MMAs in flight and
releases a stage as soon as its MMAs retire. The CTAs are persistent: each walks the output tiles
`cluster_id, cluster_id + clusters, ...` in grouped order, so the producer already fills the ring for the next
tile while the consumers store this one. The epilogue converts the accumulators to bf16, writes them to shared
memory with `stmatrix` in 128 x 32 slices and stores each slice with a TMA store (four slices in flight).

M, N and K may be anything TMA takes (rows 16-byte aligned): tiles past the edges are zero-filled by the loads and
clipped by the stores. Written here from the DSL's documentation and examples, not copied.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import numpy as np
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

TILE_M = 128  # two consumer warpgroups of 64 rows each
TILE_K = 64  # one 128-byte swizzle row of 16-bit elements
WARPGROUP = 128
CONSUMER_GROUPS = 2
THREADS = (1 + CONSUMER_GROUPS) * WARPGROUP
PRODUCER_REGISTERS = 40  # setmaxnreg: the producer needs few, the consumers hold 128 f32 accumulators each
CONSUMER_REGISTERS = 232
EPILOGUE_STAGES = 4  # 128 x 32 output slices in shared memory, stored by TMA
EPILOGUE_WARP = WARPGROUP // 32  # the first consumer warp issues the TMA stores
EPILOGUE_BARRIER = 1  # named barrier of the consumer threads (0 is __syncthreads)
H200_SMS = 132


def grouped_tile(t, cluster_rows, tiles_n, group, minimum):
  """The (cluster row, tile column) of the t-th cluster tile in grouped order: `group` cluster rows at a time,
  column by column, so that tiles in flight together share rows of A and columns of B in L2.

  Plain integer arithmetic: the kernel calls it with DSL integers (and `cutlass.min`), the tests with Python ones.
  """
  per_group = group * tiles_n
  first_row = (t // per_group) * group
  rows = minimum(cluster_rows - first_row, group)  # the last group may be shorter
  within = t - (t // per_group) * per_group
  return first_row + within % rows, within // rows


class HopperGemm:
  """One configuration of the GEMM; `hopper_gemm` below is its launcher with the cutlass_call signature."""

  def __init__(self, tile_n: int, cluster_m: int, raster_group: int, max_clusters: int):
    if tile_n not in (128, 256):
      raise ValueError(f"hopper_gemm: tile_n must be 128 or 256, got {tile_n}")
    if cluster_m not in (1, 2):
      raise ValueError(f"hopper_gemm: cluster_m must be 1 or 2, got {cluster_m}")
    if raster_group < 1:
      raise ValueError(f"hopper_gemm: raster_group must be at least 1, got {raster_group}")
    self.tile_mnk = (TILE_M, tile_n, TILE_K)
    self.cluster_m = cluster_m
    self.raster_group = raster_group
    self.max_clusters = max_clusters or H200_SMS // cluster_m
    self.epilogue_barrier = pipeline.NamedBarrier(barrier_id=EPILOGUE_BARRIER,
                                                  num_threads=CONSUMER_GROUPS * WARPGROUP)

  @cute.jit
  def __call__(self, stream: cuda.CUstream, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor):
    if cutlass.const_expr(a.element_type != b.element_type or a.element_type.width != 16):
      raise TypeError(f"hopper_gemm: A and B must both be bf16 or fp16, got {a.element_type} and {b.element_type}")
    a_layout, b_layout, c_layout = (LayoutEnum.from_tensor(t) for t in (a, b, c))
    if cutlass.const_expr(not (a_layout.is_k_major_a() and b_layout.is_k_major_b() and c_layout.is_n_major_c())):
      raise ValueError("hopper_gemm: A (M, K), B (N, K) and C (M, N) must be row-major")
    self.ab_dtype, self.c_dtype = a.element_type, c.element_type
    tile_m, tile_n, tile_k = self.tile_mnk
    tiled_mma = sm90_utils.make_trivial_tiled_mma(
        self.ab_dtype, self.ab_dtype, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
        cutlass.Float32, (CONSUMER_GROUPS, 1, 1), tiler_mn=(tile_m // CONSUMER_GROUPS, tile_n))

    # Shared memory: the epilogue slices, then as many A+B stages as fit (1 KiB left for the barriers).
    self.epi_tile = sm90_utils.compute_tile_shape_or_override(self.tile_mnk, self.c_dtype, is_cooperative=True)
    ab_bytes = (tile_m + tile_n) * tile_k * self.ab_dtype.width // 8
    epi_bytes = cute.size(self.epi_tile) * self.c_dtype.width // 8 * EPILOGUE_STAGES
    slices = (tile_m // self.epi_tile[0]) * (tile_n // self.epi_tile[1])
    if cutlass.const_expr(slices % EPILOGUE_STAGES):  # the kernel cycles its slice buffers in the same order per tile
      raise ValueError(f"hopper_gemm: {slices} epilogue slices per tile must be a multiple of {EPILOGUE_STAGES}")
    self.stages = (SmemAllocator.capacity_in_bytes("sm_90") - 1024 - epi_bytes) // ab_bytes
    a_smem = sm90_utils.make_smem_layout_a(a_layout, self.tile_mnk, self.ab_dtype, self.stages)
    b_smem = sm90_utils.make_smem_layout_b(b_layout, self.tile_mnk, self.ab_dtype, self.stages)
    epi_smem = sm90_utils.make_smem_layout_epi(self.c_dtype, c_layout, self.epi_tile, EPILOGUE_STAGES)

    # TMA: A tiles per CTA; B tiles split between the CTAs of a cluster and multicast to both; C slices stored.
    tma_a, tma_tensor_a = cute.nvgpu.cpasync.make_tiled_tma_atom(
        cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), a, cute.slice_(a_smem, (None, None, 0)), (tile_m, tile_k))
    b_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if self.cluster_m > 1
            else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
    tma_b, tma_tensor_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
        b_op, b, cute.slice_(b_smem, (None, None, 0)), (tile_n, tile_k), num_multicast=self.cluster_m)
    tma_c, tma_tensor_c = cute.nvgpu.cpasync.make_tiled_tma_atom(
        cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), c, cute.slice_(epi_smem, (None, None, 0)), self.epi_tile)

    @cute.struct
    class SharedStorage:
      barriers: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]  # full and empty, one each per stage
      sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(a_smem)], 1024]
      sB: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(b_smem)], 1024]
      sC: cute.struct.Align[cute.struct.MemRange[self.c_dtype, cute.cosize(epi_smem)], 1024]
    self.shared_storage = SharedStorage

    # Persistent grid: at most max_clusters clusters, never more than there are cluster tiles.
    tiles_m = cute.ceil_div(c.shape[0], tile_m)
    tiles_n = cute.ceil_div(c.shape[1], tile_n)
    cluster_tiles = cute.ceil_div(tiles_m, self.cluster_m) * tiles_n
    clusters = cutlass.min(cluster_tiles, self.max_clusters)
    cta_layout = cute.make_layout((self.cluster_m, 1, 1))  # the cluster's CTAs along M
    self.kernel(tiled_mma, tma_a, tma_tensor_a, tma_b, tma_tensor_b, tma_c, tma_tensor_c, cta_layout, a_smem, b_smem,
                epi_smem).launch(grid=[clusters * self.cluster_m, 1, 1], block=[THREADS, 1, 1],
                                 cluster=[self.cluster_m, 1, 1], min_blocks_per_mp=1, stream=stream)

  @cute.kernel
  def kernel(self, tiled_mma: cute.TiledMma, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom,
             mB: cute.Tensor, tma_c: cute.CopyAtom, mC: cute.Tensor, cta_layout: cute.Layout,
             a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout, epi_smem: cute.ComposedLayout):
    tile_m, tile_n, tile_k = self.tile_mnk
    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    group = cute.arch.make_warp_uniform(tidx // WARPGROUP)  # 0: producer, 1 and 2: consumers
    if warp == 0:
      cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
      cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
      cute.nvgpu.cpasync.prefetch_descriptor(tma_c)

    # Where this CTA sits in its cluster, and the cluster's place in the grid.
    rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
    cluster_coord = cta_layout.get_flat_coord(rank_in_cluster)  # (m, 0, 0)
    bidx, _, _ = cute.arch.block_idx()
    grid_x, _, _ = cute.arch.grid_dim()
    cluster_id = bidx // self.cluster_m
    clusters = grid_x // self.cluster_m

    # The ring of A+B stages. The empty barrier of a stage waits for every consumer warp of every CTA its B half
    # went to: a warp arrives once on each CTA of the cluster when it releases the stage.
    storage = SmemAllocator().allocate(self.shared_storage)
    stage_bytes = (cute.size_in_bytes(self.ab_dtype, cute.slice_(a_smem, (None, None, 0)))
                   + cute.size_in_bytes(self.ab_dtype, cute.slice_(b_smem, (None, None, 0))))
    mainloop = pipeline.PipelineTmaAsync.create(
        barrier_storage=storage.barriers.data_ptr(), num_stages=self.stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                 self.cluster_m * CONSUMER_GROUPS * WARPGROUP // 32),
        tx_count=stage_bytes, cta_layout_vmnk=cute.make_layout((1, *cta_layout.shape)), defer_sync=True)
    pipeline.pipeline_init_arrive(cluster_shape_mn=(self.cluster_m, 1), is_relaxed=True)

    sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)  # (bM, bK, STAGES)
    sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)  # (bN, bK, STAGES)
    sC = storage.sC.get_tensor(epi_smem.outer, swizzle=epi_smem.inner)  # (EpiM, EpiN, EPILOGUE_STAGES)

    gA = cute.local_tile(mA, (tile_m, tile_k), (None, None))  # (bM, bK, TilesM, TilesK)
    gB = cute.local_tile(mB, (tile_n, tile_k), (None, None))  # (bN, bK, TilesN, TilesK)
    gC = cute.local_tile(mC, (tile_m, tile_n), (None, None))  # (bM, bN, TilesM, TilesN)
    tiles_m = cute.size(gA, mode=[2])
    tiles_n = cute.size(gB, mode=[2])
    k_tiles = cute.size(gA, mode=[3])
    cluster_rows = cute.ceil_div(tiles_m, self.cluster_m)
    cluster_tiles = cluster_rows * tiles_n

    # TMA partitions: (TMA, TilesM, TilesK) of A for this CTA; B's share of this CTA's rank in the cluster.
    tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                                  cute.group_modes(gA, 0, 2))
    tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(tma_b, cluster_coord[0], cute.make_layout(self.cluster_m),
                                                  cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
    b_mcast_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=0)

    pipeline.pipeline_init_wait(cluster_shape_mn=(self.cluster_m, 1))  # every barrier of the cluster is ready

    if group == 0:
      cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
      if warp == 0:
        fill = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for t in cutlass.range(cluster_id, cluster_tiles, clusters, unroll=1):
          row, tile_col = grouped_tile(t, cluster_rows, tiles_n, self.raster_group, cutlass.min)
          tile_row = row * self.cluster_m + cluster_coord[0]
          tAgA_tile = tAgA[(None, tile_row, None)]
          tBgB_tile = tBgB[(None, tile_col, None)]
          for k in cutlass.range(k_tiles, unroll=1):
            mainloop.producer_acquire(fill)  # waits for the stage to be empty, then expects its bytes
            barrier = mainloop.producer_get_barrier(fill)
            cute.copy(tma_a, tAgA_tile[(None, k)], tAsA[(None, fill.index)], tma_bar_ptr=barrier)
            if cutlass.const_expr(self.cluster_m > 1):
              cute.copy(tma_b, tBgB_tile[(None, k)], tBsB[(None, fill.index)], tma_bar_ptr=barrier,
                        mcast_mask=b_mcast_mask)
            else:
              cute.copy(tma_b, tBgB_tile[(None, k)], tBsB[(None, fill.index)], tma_bar_ptr=barrier)
            mainloop.producer_commit(fill)
            fill.advance()
        mainloop.producer_tail(fill)  # stay until every stage came back: the cluster peer arrives here

    if group > 0:
      cute.arch.setmaxregister_increase(CONSUMER_REGISTERS)
      consumer_tidx = tidx - WARPGROUP
      thr_mma = tiled_mma.get_slice((group - 1) * WARPGROUP)  # rows 64 * (group - 1) of the tile
      tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))  # (MMA, MMA_M, MMA_K, STAGES) descriptors
      tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
      accumulators = cute.make_rmem_tensor(thr_mma.partition_C(gC[(None, None, 0, 0)]).shape, cutlass.Float32)

      # Epilogue: registers -> shared memory with stmatrix, in slices of epi_tile; TMA stores them.
      r2s_atom = sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, self.c_dtype, cutlass.Float32)
      stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.c_dtype)
      tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(stmatrix, tiled_mma))
      thr_r2s = tiled_r2s.get_slice(consumer_tidx)
      tRS_sC = thr_r2s.partition_D(sC)  # (R2S, R2S_M, R2S_N, EPILOGUE_STAGES)
      tRS_rAcc = tiled_r2s.retile(accumulators)
      slice_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
      tRS_rSlice = cute.make_rmem_tensor(slice_shape, cutlass.Float32)
      tRS_rOut = cute.make_rmem_tensor(slice_shape, self.c_dtype)
      slice_size = cute.size(tRS_rSlice)
      stores = pipeline.PipelineTmaStore.create(
          num_stages=EPILOGUE_STAGES,
          producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_GROUPS * WARPGROUP))

      read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
      release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
      for t in cutlass.range(cluster_id, cluster_tiles, clusters, unroll=1):
        row, tile_col = grouped_tile(t, cluster_rows, tiles_n, self.raster_group, cutlass.min)
        tile_row = row * self.cluster_m + cluster_coord[0]

        accumulators.fill(0.0)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        # The first stage: its MMAs stay in flight while the next stage's are issued.
        mainloop.consumer_wait(read)
        self.stage_mmas(tiled_mma, accumulators, tCrA, tCrB, read.index)
        read.advance()
        for _ in cutlass.range(1, k_tiles, unroll=1):
          mainloop.consumer_wait(read)
          self.stage_mmas(tiled_mma, accumulators, tCrA, tCrB, read.index)
          cute.nvgpu.warpgroup.wait_group(1)  # the previous stage's MMAs are done: give that stage back
          mainloop.consumer_release(release)
          release.advance()
          read.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        mainloop.consumer_release(release)  # the tile's last stage
        release.advance()

        # The tile's output, slice by slice: (EpiM, EpiN) slices of (bM, bN), in row-major order of the slices.
        gC_slices = cute.zipped_divide(gC[(None, None, tile_row, tile_col)], self.epi_tile)
        bSG_sC, bSG_gC = cute.nvgpu.cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
                                                          gC_slices)
        slices_mn = gC_slices.shape[1]
        slice_order = cute.make_layout(slices_mn, stride=(slices_mn[1], 1))
        for s in cutlass.range_constexpr(cute.size(gC_slices, mode=[1])):
          buffer = s % EPILOGUE_STAGES  # the same sequence in every tile, as slices % EPILOGUE_STAGES == 0
          for v in cutlass.range_constexpr(slice_size):
            tRS_rSlice[v] = tRS_rAcc[s * slice_size + v]
          tRS_rOut.store(tRS_rSlice.load().to(self.c_dtype))
          cute.copy(tiled_r2s, tRS_rOut, tRS_sC[(None, None, None, buffer)])
          cute.arch.fence_proxy("async.shared", space="cta")  # the stores are visible to the TMA unit
          self.epilogue_barrier.arrive_and_wait()
          if warp == EPILOGUE_WARP:
            cute.copy(tma_c, bSG_sC[(None, buffer)], bSG_gC[(None, slice_order.get_hier_coord(s))])
            stores.producer_commit()
            stores.producer_acquire()  # at most EPILOGUE_STAGES - 1 stores still reading shared memory
          self.epilogue_barrier.arrive_and_wait()  # nobody overwrites a slice buffer still being stored
      stores.producer_tail()

  @cute.jit
  def stage_mmas(self, tiled_mma: cute.TiledMma, accumulators: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                 stage: cutlass.Int32):
    """The MMAs of one stage of the ring (64 along K, 16 per wgmma), issued as one wgmma group."""
    cute.nvgpu.warpgroup.fence()
    for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
      cute.gemm(tiled_mma, accumulators, tCrA[(None, None, kb, stage)], tCrB[(None, None, kb, stage)], accumulators)
    cute.nvgpu.warpgroup.commit_group()


@cute.jit
def hopper_gemm(stream: cuda.CUstream, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, *,
                tile_n: cutlass.Constexpr = 256, cluster_m: cutlass.Constexpr = 1, raster_group: cutlass.Constexpr = 8,
                max_clusters: cutlass.Constexpr = 0):
  """c = a @ b.T on Hopper: a (M, K), b (N, K), c (M, N), row-major, bf16 or fp16 in, f32 accumulation."""
  HopperGemm(tile_n, cluster_m, raster_group, max_clusters)(stream, a, b, c)


def gemm_reference(a, b):
  """numpy: a @ b.T in float32, in c's dtype (that of a)."""
  return (a.astype(np.float32) @ b.astype(np.float32).T).astype(a.dtype)
