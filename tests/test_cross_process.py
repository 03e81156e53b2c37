"""Collective kernels across processes (jax.distributed, one GPU per process).

Every test runs real processes (fresh_process.run_together, tests/cross_process_worker.py).
The key-value exchange runs on CPU; the kernels need a GPU, where two
processes share the one GPU (CUDA_VISIBLE_DEVICES=0 for both): NCCL refuses
that, so nothing here uses an XLA collective.
"""

import os

import pytest

import fresh_process

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cross_process_worker.py")

CPU = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
GPU = {"CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def outcomes(*args, env, timeout=120):
  """Every rank's JSON result; a rank that printed none fails the test with its stderr."""
  return [f.result for f in fresh_process.run_together(*args, script=WORKER, env=env, timeout=timeout)]


def survivor(*args, env, timeout=120):
  """Rank 0's result, when rank 1 dies on purpose."""
  return fresh_process.run_together(*args, script=WORKER, env=env, timeout=timeout)[0].result


# --- the exchange, on CPU -------------------------------------------------------------------------

def test_exchange_trades_every_ranks_deposit_over_generations():
  for rank, r in enumerate(outcomes("exchange:ok", env=CPU)):
    assert "error" not in r, r
    assert r["values"] == [[f"deposit 0 {g}", f"deposit 1 {g}"] for g in range(3)], (rank, r)


@pytest.mark.parametrize("variant", ["absent", "exits"])
def test_exchange_times_out_naming_the_peer(variant):
  r = survivor(f"exchange:{variant}", env=CPU)
  assert r["error"].startswith("TimeoutError: k: rank 0 waited 2 s for peer rank 1 (device"), r
  assert "process 1)" in r["error"] and "JAX_MOSAIC_FFI_PEER_TIMEOUT_S" in r["error"]
  assert 1.5 < r["seconds"] < 10, r


def test_a_late_rank_never_uses_an_exchange_its_peer_abandoned():
  first, late = (r["outcomes"] for r in outcomes("exchange:abandoned", env=CPU))
  assert first[0].startswith("TimeoutError: k: rank 0 waited 2 s for peer rank 1"), first
  # Rank 0's deposit of generation 0 is still in the store: rank 1 must not take it.
  assert late[0].startswith("RuntimeError: k: peer rank 0 (device "), late
  assert "gave up on this collective workspace exchange before rank 1 joined it" in late[0], late
  # The next attempt starts in step.
  assert first[1] == late[1] == ["deposit 0 1", "deposit 1 1"], (first, late)


def test_a_peer_on_another_host_is_refused():
  r = outcomes("exchange:other_host", env=CPU)[0]
  assert r["error"].startswith("RuntimeError: k: peer rank 1"), r
  assert "runs on host 'elsewhere'" in r["error"] and "one host" in r["error"]


# --- kernels, two processes on one GPU --------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("xla_flags", ["", "--xla_gpu_enable_command_buffer="], ids=["cmdbuf_on", "cmdbuf_off"])
def test_all_reduce_and_all_gather_across_two_processes(xla_flags):
  seed = int.from_bytes(os.urandom(4), "little")
  results = outcomes("correct", seed, env={**GPU, "XLA_FLAGS": xla_flags}, timeout=400)
  for r in results:
    assert "crash" not in r, r.get("crash")
    assert all(r["checks"].values()), (seed, r["checks"])
    assert r["iterations"]["wrong"] == 0, (seed, r["iterations"])
    cycles = r["cycles"]
    assert cycles["wrong"] == 0, (seed, cycles)
    # Every cycle's workspace, peer mapping and flag page is gone with its executable.
    assert cycles["after"] == cycles["before"], cycles
    assert cycles["peak"] == cycles["before"]["live_workspaces"] + 1, cycles
    assert cycles["shm_files"] == 0, cycles


@pytest.mark.gpu
def test_a_stalled_peer_gives_an_error_naming_it():
  stalled = outcomes("stall", env={**GPU, "JAX_MOSAIC_FFI_PEER_TIMEOUT_S": "3"}, timeout=180)
  waiting, sleeper = stalled
  assert "crash" not in waiting and "crash" not in sleeper, stalled
  assert waiting["ok"] == 3 and waiting["errors"][0]["iteration"] == 3, waiting
  first = waiting["errors"][0]
  assert "waited 3 s for peer rank 1 (device " in first["error"] and "never did" in first["error"], first
  assert 2.5 < first["seconds"] < 20, first
  # The sleeper wakes to find that its peer gave up, and fails too instead of waiting in turn.
  assert sleeper["errors"][0]["iteration"] == 3 and "gave up" in sleeper["errors"][0]["error"], sleeper
  assert len(waiting["errors"]) == 2 and "cannot resynchronize" in waiting["errors"][1]["error"], waiting


@pytest.mark.gpu
def test_a_peer_that_exits_gives_an_error_not_a_hang():
  r = survivor("exit", env={**GPU, "JAX_MOSAIC_FFI_PEER_TIMEOUT_S": "3"}, timeout=180)
  assert "crash" not in r, r
  assert r["ok"] == 3 and r["errors"][0]["iteration"] == 3, r
  assert "peer rank 1 (device " in r["errors"][0]["error"], r
