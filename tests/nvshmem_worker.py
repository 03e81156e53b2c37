"""One process of an NVSHMEM test across processes (tests/test_nvshmem.py).

Run as ``nvshmem_worker.py RANK NPROCS PORT MODE SEED`` by fresh_process.run_together; prints one JSON object
on its last line and leaves with os._exit (as cross_process_worker.py does, for the same reason).
"""

import time
import traceback

from worker_process import GUARD_S, MODE, NPROCS, RANK, SEED, await_event, initialize, tell
from worker_process import finish


def agree_mode(variant: str) -> dict:
  """The start's agreement step alone, on CPU: every PE's description, a peer that never comes, one that differs."""
  initialize(cpu=True)
  from jax._src import distributed
  from jax_mosaic_ffi.call.peers import nvshmem
  client = distributed.global_state.client
  mine = f"nvshmem=3.4.5;heap={1 << 30};npes={NPROCS}"
  if RANK == 1 and variant == "absent":
    return {"skipped": True}
  if RANK == 1 and variant == "disagree":
    mine = mine.replace("heap=1073741824", "heap=2147483648")
  started = time.monotonic()
  try:  # 2 s where the peer never comes (the message names it); where it comes, only a hang guard
    nvshmem._agree(client, "test/agree", RANK, NPROCS, mine, 2.0 if variant == "absent" else GUARD_S, "t")
    return {"ok": True}
  except Exception as e:  # noqa: BLE001 - reported to the test
    return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - started}


def late_mode() -> dict:
  """PE 1 arrives once PE 0 gave up its first start (timeout 4 s); each PE then tries again, as a program run
  again does, up to three starts (timeout: a hang guard). The unique id is a stand-in for NVSHMEM's (on CPU): the
  trade is the test."""
  import os
  initialize(cpu=True)
  from jax._src import distributed
  from jax_mosaic_ffi.call.peers import nvshmem
  client = distributed.global_state.client
  if RANK == 1:
    await_event("PE 0 gave up its first start")
  outcomes = []
  for attempt in range(3):
    started = time.monotonic()
    timeout = 4.0 if RANK == 0 and attempt == 0 else GUARD_S
    try:
      unique_id = nvshmem.bootstrap(client, RANK, NPROCS, "same", lambda: b"id-" + os.urandom(16), timeout, "t")
      outcomes.append({"id": unique_id.hex(), "seconds": time.monotonic() - started})
      break
    except Exception as e:  # noqa: BLE001 - reported to the test
      outcomes.append({"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - started})
    if RANK == 0 and attempt == 0:
      tell("PE 0 gave up its first start")
  return {"outcomes": outcomes}


def taken_mode() -> dict:
  """Another process already published PE 0's key of the first start: PE 0's start names the key."""
  initialize(cpu=True)
  from jax._src import distributed
  from jax_mosaic_ffi.call.peers import nvshmem
  client = distributed.global_state.client
  if RANK == 1:
    client.key_value_set("jax_mosaic_ffi/nvshmem/1/joined/0", "someone else")
    client.key_value_set("test/taken", "1")
    return {"skipped": True}
  client.blocking_key_value_get("test/taken", int(GUARD_S * 1000))
  try:
    nvshmem.bootstrap(client, RANK, NPROCS, "mine", lambda: b"id", 2.0, "t")
    return {"ok": True}
  except Exception as e:  # noqa: BLE001 - reported to the test
    return {"error": f"{type(e).__name__}: {e}"}


def all_reduce_mode() -> dict:
  """Two PEs on one GPU (when NVSHMEM accepts it): the NVSHMEM all-reduce of both processes' inputs."""
  jax = initialize(cpu=False)
  import functools

  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import jax_mosaic_ffi as jmf
  mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.process_index)), ("x",))  # PE order
  n = 4096
  xs = [np.random.default_rng(SEED + r).standard_normal(n).astype(np.float32) for r in range(NPROCS)]
  local = jax.device_put(xs[RANK], jax.local_devices()[0])
  x = jax.make_array_from_single_device_arrays((NPROCS * n,), NamedSharding(mesh, P("x")), [local])
  f = jax.jit(jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x", transport="nvshmem"), mesh=mesh,
                            in_specs=P("x"), out_specs=P("x")))
  try:
    out = np.asarray(f(x).addressable_shards[0].data)
  except Exception as e:  # noqa: BLE001 - what NVSHMEM said, for the test to record
    return {"refused": f"{type(e).__name__}: {e}"}
  from jax_mosaic_ffi.call.peers import nvshmem
  return {"max_error": float(np.max(np.abs(out - sum(xs)))), "job": nvshmem.job()}


if __name__ == "__main__":
  try:
    kind, _, variant = MODE.partition(":")
    modes = {"agree": lambda: agree_mode(variant), "late": late_mode, "taken": taken_mode}
    result = modes.get(kind, all_reduce_mode)()
  except Exception:  # noqa: BLE001 - reported to the test
    result = {"crash": traceback.format_exc()}
  finish(result)
