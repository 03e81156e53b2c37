"""One process of a job that shares its compiles (tests/test_job_share.py), on the CPU: kernels are compiled for
JAX_MOSAIC_FFI_TARGETS and lowered for CUDA, as the pack tests do, each process with its own empty disk cache.

Run as ``job_share_worker.py RANK NPROCS PORT MODE SEED`` by fresh_process.run_together, with JMF_TEST_CACHES (a
folder: each rank's disk cache is a folder of it); prints one JSON object on its last line (worker_process.py).

Modes: ``share`` (every rank lowers the same call), ``killed`` (rank 1 claims the compile and dies in it),
``killed-two`` (rank 1 claims two and dies in them), ``slow``
(rank 1 claims it and compiles only once rank 0 gave up waiting and compiled it), ``share-gpu`` and ``tuning-gpu``
(on a GPU: kernels for its arch, configs timed on it), ``forged-<how>`` (rank 1
publishes a value that is not the entry), ``another-kernel`` (rank 1 publishes another kernel's entry, validly framed,
under the key of the call rank 0 makes), ``unshareable`` (rank 1's entry is over the bound), ``strict`` (rank 0
serves from packs only: a peer's entry is a compile), ``tuning`` (an autotuned call, timed on the CPU), ``spread``
(JMF_TEST_KERNELS kernels made inside jmf.compile_ahead, then lowered; each rank makes one only once the other is
making one too), ``silent`` (rank 1 claims the compile and stops: SIGSTOP, until rank 0 lowered), ``beating``
(rank 1 claims it, beats for twenty beats' time, then compiles it).
A peer is made slow, killed or a forger by replacing, in its own process, this package's function on the way
(never CUDA, NVRTC or XLA): the compile itself is real everywhere.
"""

import hashlib
import os
import signal
import sys
import threading

os.environ["JAX_MOSAIC_FFI_CACHE_DIR"] = os.path.join(os.environ["JMF_TEST_CACHES"], "rank%s" % sys.argv[1])
if os.environ.get("JMF_TEST_RECORD") and sys.argv[1] == "1":  # one rank records what the job's program used
  os.environ["JAX_MOSAIC_FFI_PACK_RECORD"] = os.environ["JMF_TEST_RECORD"]

from worker_process import MODE, RANK, SEED, await_event, initialize, tell  # noqa: E402
from worker_process import finish as finish_process  # noqa: E402

SOURCE = r'''
extern "C" __global__ void scaled_%d(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = %d.0f * x[i];
}
'''
N = 1024


def _stats(jmf, before) -> dict:
  after = jmf.kernel_cache_stats()
  return {"compiles": sum(after.compiles.values()) - sum(before.compiles.values()),
          "peer_hits": after.peer_hits - before.peer_hits,
          "peer_published": after.peer_published - before.peer_published,
          "peer_unshared": after.peer_unshared - before.peer_unshared,
          "peer_timeouts": after.peer_timeouts - before.peer_timeouts,
          "peer_refused": after.peer_refused - before.peer_refused,
          "disk_hits": after.disk_hits - before.disk_hits}


def lower(jax, jmf, np, count: int = 1) -> list[str]:
  """Compiles ``count`` kernels of this run's seed and lowers a call of each for CUDA: the lowered texts' sha256."""
  digests = []
  for k in range(count):
    kernel = jmf.cuda_kernel(SOURCE % (k, SEED % 1000 + 2), f"scaled_{k}")
    call = jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256), block=256,
                             scalars=lambda x: (np.int32(x.size),))
    lowered = jax.jit(call).trace(jax.ShapeDtypeStruct((N,), np.float32)).lower(lowering_platforms=("cuda",))
    digests.append(hashlib.sha256(lowered.as_text().encode()).hexdigest())
  return digests


def tune(jax, jmf, np) -> dict:
  """Lowers an autotuned call of four configs (a kernel each), timed on the CPU (JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU=1:
  their fallbacks run): its winner, where the decision came from, the lowered text's sha256."""
  def factory(meta):
    kernel = jmf.cuda_kernel(SOURCE % (meta["k"], SEED % 1000 + 2), f"scaled_{meta['k']}")
    return jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: jmf.cdiv(x.size, meta["block"]),
                             block=meta["block"], scalars=lambda x: (np.int32(x.size),),
                             fallback=lambda x: (x * float(SEED % 1000 + 2)) + 0.0 * meta["k"])
  tuned = jmf.autotune(factory, configs=[{"k": k, "block": 64 << (k % 3)} for k in range(4)], name="job-tuned")
  lowered = jax.jit(tuned).trace(jax.ShapeDtypeStruct((N,), np.float32)).lower(lowering_platforms=("cuda",))
  after = jmf.kernel_cache_stats()
  return {"winner": tuned.last_report["winner"], "source": tuned.last_report["source"],
          "tunings": after.autotune_tunings, "autotune_peer_hits": after.autotune_peer_hits,
          "lowered": [hashlib.sha256(lowered.as_text().encode()).hexdigest()]}


def _cached_files() -> int:
  return sum(len(files) for _, _, files in os.walk(os.environ["JAX_MOSAIC_FFI_CACHE_DIR"]))


def main() -> dict:
  jax = initialize(cpu=not MODE.endswith("-gpu"))  # on a GPU: every process on GPU 0, as the collective tests do
  import numpy as np
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.store import job_share, stack
  before = jmf.kernel_cache_stats()
  result = {"rank": RANK}
  compiled = stack._run

  if MODE == "share":
    result["lowered"] = lower(jax, jmf, np, count=int(os.environ.get("JMF_TEST_KERNELS", "1")))
  elif MODE == "spread":
    told = threading.Lock()

    def making(make, ask):  # this rank makes its first only once the other makes one: both take part, at any speed
      if told.acquire(blocking=False):
        tell(f"rank {RANK} making")
      await_event(f"rank {1 - RANK} making")
      return compiled(make, ask)
    stack._run = making
    count = int(os.environ.get("JMF_TEST_KERNELS", "6"))
    with jmf.compile_ahead():
      kernels = [jmf.cuda_kernel(SOURCE % (k, SEED % 1000 + 2), f"scaled_{k}") for k in range(count)]
    result["symbols"] = [k.symbol for k in kernels]
    result["lowered"] = lower(jax, jmf, np, count=count)
  elif MODE in ("silent", "beating"):
    from worker_process import _client
    if RANK == 1:
      def claimed(make, ask):
        _client().key_value_set("worker/pid/1", str(os.getpid()))
        tell("rank 1 claimed the compile")
        if MODE == "silent":
          os.kill(os.getpid(), signal.SIGSTOP)  # living, but silent: rank 0 sends SIGCONT once it lowered
        else:  # living and beating: rank 0 waits past ten beats, for as long as the beat moves
          from jax_mosaic_ffi.store import job_heartbeat
          first = job_heartbeat.HEART._count
          while job_heartbeat.HEART._count < first + 2 * job_heartbeat.SILENT_BEATS:
            threading.Event().wait(job_heartbeat.heartbeat_s())
        return compiled(make, ask)
      stack._run = claimed
      result["lowered"] = lower(jax, jmf, np)
    else:
      await_event("rank 1 claimed the compile")
      result["lowered"] = lower(jax, jmf, np)
      if MODE == "silent":
        os.kill(int(_client().blocking_key_value_get("worker/pid/1", 60_000)), signal.SIGCONT)
  elif MODE in ("killed", "slow"):
    if RANK == 1:
      def claimed(make, ask):
        tell("rank 1 claimed the compile")
        if MODE == "killed":
          os.kill(os.getpid(), signal.SIGKILL)
        await_event("rank 0 lowered")  # compiles only once rank 0 gave up on it and compiled it itself
        return compiled(make, ask)
      stack._run = claimed
      result["lowered"] = lower(jax, jmf, np)
    else:
      await_event("rank 1 claimed the compile")
      result["lowered"] = lower(jax, jmf, np)
      tell("rank 0 lowered")
  elif MODE == "killed-two":
    if RANK == 1:  # claims two compiles (in two threads), then dies in them
      both = threading.Barrier(2)

      def claimed(make, ask):
        if both.wait() == 0:
          tell("rank 1 claimed both")
          os.kill(os.getpid(), signal.SIGKILL)
        threading.Event().wait()
      stack._run = claimed
      threads = [threading.Thread(target=jmf.cuda_kernel, args=(SOURCE % (k, SEED % 1000 + 2), f"scaled_{k}"))
                 for k in range(2)]
      for thread in threads:
        thread.start()
      for thread in threads:
        thread.join()
    await_event("rank 1 claimed both")
    result["lowered"] = lower(jax, jmf, np, count=2)
  elif MODE.startswith("forged-") or MODE == "unshareable":
    if RANK == 1:
      how = MODE.removeprefix("forged-")
      encoded = job_share.encoded
      forgeries = {
          "digest": lambda key, payload: encoded(key, payload)[:-1] + bytes([encoded(key, payload)[-1] ^ 1]),
          "garbage": lambda key, payload: b"not an entry",
          "other_key": lambda key, payload: encoded("0" * 64, payload),
          "large": lambda key, payload: encoded(key, payload) + b"\0" * (job_share.MAX_PAYLOAD_BYTES + 1),
          "length": lambda key, payload: encoded(key, payload)[:9] + b"\xff\xff\xff\x7f" + encoded(key, payload)[13:],
      }
      if MODE == "unshareable":
        job_share.MAX_PAYLOAD_BYTES = 16  # this process's bound: its entry is over it
      else:
        job_share.encoded = forgeries[how]
      result["lowered"] = lower(jax, jmf, np)
      tell("rank 1 published")
    else:
      await_event("rank 1 published")
      result["lowered"] = lower(jax, jmf, np)
  elif MODE == "another-kernel":
    if RANK == 1:
      encoded, payloads = job_share.encoded, {}

      def swapped(key, payload):  # the first entry it published (scaled_1's), under every later key
        payloads.setdefault("first", payload)
        return encoded(key, payloads["first"])
      job_share.encoded = swapped
      jmf.cuda_kernel(SOURCE % (1, SEED % 1000 + 2), "scaled_1")
      result["lowered"] = lower(jax, jmf, np)  # scaled_0: compiled here, scaled_1's entry published for it
      tell("rank 1 published")
    else:
      await_event("rank 1 published")
      result["lowered"] = lower(jax, jmf, np)
  elif MODE == "strict":
    if RANK == 1:
      result["lowered"] = lower(jax, jmf, np)
      tell("rank 1 published")
    else:
      await_event("rank 1 published")
      os.environ["JAX_MOSAIC_FFI_PACKS_STRICT"] = "1"
      try:
        lower(jax, jmf, np)
        result["error"] = None
      except jmf.NotInPacks as err:
        result["error"] = f"NotInPacks: {str(err)[:200]}"
  elif MODE in ("tuning", "tuning-slow", "tuning-gpu", "share-gpu"):
    from jax_mosaic_ffi.transforms import autotune
    if MODE == "tuning-slow":
      decide_here = autotune.Autotuned._decide_here
      if RANK == 1:
        def slow(self, *args):
          tell("rank 1 claimed the decision")
          await_event("rank 0 decided")  # decides only once rank 0 gave up waiting and published its own
          return decide_here(self, *args)
        autotune.Autotuned._decide_here = slow
      else:
        await_event("rank 1 claimed the decision")
    if MODE == "share-gpu":
      result["lowered"] = lower(jax, jmf, np, count=2)
    else:
      result.update(tune(jax, jmf, np))
    if MODE == "tuning-slow" and RANK == 0:
      tell("rank 0 decided")
  result.update(_stats(jmf, before), cached_files=_cached_files())
  result["job"] = jmf.kernel_cache_stats().store.get("compile", {})
  return result


if __name__ == "__main__":
  try:
    outcome = main()
  except Exception as err:  # noqa: BLE001 - reported, so that rank 0 does not wait for a peer that failed
    import traceback
    traceback.print_exc()
    outcome = {"rank": RANK, "failed": f"{type(err).__name__}: {err}"}
  finish_process(outcome, wait_for_peers=not MODE.startswith("killed"))
