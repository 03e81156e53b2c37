"""One process of a cross-process collective test (tests/test_cross_process.py).

Run as ``cross_process_worker.py RANK NPROCS PORT MODE SEED`` by
fresh_process.run_together; prints one JSON object on its last line and leaves
with os._exit (worker_process.py), so that jax.distributed's shutdown barrier never waits for a
peer a test killed on purpose.
"""

import functools
import gc
import os
import re
import time
import traceback

from worker_process import GUARD_S, MODE, NPROCS, RANK, SEED, await_event, initialize, tell
from worker_process import finish as finish_process

# A peer killed on purpose (the "exit" modes) is not waited for.
finish = functools.partial(finish_process, wait_for_peers="exit" not in MODE)


# --- the key-value exchange alone, on CPU ---------------------------------------------------------

def exchange_mode(variant: str) -> dict:
  jax = initialize(cpu=True)
  from jax_mosaic_ffi.call.peers import cross_process
  ids = [min(d.id for d in jax.devices() if d.process_index == p) for p in range(NPROCS)]
  if variant == "other_host" and RANK == 1:
    cross_process.host_identity = lambda: "elsewhere/boot"
  if variant in ("absent", "exits") and RANK == 1:
    if variant == "exits":
      os._exit(0)
    await_event("rank 0 is done")  # alive, but never in the exchange
    finish({"rank": RANK})
  if variant == "abandoned":  # rank 1 joins generation 0 once rank 0 gave up on it; both meet in generation 1
    outcomes = []
    for g in range(2):
      if g == 0 and RANK == 1:
        await_event("rank 0 gave up on generation 0")
      timeout = 2.0 if g == 0 and RANK == 0 else GUARD_S
      try:
        values = cross_process.exchange("site-test/clique-0", RANK, ids, f"deposit {RANK} {g}".encode(), timeout, "k")
        outcomes.append([v.decode() for v in values])
      except Exception as err:  # noqa: BLE001
        outcomes.append(f"{type(err).__name__}: {err}")
      if g == 0 and RANK == 0:
        tell("rank 0 gave up on generation 0")
    return {"outcomes": outcomes}
  # 2 s where the peer never comes (the message names it); where it comes, only a hang guard.
  timeout = 2.0 if variant in ("absent", "exits") else GUARD_S
  start = time.monotonic()
  try:
    values = [cross_process.exchange("site-test/clique-0", RANK, ids, f"deposit {RANK} {g}".encode(), timeout, "k")
              for g in range(3)]  # three generations: keys of the first are deleted on the way
    return {"values": [[v.decode() for v in vs] for vs in values], "seconds": time.monotonic() - start}
  except Exception as err:  # noqa: BLE001
    return {"error": f"{type(err).__name__}: {err}", "seconds": time.monotonic() - start}
  finally:
    if variant == "absent" and RANK == 0:
      tell("rank 0 is done")


def host_mode(variant: str) -> dict:
  """The runtime's host half (its test hook, no GPU) with the real key-value exchange: each execution meets the
  peers as the runtime's does (`meet`; `arrive` alone, as before recovery existed, for `arrive`). Rank 1 stalls
  before execution 2 until rank 0 has run into its timeout (3 s) twice: at execution 2, and at 3 (`meet`: its
  attempt to meet again; `arrive`: refused at once). Every outcome is recorded."""
  jax = initialize(cpu=True)
  from jax_mosaic_ffi import _core
  from jax_mosaic_ffi.call.peers import cross_process
  ids = [10, 11]
  rank = _core._HostRankForTests(RANK, ids, 1 << 20, 0x7f0000000000 + (RANK << 24))

  def timeout(i):
    """3 s where the test runs into it (rank 0's executions 2 and 3; every one after the stall without recovery),
    else only a hang guard: the executions that meet."""
    if i >= 2 and (variant == "arrive" or (RANK == 0 and i in (2, 3))):
      return 3.0
    return GUARD_S

  def trade(seconds):
    return lambda mine: cross_process.exchange("site-test/host", RANK, ids, mine, seconds, "t")

  rank.admit(trade(GUARD_S)(rank.deposit()))
  outcomes = []
  for i in range(8):
    if i == 2 and RANK == 1:
      await_event("rank 0 ran into its timeout twice")
    start = time.monotonic()
    try:
      rank.meet(trade(timeout(i)), timeout(i)) if variant == "meet" else rank.arrive(timeout(i))
      outcomes.append("ok")
    except Exception as err:  # noqa: BLE001
      outcomes.append({"error": str(err), "seconds": time.monotonic() - start, "broken": rank.broken})
    if i == 3 and RANK == 0:
      tell("rank 0 ran into its timeout twice")
  rank.close()
  return {"outcomes": outcomes, "jax": jax.__version__, "guard_s": GUARD_S}


# --- collective kernels on one GPU shared by the processes ------------------------------------------

class Cluster:
  def __init__(self):
    self.jax = jax = initialize(cpu=False)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_mosaic_ffi as jmf
    self.np, self.jmf, self.P = np, jmf, P
    self.mesh = jax.make_mesh((NPROCS,), ("x",))
    self.sharding = NamedSharding(self.mesh, P("x"))

  def put(self, local):
    return self.jax.make_array_from_process_local_data(self.sharding, local)

  def local(self, array):
    return self.np.asarray(array.addressable_shards[0].data)

  def sharded(self, fn):
    return self.jax.jit(self.jax.shard_map(fn, mesh=self.mesh, in_specs=self.P("x"), out_specs=self.P("x")))

  def all_reduce(self):
    return self.sharded(functools.partial(self.jmf.ops.all_reduce, axis_name="x"))


def correctness_mode() -> dict:
  c = Cluster()
  np, jmf = c.np, c.jmf
  rng = np.random.default_rng(SEED)
  out = {"rank": RANK, "checks": {}}

  def draw(shape, dtype):
    if dtype == np.int32:
      both = rng.integers(-1000, 1000, size=(NPROCS, *shape)).astype(np.int32)
    else:
      both = rng.standard_normal((NPROCS, *shape)).astype(np.float32)
    return both, both[RANK]

  reduce = c.all_reduce()
  for dtype, n in ((np.float32, 3 * 1024 + 4), (np.int32, 1 << 20), (np.float32, 64)):
    both, mine = draw((n,), dtype)
    got = c.local(reduce(c.put(mine)))
    ok = np.allclose(got, both.sum(0), rtol=1e-5, atol=1e-5) if dtype == np.float32 else (got == both.sum(0)).all()
    out["checks"][f"all_reduce_{np.dtype(dtype).name}_{n}"] = bool(ok)

  gather = c.sharded(functools.partial(jmf.ops.all_gather, axis_name="x", axis_size=NPROCS))
  both, mine = draw((5000,), np.float32)
  out["checks"]["all_gather"] = bool((c.local(gather(c.put(mine))) == both).all())

  def chain(v):  # five calls in a row: XLA puts them in a command buffer when those are on
    for _ in range(5):
      v = jmf.ops.all_reduce(v, axis_name="x")
    return v

  chained = c.sharded(chain)
  both, mine = draw((4096,), np.int32)
  out["checks"]["chain_of_5"] = bool((c.local(chained(c.put(mine))) == 16 * both.sum(0)).all())

  wrong = 0
  start = time.monotonic()
  for _ in range(1000):
    both, mine = draw((4096,), np.int32)
    wrong += int((c.local(reduce(c.put(mine))) != both.sum(0)).sum())
  out["iterations"] = {"count": 1000, "wrong": wrong, "seconds": time.monotonic() - start}

  from jax_mosaic_ffi.call.peers import cross_process
  c.jax.clear_caches()  # the executables above go, and their workspaces with them
  gc.collect()
  out["after_clear_caches"] = cross_process.stats()
  before = cross_process.stats()
  peak = 0
  start = time.monotonic()
  for _ in range(100):
    both, mine = draw((1 << 18,), np.float32)  # 1 MiB per slot: a leak would show
    compiled = c.all_reduce().lower(c.put(mine)).compile()
    wrong += int(not np.allclose(c.local(compiled(c.put(mine))), both.sum(0), rtol=1e-5, atol=1e-5))
    peak = max(peak, cross_process.stats()["live_workspaces"])
    del compiled
    c.jax.clear_caches()
    gc.collect()
  after = cross_process.stats()
  shm = own_flag_pages()
  out["cycles"] = {"before": before, "after": after, "peak": peak, "wrong": wrong,
                   "seconds": time.monotonic() - start, "shm_files": len(shm)}
  return out


def own_flag_pages() -> list[str]:
  """This process's flag pages left in /dev/shm: random names, so the creator's pid is read from the header."""
  mine = []
  for name in os.listdir("/dev/shm"):
    if not re.fullmatch(r"jmf-[0-9a-f]{32}", name):
      continue
    try:
      with open(os.path.join("/dev/shm", name), "rb") as f:
        header = f.read(16)
    except OSError:
      continue
    if len(header) == 16 and int.from_bytes(header[8:16], "little") == os.getpid():
      mine.append(name)
  return mine


def failure_mode(kind: str) -> dict:
  """Iterations 0..2 together; then rank 1 stalls (`stall`: 2.5 timeouts, then carries on) or dies (`exit`)
  before iteration 3."""
  c = Cluster()
  np = c.np
  reduce = c.all_reduce()
  out = {"rank": RANK, "ok": 0, "ok_iterations": []}
  for i in range(10 if kind == "stall" else 5):
    if i == 3 and RANK == 1:
      if kind == "exit":
        os._exit(0)
      time.sleep(float(os.environ["JAX_MOSAIC_FFI_PEER_TIMEOUT_S"]) * 2.5)
    start = time.monotonic()
    try:
      x = np.full(4096, float(RANK + 1), np.float32)
      got = c.local(reduce(c.put(x)))
      assert (got == 3.0).all(), got[:4]
      out["ok"] += 1
      out["ok_iterations"].append(i)
    except Exception as err:  # noqa: BLE001
      out.setdefault("errors", []).append({"iteration": i, "error": str(err), "seconds": time.monotonic() - start})
  return out


def main():
  try:
    if MODE.startswith("exchange:"):
      result = exchange_mode(MODE.split(":", 1)[1])
    elif MODE.startswith("host:"):
      result = host_mode(MODE.split(":", 1)[1])
    elif MODE == "correct":
      result = correctness_mode()
    elif MODE in ("stall", "exit"):
      result = failure_mode(MODE)
    else:
      raise ValueError(MODE)
  except Exception:  # noqa: BLE001
    result = {"rank": RANK, "crash": traceback.format_exc()[-4000:]}
  finish(result)


if __name__ == "__main__":
  main()
