"""A Hopper GEMM through mosaic_kernel, its TMA descriptors built by the runtime, against cuBLAS.

bf16 C = A @ B^T (A: M x K, B: N x K, both K-major; f32 accumulation) at
4096 and 8192, with kernels/hopper_gemm.cu (our own TMA + wgmma kernel) and
`jnp.matmul(a, b.T)` (XLA calls cuBLAS) in the same process, interleaved.
One process with command buffers on, one with them off. Each is timed as a
jitted chain of CHAIN dependent GEMMs (c <- c @ B^T, B scaled by 1/sqrt(K) so
values stay O(1)), host wall time per GEMM, median of ROUNDS rounds; both are
checked against each other first.
"""

from __future__ import annotations

import os

from benchmarks import timing
from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import Run

NAME = "gemm"
TITLE = "Hopper GEMM (TMA + wgmma) against cuBLAS"
ORDER = 70
RUNS = (Run("cb_on", kwargs={"command_buffers": True}, timeout_s=120),
        Run("cb_off", kwargs={"command_buffers": False}, xla_flags="--xla_gpu_enable_command_buffer=",
            timeout_s=120))

SIZES = (4096, 8192)
CHAIN = 10
ROUNDS = 10
SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "hopper_gemm.cu")
# name -> (STAGES, GROUP_M, CLUSTER_M): the kernel as shipped first, then what else was tried in the same run.
VARIANTS = {"ours": (4, 16, 1), "ours_stages3": (3, 16, 1), "ours_group8": (4, 8, 1), "ours_cluster2": (4, 16, 2)}
BM, BN, BK = 128, 256, 64


def gemm(jmf, jax, jnp, np, stages: int = 4, group_m: int = 16, cluster_m: int = 1):
  """C = A @ B^T through mosaic_kernel: the kernel gets TMA descriptors of A and B.

  With ``cluster_m=2`` pairs of CTAs share each B tile through TMA multicast.
  """
  kernel = jmf.cuda_kernel(open(SOURCE_PATH).read(), "hopper_gemm", targets=("sm_90a",),
                           options=(f"-DSTAGES={stages}", f"-DGROUP_M={group_m}", f"-DCLUSTER_M={cluster_m}"))
  # The shared-memory ring, its barriers (padded to 1024 bytes) and 1024 bytes to align its start.
  smem = stages * (BM + BN) * BK * 2 + 1024 + 1024

  def check(a, b):
    (m, k), (n, k2) = a.shape, b.shape
    if k != k2 or m % (BM * cluster_m) or n % BN or k % BK:
      raise ValueError(f"hopper_gemm needs A (M, K) and B (N, K) with M % {BM * cluster_m}, N % {BN}, "
                       f"K % {BK} == 0; got {a.shape} and {b.shape}")
    return (m // BM) * (n // BN)

  return jmf.mosaic_kernel(
      kernel, lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[0]), jnp.bfloat16),
      grid=check, block=384, smem_bytes=smem, cluster=(cluster_m, 1, 1),
      scalars=lambda a, b: (np.int32(a.shape[0]), np.int32(b.shape[0]), np.int32(a.shape[1])),
      param_order=(jmf.TensorMap("in0", box=(BM, BK), swizzle=128, l2_promotion=256),
                   jmf.TensorMap("in1", box=(BN // cluster_m, BK), swizzle=128, l2_promotion=256),
                   "out0", "scalar0", "scalar1", "scalar2"),
      fallback=lambda a, b: jnp.matmul(a, b.T))


def run(command_buffers: bool, rounds: int = ROUNDS) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  ours = {name: gemm(jmf, jax, jnp, np, *config) for name, config in VARIANTS.items()}
  paths = dict(ours, cublas=lambda a, b: jnp.matmul(a, b.T))

  def chained(fn):
    def body(c, b):
      for _ in range(CHAIN):
        c = fn(c, b)
      return c
    return jax.jit(body)

  results = {"rounds": rounds, "chain": CHAIN, "command_buffers": command_buffers, "sizes": {}}
  for n in SIZES:
    ka, kb = jax.random.split(jax.random.key(n))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = (jax.random.normal(kb, (n, n), jnp.float32) / np.sqrt(n)).astype(jnp.bfloat16)
    reference = np.asarray(jnp.matmul(a, b.T, preferred_element_type=jnp.float32))
    errors = {}
    for name, fn in ours.items():
      got = np.asarray(jax.jit(fn)(a, b).astype(jnp.float32))
      errors[name] = float(np.max(np.abs(got - reference)) / np.max(np.abs(reference)))
    programs = {name: chained(fn) for name, fn in paths.items()}
    for program in programs.values():
      program(a, b).block_until_ready()  # compiled outside the timing
    seconds = timing.interleaved({k: (lambda p=p: p(a, b).block_until_ready()) for k, p in programs.items()},
                                 rounds)
    flops = 2.0 * n * n * n
    results["sizes"][str(n)] = {
        "us_per_gemm": {k: s / CHAIN * 1e6 for k, s in seconds.items()},
        "tflops": {k: flops * CHAIN / s / 1e12 for k, s in seconds.items()},
        "over_cublas": {k: seconds["cublas"] / s for k, s in seconds.items()},
        "max_rel_error": errors,
    }
  results["tflops_8192"] = results["sizes"]["8192"]["tflops"]  # the goal's metric
  results["tensor_map_encodes"] = jmf.kernel_cache_stats().tensor_map_encodes
  results["records_created"] = jmf.kernel_cache_stats().records_created
  return results


def tables(results: dict) -> list[str]:
  rows = []
  first = None
  for run_name, label in (("cb_on", "on"), ("cb_off", "off")):
    r = results.get(run_name)
    why = failure(r)
    if why:
      rows.append([label, "n/a", why[:80], "", "", "", ""])
      continue
    first = first or r
    for n, s in r["sizes"].items():
      rows.append([label, f"{n}^3", fmt(s["tflops"]["cublas"], 0), fmt(s["tflops"]["ours"], 0),
                   f"**{fmt(s['over_cublas']['ours'])}x**",
                   " / ".join(fmt(s["over_cublas"].get(v)) for v in VARIANTS if v != "ours"),
                   f"{s['max_rel_error']['ours']:.1e}"])
  header = ["command buffers", "size", "cuBLAS TFLOP/s", "ours TFLOP/s", "ours / cuBLAS",
            "stages 3 / group 8 / cluster 2", "max error / max |C|"]
  method = (f"bf16 C = A @ B^T, f32 accumulation: `benchmarks/kernels/hopper_gemm.cu` through `mosaic_kernel` "
            "(two `jmf.TensorMap` parameters, 128-byte swizzle) against `jnp.matmul(a, b.T)` (cuBLAS). A jitted "
            f"chain of {CHAIN} dependent GEMMs, host wall time per GEMM, median of "
            f"{first['rounds'] if first else ROUNDS} interleaved rounds; both checked against each other first. "
            "Ratios above 1: ours is faster.")
  return [method + "\n\n" + table(header, rows, "lrrrrrr"), ABOUT]


ABOUT = (
    "**The kernel is ours.** The issue asked for a public, permissively licensed Hopper GEMM kept verbatim; this "
    "project does not commit code fetched from public sources, so `hopper_gemm.cu` was written here from the PTX "
    "ISA (`wgmma.mma_async`, `cp.async.bulk.tensor`, `mbarrier`, `setmaxnreg`) in the warp-specialized shape the "
    "public Hopper GEMM tutorials describe: one producer warpgroup streaming 128 x 64 and 256 x 64 tiles of A and B "
    "with TMA (128-byte swizzle) into a 4-stage shared-memory ring guarded by mbarriers, two consumer warpgroups "
    "each issuing `wgmma.m64n256k16` on 64 rows with one stage of MMAs in flight, grouped rasterization. Its two "
    "descriptors are `jmf.TensorMap` parameters built by our runtime.\n\n"
    "**What the remaining gap is, and what would close it.** One CTA computes one 128 x 256 tile and exits, and "
    "its results go from registers straight to global memory: while a tile is stored and the next CTA fills its "
    "pipeline, that SM's tensor cores idle. Each CTA also loads its own copy of the A and B tiles from L2. The "
    "kernels that match or pass cuBLAS on Hopper are persistent (each CTA loops over tiles, so the epilogue of "
    "one tile overlaps the loads and MMAs of the next, with two consumer groups taking turns or a TMA store from "
    "shared memory) and use 2-CTA clusters with TMA multicast, so that a B tile read once from L2 feeds two "
    "SMs. Persistence is the next step: the cluster variant measured here (`CLUSTER_M=2`, B multicast, correct "
    "and tested) is about 25% slower than one CTA per tile (not profiled; the likely cause: a new cluster of "
    "two 198 KiB CTAs can start "
    "only when two SMs of one GPC are free at once, so SMs idle between tiles, and the pair waits for its slower "
    "half at every stage); multicast pays once CTAs stay "
    "resident. The stage count (3 is slower) and the raster group (8 or 16) were measured in the same run and "
    "are not where the gap is. `setmaxnreg` is ignored when nvJitLink builds the "
    "PDL-safe cubin (ptxas C7504), so the consumers run under the 168-register cap (154 used): enough for their 128 "
    "accumulators, without spills.")
