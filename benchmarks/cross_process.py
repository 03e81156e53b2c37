"""One-shot all-reduce across two processes (jax.distributed) that share one GPU.

Information only: NCCL refuses two ranks on one GPU, so there is no baseline
to race. Each size runs the same kernel two ways in each process: over the
two-process clique (the input copied into the shared workspace, a device
barrier, every peer's copy read through CUDA IPC) and over a clique of the
process's own device alone (no copy, no barrier, one input read). Their
ratio is what going across processes costs here. The two processes time at
once on the one GPU, and without MPS their kernels never run at the same
time: each device barrier waits for a context switch (measured: a flat
4.5 ms per all-reduce at every size), so the numbers show the test setup's
time slicing, not what one GPU per process would cost.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

from benchmarks import REPO
from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import Run

NAME = "cross_process"
TITLE = "All-reduce across processes (one GPU, two processes)"
ORDER = 51
RUNS = (Run("main", timeout_s=240.0),)

REPEAT = 20  # all-reduces chained in one jit
ROUNDS = 10
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def run() -> dict:
  from jax_mosaic_ffi import _core
  if not _core.visible_gpus():
    return {"skipped": "needs an NVIDIA GPU"}
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  outs = [tempfile.TemporaryFile("w+") for _ in range(2)]
  # The source tree goes last on the path: its jax_mosaic_ffi may have no compiled extension.
  child = (f"import sys; sys.path.append({REPO!r}); from benchmarks import cross_process; "
           "cross_process.child(int(sys.argv[1]), int(sys.argv[2]))")
  procs = [subprocess.Popen([sys.executable, "-c", child, str(rank), str(port)], env=env,
                            stdout=outs[rank], stderr=subprocess.STDOUT, text=True, cwd=tempfile.gettempdir())
           for rank in range(2)]
  try:
    for p in procs:
      p.wait(timeout=200)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  outs[0].seek(0)
  text = outs[0].read()
  lines = [line for line in text.splitlines() if line.startswith("{")]
  if not lines:
    return {"error": f"rank 0 printed no result:\n{text[-1500:]}"}
  return json.loads(lines[-1])


def _worker(rank: int, port: int) -> dict:
  import time

  import jax
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                             local_device_ids=[0])
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import jax_mosaic_ffi as jmf
  both = Mesh(np.array(jax.devices()), ("x",))
  alone = Mesh(np.array(jax.local_devices()), ("x",))

  def chained(mesh):
    def f(v):
      for _ in range(REPEAT):
        v = jmf.ops.all_reduce(v, axis_name="x") * (1.0 / mesh.size)
      return v
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

  across, local = chained(both), chained(alone)
  rows = []
  for size in SIZES:
    n = size // 4
    data = np.random.default_rng(size).standard_normal((2, n)).astype(np.float32)
    x2 = jax.make_array_from_process_local_data(NamedSharding(both, P("x")), data[rank])
    x1 = jax.device_put(data[rank], NamedSharding(alone, P("x")))
    got = np.asarray(across(x2).addressable_shards[0].data)
    np.testing.assert_allclose(got, data.mean(0), rtol=1e-4, atol=1e-4)
    times = {"across": [], "alone": []}
    for r in range(ROUNDS + 2):
      for name, fn, x in (("across", across, x2), ("alone", local, x1)):
        start = time.perf_counter()
        fn(x).block_until_ready()
        if r >= 2:
          times[name].append((time.perf_counter() - start) / REPEAT * 1e6)
    across_us, alone_us = float(np.median(times["across"])), float(np.median(times["alone"]))
    rows.append({"bytes": size, "across_us": across_us, "alone_us": alone_us, "ratio": across_us / alone_us})
  return {"rows": rows, "repeat": REPEAT, "rounds": ROUNDS}


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  rows = [[str(row["bytes"]), fmt(row["across_us"]), fmt(row["alone_us"]), fmt(row["ratio"])] for row in r["rows"]]
  method = (f"Two processes on one GPU (jax.distributed, CUDA_VISIBLE_DEVICES=0): {r['repeat']} all-reduces "
            f"chained in one jitted `shard_map`, host-timed median of {r['rounds']} calls per size, per all-reduce. "
            "'alone' is the same kernel over the process's own device only (no workspace copy, no barrier); "
            "NCCL cannot run two ranks on one GPU, so there is no NCCL column. The two processes' kernels "
            "time-slice on the one GPU (no MPS), so each device barrier waits for a context switch: "
            "this measures the test setup, not one GPU per process.")
  return [method + "\n\n" + table(["bytes per rank", "across processes (us)", "one device alone (us)", "ratio"], rows)]


def child(rank: int, port: int) -> None:
  """One of the two processes; prints its result, leaves without jax.distributed's shutdown barrier."""
  result = _worker(rank, port)
  print(json.dumps(result), flush=True)
  try:  # rank 0 hosts the coordination service: it leaves last
    from jax._src import distributed
    client = distributed.global_state.client
    if rank == 1:
      client.key_value_set("bench/done", "1")
    else:
      client.blocking_key_value_get("bench/done", 60_000)
  except Exception:  # noqa: BLE001
    pass
  os._exit(0)
