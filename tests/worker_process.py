"""What the workers of the tests across processes share (cross_process_worker.py, nvshmem_worker.py): their
command line, joining the jax.distributed job, and leaving it.

A worker runs as ``WORKER.py RANK NPROCS PORT MODE SEED`` (fresh_process.run_together), prints one JSON object on
its last line and leaves with os._exit, so that jax.distributed's shutdown barrier never waits for a peer a test
killed on purpose.
"""

import json
import os
import sys

import fresh_process

# A wait that ends unless something hangs (a peer that should come, the success path of an exchange): only a
# hang guard, never a measure of speed. A timeout a test is about is short and named where it is used.
GUARD_S = fresh_process.INNER_GUARD_S

RANK, NPROCS, PORT, MODE = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
SEED = int(sys.argv[5]) if len(sys.argv) > 5 else 0


def finish(result: dict, wait_for_peers: bool = True) -> None:
  print(json.dumps(result), flush=True)
  sys.stderr.flush()
  # Process 0 hosts the coordination service: were it to go first, the others would be
  # terminated by jax.distributed. So the others say goodbye and it waits for them.
  try:
    from jax._src import distributed  # noqa: PLC0415  (only once the worker has run: jax may never be imported)
    client = distributed.global_state.client
    if client is not None and RANK != 0:
      client.key_value_set("worker/done/%d" % RANK, "1")
    elif client is not None and wait_for_peers:
      for r in range(1, NPROCS):
        client.blocking_key_value_get("worker/done/%d" % r, int(GUARD_S * 1000))
  except Exception:  # noqa: BLE001 - a peer that died; nothing to wait for
    pass
  os._exit(0)


def _client():
  from jax._src import distributed  # noqa: PLC0415  (once initialize ran)
  return distributed.global_state.client


def tell(event: str) -> None:
  """Tells the peers that this process got to ``event``: a test orders its processes by events, never by sleeps,
  so that its outcome is the same at any speed."""
  _client().key_value_set(f"worker/event/{event}", "1")


def await_event(event: str) -> None:
  """Waits until a peer `tell`s ``event``."""
  _client().blocking_key_value_get(f"worker/event/{event}", int(GUARD_S * 1000))


def initialize(cpu: bool):
  import jax  # noqa: PLC0415  (after the caller's environment is set)
  if cpu:
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{PORT}", num_processes=NPROCS, process_id=RANK)
  else:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{PORT}", num_processes=NPROCS, process_id=RANK,
                               local_device_ids=[0])
  jax.devices()  # every process builds its backend: the topology is traded at this point
  return jax
