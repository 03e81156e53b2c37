"""One-shot all-reduce (jmf.ops.all_reduce) against jax.lax.psum (NCCL), and its NVSHMEM version against it.

Run "main": latency per call from 4 KiB to 64 MiB per device, both in the same process, over every visible
GPU. Needs two or more GPUs; says why it skipped otherwise. Multicast stays off (NCCL_NVLS_ENABLE=0).

Run "nvshmem": the NVSHMEM all-reduce (transport="nvshmem") against the IPC one in the same setting: one
process, one GPU, one PE (NVSHMEM runs one PE per process, so several GPUs of one process cannot host it; the
multi-process setting needs several GPUs). What it measures is each transport's cost around the same
one-device reduction: NVSHMEM's staging copies, cooperative launch and barriers against the IPC path's
device barrier. Needs the nvshmem extra.
"""

from __future__ import annotations

import os

from benchmarks import timing
from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import Run

NAME = "allreduce"
TITLE = "One-shot all-reduce"
ORDER = 50
RUNS = (Run("main"), Run("nvshmem", kwargs={"transports": True}, optional=True))

REPEAT = 20  # calls per jit, so dispatch does not dominate small sizes
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
SMALL = 256 << 10  # the goal's "small": at most this many bytes per device


def run(transports: bool = False) -> dict:
  if transports:
    return run_transports()
  os.environ["NCCL_NVLS_ENABLE"] = "0"  # before jax starts NCCL
  import functools

  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import jax_mosaic_ffi as jmf
  try:
    devices = jax.devices("cuda")
  except RuntimeError:
    devices = []
  if len(devices) < 2:
    return {"skipped": f"needs 2 or more GPUs, found {len(devices)}"}
  mesh = Mesh(np.array(devices), ("x",))

  def repeated(reduce):
    def f(v):
      for _ in range(REPEAT):
        v = reduce(v) * (1.0 / len(devices))  # keep values bounded, same work for both
      return v
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

  ours = repeated(functools.partial(jmf.ops.all_reduce, axis_name="x"))
  nccl = repeated(lambda v: jax.lax.psum(v, "x"))
  rows = []
  for size in SIZES:
    x = jax.device_put(np.random.default_rng(0).standard_normal(size // 4 * len(devices)).astype(np.float32),
                       NamedSharding(mesh, P("x")))
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(nccl(x)), rtol=1e-4, atol=1e-4)
    seconds = timing.interleaved({"ours": lambda: ours(x).block_until_ready(),
                                  "psum": lambda: nccl(x).block_until_ready()}, rounds=20)
    rows.append({"bytes": size, "ours_us": seconds["ours"] / REPEAT * 1e6, "psum_us": seconds["psum"] / REPEAT * 1e6,
                 "speedup": seconds["psum"] / seconds["ours"]})
  small = [r["speedup"] for r in rows if r["bytes"] <= SMALL]
  return {"devices": len(devices), "rows": rows, "min_speedup_small": min(small)}


def run_transports() -> dict:

  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.base import nvshmem_package
  if nvshmem_package.find() is None:
    return {"skipped": f"NVSHMEM is not installed ({nvshmem_package.INSTALL_HINT})"}
  try:
    devices = jax.devices("cuda")[:1]
  except RuntimeError:
    return {"skipped": "no CUDA device"}
  mesh = Mesh(np.array(devices), ("x",))

  def repeated(transport):
    def f(v):
      for _ in range(REPEAT):
        v = jmf.ops.all_reduce(v, axis_name="x", transport=transport) * 0.5
      return v
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

  ipc, nvshmem = repeated("ipc"), repeated("nvshmem")
  rows = []
  for size in SIZES:
    x = jax.device_put(np.random.default_rng(0).standard_normal(size // 4).astype(np.float32),
                       NamedSharding(mesh, P("x")))
    np.testing.assert_allclose(np.asarray(nvshmem(x)), np.asarray(ipc(x)), rtol=1e-6, atol=1e-6)
    seconds = timing.interleaved({"ipc": lambda: ipc(x).block_until_ready(),
                                  "nvshmem": lambda: nvshmem(x).block_until_ready()}, rounds=20)
    rows.append({"bytes": size, "ipc_us": seconds["ipc"] / REPEAT * 1e6,
                 "nvshmem_us": seconds["nvshmem"] / REPEAT * 1e6, "ratio": seconds["nvshmem"] / seconds["ipc"]})
  return {"devices": 1, "rows": rows}


def tables(results: dict) -> list[str]:
  return [_psum_table(results.get("main")), _transport_table(results.get("nvshmem"))]


def _transport_table(r) -> str:
  why = failure(r)
  if why:
    return f"NVSHMEM against IPC: n/a: {why}"
  rows = [[str(row["bytes"]), fmt(row["ipc_us"]), fmt(row["nvshmem_us"]), fmt(row["ratio"])] for row in r["rows"]]
  method = (f"NVSHMEM against IPC, one process, one GPU, one PE: {REPEAT} all-reduces chained in one jitted "
            "`shard_map`, host-timed median of 20 calls over 20, the two interleaved at each size; checked equal "
            "first. Ratio: NVSHMEM time / IPC time (the cost of staging through the symmetric heap and of "
            "NVSHMEM's barriers).")
  return method + "\n\n" + table(["bytes", "IPC all-reduce (us)", "NVSHMEM all-reduce (us)", "NVSHMEM / IPC"],
                                  rows)


def _psum_table(r) -> str:
  why = failure(r)
  if why:
    return f"n/a: {why}"
  rows = [[str(row["bytes"]), fmt(row["ours_us"]), fmt(row["psum_us"]), fmt(row["speedup"])] for row in r["rows"]]
  method = (f"On {r['devices']} GPUs: {REPEAT} all-reduces chained in one jitted `shard_map`, host-timed median of "
            "20 calls over 20, ours and psum interleaved at each size; checked against psum first.")
  return method + "\n\n" + table(["bytes per device", "one-shot all-reduce (us)", "psum / NCCL (us)", "speedup"],
                                 rows)
