"""Compiling once per job (store/job_share.py): several processes under jax.distributed on one machine, on the
CPU, each with its own empty disk cache, compile kernels for JAX_MOSAIC_FFI_TARGETS and lower them for CUDA, as the
pack tests do (tests/job_share_worker.py). Processes are ordered by events in the store, never by sleeps; the one
short timeout (JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S=2) is where a test is about a peer that never publishes."""

import os
import subprocess
import sys

import pytest

import fresh_process

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "job_share_worker.py")
TARGETS = "sm_90"


def _run(tmp_path, mode: str, nprocs: int = 2, seed: int | None = None, **env) -> list[dict]:
  environment = {"JMF_TEST_CACHES": str(tmp_path), **({} if mode.endswith("-gpu") else
                                                       {"JAX_MOSAIC_FFI_TARGETS": TARGETS}), **env}
  seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
  finished = fresh_process.run_together(mode, seed, script=WORKER, nprocs=nprocs, env=environment)
  return finished


def _results(finished, ranks=None) -> list[dict]:
  out = []
  for rank, f in enumerate(finished):
    if ranks is not None and rank not in ranks:
      continue
    # Its result line, not its exit code: a rank other than 0 may be stopped by jax.distributed after it reported
    # (process 0, which hosts the coordinator, may leave while it leaves), as in the collective tests.
    assert "failed" not in f.result, f"rank {rank} failed:\n{f.stderr[-4000:]}"
    out.append(f.result)
  return out


def test_each_kernel_is_compiled_once_per_job_and_every_process_lowers_the_same_call(tmp_path):
  results = _results(_run(tmp_path, "share", nprocs=3, JMF_TEST_KERNELS="2"))
  assert sum(r["compiles"] for r in results) == 2  # two kernels, one arch: one compile each across the job
  assert sum(r["peer_hits"] for r in results) == 4
  assert sum(r["peer_published"] for r in results) == 2
  assert all(r["peer_timeouts"] == r["peer_refused"] == r["peer_unshared"] == 0 for r in results)
  assert len({tuple(r["lowered"]) for r in results}) == 1
  # Each process keeps on its disk what it compiled, never a peer's entry: a later process outside the job would take
  # it as its own (docs/threat_model.md).
  assert all(r["cached_files"] == r["compiles"] for r in results)


def test_off_by_the_setting_every_process_compiles(tmp_path):
  results = _results(_run(tmp_path, "share", JAX_MOSAIC_FFI_JOB_SHARE="0"))
  assert [r["compiles"] for r in results] == [1, 1]
  assert all(r["peer_hits"] == r["peer_published"] == 0 for r in results)
  assert len({tuple(r["lowered"]) for r in results}) == 1


def test_a_claimant_killed_mid_compile_leaves_the_others_to_compile_after_the_bound(tmp_path):
  finished = _run(tmp_path, "killed", JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S="2")
  assert finished[1].returncode == -9
  (survivor,) = _results(finished, ranks=(0,))
  assert (survivor["compiles"], survivor["peer_timeouts"], survivor["peer_hits"]) == (1, 1, 0)
  assert survivor["peer_published"] == 1  # for any process still to come


def test_a_claimant_that_died_holding_two_claims_costs_the_others_no_hang(tmp_path):
  """Rank 0 waits for the first (up to the bound), then takes the second's claimant for late: it compiles both."""
  finished = _run(tmp_path, "killed-two", JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S="2")
  assert finished[1].returncode == -9
  (survivor,) = _results(finished, ranks=(0,))
  assert (survivor["compiles"], survivor["peer_timeouts"], survivor["peer_hits"]) == (2, 2, 0)


def test_a_slow_claimant_is_not_waited_for_past_the_bound_and_both_lower_the_same_call(tmp_path):
  results = _results(_run(tmp_path, "slow", JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S="2"))
  assert (results[0]["compiles"], results[0]["peer_timeouts"], results[0]["peer_published"]) == (1, 1, 1)
  # The claimant compiled too, and found the entry already published: the store keeps the first.
  assert (results[1]["compiles"], results[1]["peer_published"]) == (1, 0)
  assert results[0]["lowered"] == results[1]["lowered"]


def test_a_silent_claimant_stalls_the_others_ten_beats_not_the_wait_bound(tmp_path):
  """Rank 1 claims the compile and stops (SIGSTOP: alive, silent) until rank 0 lowered. The wait bound is far past
  the test's pace (an hour would fail the test at its guard): only the claimant's silence ends rank 0's wait."""
  results = _results(_run(tmp_path, "silent", JAX_MOSAIC_FFI_JOB_SHARE_HEARTBEAT_S="0.2",
                          JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S=str(fresh_process.HANG_GUARD_S)))
  assert (results[0]["compiles"], results[0]["job"].get("silent"), results[0]["peer_timeouts"]) == (1, 1, 0)
  assert results[0]["peer_published"] == 1 and results[1]["peer_published"] == 0  # the store keeps the first
  assert results[0]["lowered"] == results[1]["lowered"]


def test_a_living_claimant_that_beats_is_waited_for_past_ten_beats(tmp_path):
  """Rank 1 claims the compile and beats twenty beats' time before compiling it: rank 0 waits for its entry."""
  results = _results(_run(tmp_path, "beating", JAX_MOSAIC_FFI_JOB_SHARE_HEARTBEAT_S="0.2"))
  assert (results[0]["compiles"], results[0]["peer_hits"]) == (0, 1)
  assert results[0]["job"].get("silent", 0) == results[0]["peer_timeouts"] == 0
  assert (results[1]["compiles"], results[1]["peer_published"]) == (1, 1)
  assert results[0]["lowered"] == results[1]["lowered"]


def test_two_ranks_making_six_kernels_ahead_split_them_each_compiled_once(tmp_path):
  """Both ranks make the same six kernels in the same order inside jmf.compile_ahead: each compiles some (a
  compile a peer claimed steps aside for the next), the job compiles each once."""
  results = _results(_run(tmp_path, "spread", JMF_TEST_KERNELS="6", JAX_MOSAIC_FFI_COMPILE_JOBS="2"))
  compiles = [r["compiles"] for r in results]
  assert sum(compiles) == 6 and min(compiles) > 0, compiles
  assert sum(r["peer_hits"] for r in results) == 6 and sum(r["peer_published"] for r in results) == 6
  assert all(r["peer_timeouts"] == r["peer_refused"] == r["peer_unshared"] == 0 for r in results)
  assert results[0]["symbols"] == [f"scaled_{k}" for k in range(6)] and results[0]["lowered"] == results[1]["lowered"]


@pytest.mark.parametrize("how", ["digest", "garbage", "other_key", "large", "length"])
def test_a_forged_or_oversized_store_value_is_refused_and_compiled_here(tmp_path, how):
  results = _results(_run(tmp_path, f"forged-{how}"))
  assert (results[0]["compiles"], results[0]["peer_refused"], results[0]["peer_hits"]) == (1, 1, 0)
  assert results[0]["lowered"] == results[1]["lowered"]


def test_a_peers_entry_of_another_kernel_is_refused_and_compiled_here(tmp_path):
  """The framing's digest needs no secret: rank 1 publishes scaled_1's entry under scaled_0's key. Rank 0 refuses it
  (its module does not define scaled_0), compiles scaled_0 itself and lowers the same call as rank 1."""
  results = _results(_run(tmp_path, "another-kernel"))
  assert (results[0]["compiles"], results[0]["peer_refused"], results[0]["peer_hits"]) == (1, 1, 0)
  assert results[0]["lowered"] == results[1]["lowered"]
  assert results[0]["cached_files"] == 1  # its own compile only


def test_an_entry_over_the_bound_is_compiled_by_each_process_and_counted(tmp_path):
  results = _results(_run(tmp_path, "unshareable"))
  assert [r["compiles"] for r in results] == [1, 1]
  assert [r["peer_unshared"] for r in results] == [1, 1]  # the claimant could not share; rank 0 was told so
  assert results[0]["peer_timeouts"] == results[0]["peer_refused"] == 0


def test_under_the_strict_pack_mode_a_peers_entry_is_a_compile_not_a_pack(tmp_path):
  results = _results(_run(tmp_path, "strict"))
  assert results[0]["error"] is not None and results[0]["error"].startswith("NotInPacks")
  assert results[0]["peer_hits"] == 0


def test_an_autotuned_call_is_timed_by_one_process_and_decided_alike_in_every_one(tmp_path):
  """Timed on the CPU (JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU=1: the real timing path, running the fallbacks), where every
  process is of one model ("cpu"); on GPUs the same path times the kernels (test_job_share_gpu)."""
  results = _results(_run(tmp_path, "tuning", nprocs=3, JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU="1"))
  assert sorted(r["source"] for r in results) == ["peer", "peer", "tuned"]
  assert sum(r["tunings"] for r in results) == 1 and sum(r["autotune_peer_hits"] for r in results) == 2
  assert len({r["winner"] for r in results}) == 1 and len({tuple(r["lowered"]) for r in results}) == 1
  assert sum(r["compiles"] for r in results) == 4  # four configs, one kernel each, one arch: each compiled once
  # A peer's timings and compiles are its own: kept in memory, never on this process's disk as its own.
  assert all(r["cached_files"] == r["compiles"] for r in results if r["source"] == "peer")


def test_a_decision_taken_past_the_bound_gives_way_to_the_one_the_job_published_first(tmp_path):
  results = _results(_run(tmp_path, "tuning-slow", JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU="1",
                          JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S="2"))
  assert results[0]["source"] == "tuned" and results[0]["tunings"] == 1  # gave up waiting, timed, published first
  assert results[1]["source"] == "peer" and results[1]["tunings"] == 1  # timed too, then took rank 0's decision
  assert results[0]["winner"] == results[1]["winner"] and results[0]["lowered"] == results[1]["lowered"]


def test_what_the_job_compiled_becomes_a_pack_that_serves_the_next_job_strictly(tmp_path):
  """One rank records (JAX_MOSAIC_FFI_PACK_RECORD) every entry the program used, its peers' included; `pack build`
  makes the pack; a process with it and the strict mode lowers the same call compiling nothing."""
  seed = int.from_bytes(os.urandom(4), "little")
  record = tmp_path / "record"
  job = _results(_run(tmp_path / "job", "share", seed=seed, JMF_TEST_KERNELS="2", JMF_TEST_RECORD=str(record)))
  assert job[1]["peer_hits"] + job[1]["compiles"] == 2  # what rank 1 recorded: from its peer, or compiled
  pack = tmp_path / "job.jmfpack"
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (fresh_process.TESTS, os.environ.get("PYTHONPATH"))
                                                     if p)}
  built = subprocess.run([sys.executable, "-m", "jax_mosaic_ffi.pack", "build", str(pack), str(record)], env=env,
                         capture_output=True, text=True, timeout=fresh_process.HANG_GUARD_S,
                         cwd=fresh_process.private_folder())
  assert built.returncode == 0, built.stderr[-3000:]
  (served,) = _results(_run(tmp_path / "next", "share", nprocs=1, seed=seed, JMF_TEST_KERNELS="2",
                            JAX_MOSAIC_FFI_PACKS=str(pack), JAX_MOSAIC_FFI_PACKS_STRICT="1"))
  assert served["compiles"] == 0 and served["lowered"] == job[0]["lowered"]


@pytest.mark.gpu
def test_on_a_gpu_the_processes_share_kernels_and_one_times_each_autotuned_call():
  """The real timing path: three processes on GPU 0, the configs timed on its clock by one of them."""
  import tempfile
  with tempfile.TemporaryDirectory() as folder:
    shared = _results(_run(folder, "share-gpu", nprocs=3))
    assert sum(r["compiles"] for r in shared) == 2 and sum(r["peer_hits"] for r in shared) == 4
    tuned = _results(_run(os.path.join(folder, "tuned"), "tuning-gpu", nprocs=3))
  assert sorted(r["source"] for r in tuned) == ["peer", "peer", "tuned"]
  assert sum(r["tunings"] for r in tuned) == 1 and len({r["winner"] for r in tuned}) == 1
  assert len({tuple(r["lowered"]) for r in tuned}) == 1
