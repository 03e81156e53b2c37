"""What a process of a job reads from the key-value store, checked in one process: a compile's value
(store/job_share.py) and an autotuning decision (store/tuning_share.py), each bounded and bound to its key
before use; the settings. The processes themselves are tests/test_job_share.py's."""

import json
import os

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.store import job_share
from jax_mosaic_ffi.store import tuning_share

KEY, OTHER = "ab" * 32, "cd" * 32


def test_a_value_reads_back_only_for_its_own_key_whole_and_bounded():
  payload = os.urandom(1000)
  value = job_share.encoded(KEY, payload)
  assert job_share.decoded(KEY, value) == (True, payload)
  assert job_share.decoded(KEY, job_share.encoded(KEY, None)) == (True, None)  # the claimant could not share it
  refused = [value[:-1], value + b"x", value[:-1] + bytes([value[-1] ^ 1]), b"JMFJOB2\0" + value[8:],
             value[:8] + b"\x07" + value[9:], value[:9] + (2 ** 31).to_bytes(4, "little") + value[13:], b"",
             value[:20], "text", None, job_share.encoded(KEY, b"x" * (job_share.MAX_PAYLOAD_BYTES + 1))]
  assert job_share.decoded(OTHER, value) == (False, None)
  for bad in refused:
    assert job_share.decoded(KEY, bad) == (False, None), bad[:16] if isinstance(bad, bytes) else bad


def test_outside_a_job_every_item_is_this_processs_own(monkeypatch):
  monkeypatch.delenv(job_share.ENV, raising=False)
  turn = job_share.turn("compile", KEY)
  assert turn.payload is None and not turn.shared
  turn.publish(b"x")  # nothing to publish to: a no-op
  assert job_share.process_rank() == (0, 1) and tuning_share.rotation(5) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("name,value", [(job_share.ENV, "maybe"), (job_share.WAIT_ENV, "0"),
                                        (job_share.WAIT_ENV, "inf"), (job_share.WAIT_ENV, "soon")])
def test_a_setting_that_means_nothing_is_an_error_at_the_first_compile(isolated_disk_cache, monkeypatch, name, value):
  monkeypatch.setenv(name, value)
  source = 'extern "C" __global__ void k_%s(float* y) { y[0] = 1.0f; }' % os.urandom(4).hex()
  with pytest.raises(ValueError, match=name):
    jmf.cuda_kernel(source, source.split()[4].split("(")[0])


CONFIGS = ['{"block": 64}', '{"block": 128}', '{"block": 256}']


def _decision(**changes) -> bytes:
  decision = {"format": "job-tuning-1", "winner": 0,
              "table": [{"config": c, "us": 10.0 + k, "error": None} for k, c in enumerate(CONFIGS)]}
  decision.update(changes)
  return json.dumps(decision).encode()


def test_a_peers_decision_whose_winner_is_not_its_tables_fastest_is_refused():
  """Winner 2 of [10, 20, 30] us decoded before: a peer could steer the job to its slowest config."""
  table = [{"config": c, "us": us, "error": None} for c, us in zip(CONFIGS, (10.0, 20.0, 30.0))]
  assert tuning_share._decoded(_decision(winner=2, table=table), CONFIGS) is None
  assert tuning_share._decoded(_decision(winner=0, table=table), CONFIGS) == (0, table)
  tied = [{**row, "us": 10.0} for row in table]  # a tie: any of the fastest is one
  assert tuning_share._decoded(_decision(winner=1, table=tied), CONFIGS) == (1, tied)


def test_a_peers_decision_is_taken_only_over_this_calls_configs_with_bounded_timings():
  assert tuning_share._decoded(_decision(), CONFIGS) == (0, [{"config": c, "us": 10.0 + k, "error": None}
                                                             for k, c in enumerate(CONFIGS)])
  row = {"config": CONFIGS[1], "us": None, "error": "compile: out of resources"}
  forged = [
      _decision(winner=3), _decision(winner=-1), _decision(winner=True), _decision(winner="1"),
      _decision(format="job-tuning-0"), _decision(extra=1),
      _decision(table=[{"config": c, "us": 1.0, "error": None} for c in reversed(CONFIGS)]),  # another list
      _decision(table=[{"config": c, "us": 1.0, "error": None} for c in CONFIGS[:2]]),
      _decision(table=[{"config": c, "us": -1.0, "error": None} for c in CONFIGS]),
      _decision(table=[{"config": c, "us": float("nan"), "error": None} for c in CONFIGS]),
      _decision(table=[{"config": c, "us": 1.0, "error": "x" * 5000} for c in CONFIGS]),
      _decision(winner=1, table=[{"config": CONFIGS[0], "us": 1.0, "error": None}, row,
                                 {"config": CONFIGS[2], "us": 1.0, "error": None}]),  # the winner did not run
      _decision(winner=1), _decision(winner=2),  # a winner that is not the fastest of its own table
      b"[" * 100_000, b"\xff", b"null",
  ]
  for bad in forged:
    assert tuning_share._decoded(bad, CONFIGS) is None, bad[:120]
