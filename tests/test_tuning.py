"""Timings kept per config, and tuning files (`jmf.save_tuning` / `jmf.load_tuning`).

On the CPU the records are real: the configs' jax.numpy fallbacks are timed
(JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU=1), so the storage layer, the file and its
refusals are checked on what autotuning itself produces. The GPU versions,
on real kernels, are in test_autotune.py.
"""

import importlib.metadata
import json
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.transforms import autotune as autotuning
from jax_mosaic_ffi.transforms import tuning_files
from jax_mosaic_ffi.store import tuning_records

from test_autotune import add_factory

no_gpu = pytest.mark.skipif(gpu_info.has_gpu(), reason="times jax.numpy fallbacks on the CPU")
X = jax.ShapeDtypeStruct((1000,), jnp.float32)
THREE = [{"block": 128, "work": 6}, {"block": 256, "work": 3}, {"block": 512, "work": 0}]


@pytest.fixture
def cpu_timing(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  return isolated_disk_cache


def timed_configs():
  return autotuning.stats().configs_timed


@no_gpu
def test_adding_or_editing_a_config_times_only_that_config(cpu_timing):
  before = timed_configs()
  first = jmf.autotune(add_factory, configs=THREE[:2], name="test-grow")
  assert first.best_config(X, X) == THREE[1]
  assert first.last_report["timed"] == [0, 1] and timed_configs() == before + 2
  grown = jmf.autotune(add_factory, configs=THREE, name="test-grow")
  assert grown.best_config(X, X) == THREE[2]  # the new config wins among the stored timings and its own
  assert grown.last_report["timed"] == [2] and timed_configs() == before + 3
  assert grown.last_report["table"][0]["us"] == first.last_report["table"][0]["us"]
  # An edited config (another value) is a new timing; the others are kept.
  edited = jmf.autotune(add_factory, configs=[THREE[0], {"block": 256, "work": 2}, THREE[2]], name="test-grow")
  edited.best_config(X, X)
  assert edited.last_report["timed"] == [1] and timed_configs() == before + 4
  # A fresh process (memory cleared) finds all three on disk and times nothing.
  jmf.clear_kernel_cache()
  again = jmf.autotune(add_factory, configs=THREE, name="test-grow")
  assert again.best_config(X, X) == THREE[2]
  assert again.last_report["source"] == "disk" and again.last_report["timed"] == []
  assert timed_configs() == before + 4


def tune_and_save(path):
  tuned = jmf.autotune(add_factory, configs=THREE, name="test-file")
  tuned.best_config(X, X)
  assert tuned.last_report["source"] == "tuned"
  return jmf.save_tuning(path), tuned.last_report


def fresh_machine(monkeypatch, tmp_path):
  """What another machine of the same kind has: an empty disk cache and nothing in memory."""
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", tempfile.mkdtemp(dir=tmp_path, prefix="other-machine-"))
  jmf.clear_kernel_cache()


@no_gpu
def test_a_saved_file_round_trips_and_its_winner_is_used_without_timing(cpu_timing, monkeypatch, tmp_path):
  path = tmp_path / "tuning.json"
  saved, report = tune_and_save(path)
  assert saved == 3
  document = json.loads(path.read_text())
  assert document["format"] == "jax_mosaic_ffi tuning" and document["version"] == 2
  assert document["environment"]["device"] == jax.devices()[0].device_kind
  # Each front end's toolchain and its release, whether installed or not ("none"), sorted by name.
  toolchains = document["environment"]["toolchains"]
  assert re.fullmatch(r"cuda-tile \S+, nvidia-cuda-tileiras \S+, nvidia-cutlass-dsl \S+, triton \S+",
                      toolchains), toolchains
  try:
    triton = importlib.metadata.version("triton")
  except importlib.metadata.PackageNotFoundError:
    triton = "none"
  assert toolchains.endswith(f", triton {triton}"), toolchains
  assert sorted(json.loads(row["config"])["work"] for row in document["timings"]) == [0, 3, 6]
  fresh_machine(monkeypatch, tmp_path)
  before = timed_configs()
  assert jmf.load_tuning(path) == 3
  loaded = jmf.autotune(add_factory, configs=THREE, name="test-file")
  assert loaded.best_config(X, X) == THREE[report["winner"]]
  assert loaded.last_report["source"] == "file" and loaded.last_report["timed"] == []
  assert [row["us"] for row in loaded.last_report["table"]] == [row["us"] for row in report["table"]]
  assert timed_configs() == before
  # Saving what was loaded gives the same timings back.
  assert jmf.save_tuning(tmp_path / "again.json") == 3
  assert json.loads((tmp_path / "again.json").read_text())["timings"] == document["timings"]


def edited(document, change):
  change(document)
  return json.dumps(document)


ENV_MISMATCHES = [
    ("device", "NVIDIA H100 80GB HBM3", "device"),
    ("compute_capability", "8.0", "compute capability"),
    ("driver", "cuda-driver 12040", "CUDA driver"),
    ("jax_mosaic_ffi", "0.0.1", "jax_mosaic_ffi"),
    ("toolchains", "nvidia-cutlass-dsl none, triton 2.0.0", "toolchains"),
]


def set_row(field, value):
  def change(document):
    document["timings"][0][field] = value
  return change


MALFORMED = [
    (lambda d: d.update(format="something else"),
     'it is not a jax_mosaic_ffi tuning file (no "format": "jax_mosaic_ffi tuning")'),
    (lambda d: d.update(version=1), "it has format version 1; this jax_mosaic_ffi reads version 2"),
    (lambda d: d.update(version=3), "it has format version 3; this jax_mosaic_ffi reads version 2"),
    (lambda d: d.update(version=True), "it has format version True; this jax_mosaic_ffi reads version 2"),
    (lambda d: d.update(environment=[]), "environment is not an object"),
    (lambda d: d["environment"].pop("driver"), "environment.driver is not a string"),
    (lambda d: d.update(timings={}), "timings is not a list"),
    (lambda d: d["timings"].append(7), "timings[3] is not an object"),
    (set_row("us", -1.0), "timings[0].us is not null or a number of microseconds in (0, 1e+09]"),
    (set_row("us", "fast"), "timings[0].us is not null or a number of microseconds in (0, 1e+09]"),
    (set_row("us", True), "timings[0].us is not null or a number of microseconds in (0, 1e+09]"),
    (set_row("us", float("nan")), "timings[0].us is not null or a number of microseconds in (0, 1e+09]"),
    (set_row("us", 1e300), "timings[0].us is not null or a number of microseconds in (0, 1e+09]"),
    (set_row("us", None), "timings[0] needs exactly one of us and error"),
    (set_row("error", "launch: boom"), "timings[0] needs exactly one of us and error"),
    (set_row("name", 3), "timings[0].name is not a string"),
    (set_row("config", "x" * 5000), "timings[0].config is longer than 4096 characters"),
    (set_row("launches", "abc"), "timings[0].launches is not a list of at most 64 strings"),
    (set_row("launches", ["k"] * 65), "timings[0].launches is not a list of at most 64 strings"),
    (set_row("launches", [None]), "timings[0].launches[0] is not a string"),
    (set_row("signature", {"a": 1}), "timings[0].signature is not a string"),
]


def check_ignored(path, reason, tmp_path, monkeypatch):
  fresh_machine(monkeypatch, tmp_path)
  with pytest.warns(jmf.TuningFileIgnored) as caught:
    assert jmf.load_tuning(path) == 0
  assert [str(w.message) for w in caught] == [
      f"jax_mosaic_ffi.load_tuning: {path} is ignored: {reason}; nothing was loaded"]
  assert caught[0].filename == __file__  # the warning names the user's line
  # Nothing was loaded: the configs are timed again.
  again = jmf.autotune(add_factory, configs=THREE, name="test-file")
  again.best_config(X, X)
  assert again.last_report["timed"] == [0, 1, 2]


@no_gpu
@pytest.mark.parametrize("field,theirs,label", ENV_MISMATCHES, ids=[m[0] for m in ENV_MISMATCHES])
def test_a_file_from_another_machine_or_version_is_ignored(cpu_timing, monkeypatch, tmp_path, field, theirs, label):
  path = tmp_path / "tuning.json"
  tune_and_save(path)
  document = json.loads(path.read_text())
  ours = document["environment"][field]
  path.write_text(edited(document, lambda d: d["environment"].update({field: theirs})))
  check_ignored(path, f"it was tuned with {label} {theirs!r}, and this process has {ours!r}", tmp_path, monkeypatch)


@no_gpu
@pytest.mark.parametrize("change,reason", MALFORMED, ids=[str(k) for k in range(len(MALFORMED))])
def test_a_malformed_file_is_ignored_saying_what_is_wrong(cpu_timing, monkeypatch, tmp_path, change, reason):
  path = tmp_path / "tuning.json"
  tune_and_save(path)
  path.write_text(edited(json.loads(path.read_text()), change))
  check_ignored(path, reason, tmp_path, monkeypatch)


@no_gpu
def test_a_file_that_is_not_ours_or_not_json_is_ignored(cpu_timing, monkeypatch, tmp_path):
  path = tmp_path / "tuning.json"
  tune_and_save(path)
  good = path.read_text()
  check_ignored(tmp_path / "missing.json", "it cannot be opened (No such file or directory)", tmp_path, monkeypatch)
  check_ignored(tmp_path, "it is not a regular file", tmp_path, monkeypatch)
  os.chmod(path, 0o664)
  check_ignored(path, "others can write to it (mode 664); run chmod go-w on it", tmp_path, monkeypatch)
  os.chmod(path, 0o644)
  if os.geteuid() == 0:
    os.chown(path, 12345, 12345)
    check_ignored(path, "it belongs to uid 12345, not to you (uid 0) or root", tmp_path, monkeypatch)
    os.chown(path, 0, 0)
  path.write_text("{" + good)
  check_ignored(path, "it is not JSON (JSONDecodeError)", tmp_path, monkeypatch)
  path.write_text("[" * 100000 + "]" * 100000)
  check_ignored(path, "it is not JSON (RecursionError)", tmp_path, monkeypatch)
  monkeypatch.setattr(tuning_files, "MAX_FILE_BYTES", 100)
  path.write_text(good)
  check_ignored(path, f"it holds {len(good.encode())} bytes, over the limit of 100", tmp_path, monkeypatch)
  monkeypatch.undo()  # the real bound, and the cache folder of the fixture, back
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  fresh_machine(monkeypatch, tmp_path)
  assert jmf.load_tuning(path) == 3  # the same file, unchanged, loads


def test_a_timing_entry_on_disk_is_bounded_and_checked():
  decode = tuning_records._decode_entry
  assert decode(b'{"format": "tuning-record-1", "us": 12.5, "error": null}') == tuning_records.Timing(12.5, None)
  for bad in (b'{"format": "tuning-record-1", "us": -3, "error": null}', b'{"format": "x", "us": 1, "error": null}',
              b'[]', b'{"format": "tuning-record-1", "us": 1, "error": "' + b"e" * 9000 + b'"}'):
    with pytest.raises(ValueError):
      decode(bad)


# --- failures: only those that will repeat are kept ------------------------------------------------------------

def flaky_factory(meta):
  """add_factory's call, whose fallback fails at its first run while the file `meta["fails_once"]` does not exist
  yet (then makes it): a failure that will not repeat, as an out-of-memory or a busy GPU is."""
  marker = meta.get("fails_once")
  call = add_factory({"block": meta["block"], "work": meta["work"]})
  if marker is None:
    return call

  def check(x):
    if not os.path.exists(marker):
      open(marker, "w").close()
      raise RuntimeError("one-off failure (out of memory)")
    return x

  def flaky(x, y):
    return jax.pure_callback(check, jax.ShapeDtypeStruct(x.shape, x.dtype), call(x, y))
  return flaky


# The last is the fastest by far, even with a host callback around it.
SLOW_AND_FAST = [{"block": 128, "work": 300}, {"block": 256, "work": 200}, {"block": 512, "work": 0}]


def fails_once(tmp_path, configs, which):
  return [dict(c, fails_once=str(tmp_path / f"failed-{k}")) if k in which else c for k, c in enumerate(configs)]


@no_gpu
def test_a_config_that_failed_once_is_timed_again_and_can_win(cpu_timing, tmp_path):
  configs = fails_once(tmp_path, SLOW_AND_FAST, {2})  # the fastest config fails at its first launch
  first = jmf.autotune(flaky_factory, configs=configs, name="test-flaky")
  assert first.best_config(X, X) != configs[2]
  assert first.last_report["table"][2]["error"].startswith("launch: "), first.last_report["table"]
  jmf.clear_kernel_cache()  # as in a new process: only what is on disk
  again = jmf.autotune(flaky_factory, configs=configs, name="test-flaky")
  assert again.best_config(X, X) == configs[2], again.last_report["table"]
  assert again.last_report["timed"] == [2] and again.last_report["source"] == "tuned"


@no_gpu
def test_when_every_config_failed_once_the_next_process_tunes_again(cpu_timing, tmp_path):
  configs = fails_once(tmp_path, SLOW_AND_FAST, {0, 1, 2})
  with pytest.raises(jmf.AutotuneError, match="no config could be compiled and run"):
    jmf.autotune(flaky_factory, configs=configs, name="test-all-flaky").best_config(X, X)
  jmf.clear_kernel_cache()
  again = jmf.autotune(flaky_factory, configs=configs, name="test-all-flaky")
  assert again.best_config(X, X) == configs[2]
  assert again.last_report["timed"] == [0, 1, 2]


@no_gpu
@pytest.mark.parametrize("error", ["compile: CompileError: boom", "launch: XlaRuntimeError: out of memory"])
def test_a_tuning_file_listing_every_config_as_failed_does_not_wedge_later_processes(cpu_timing, monkeypatch,
                                                                                     tmp_path, error):
  path = tmp_path / "tuning.json"
  tune_and_save(path)

  def all_failed(document):
    for row in document["timings"]:
      row.update(us=None, error=error)
  path.write_text(edited(json.loads(path.read_text()), all_failed))
  fresh_machine(monkeypatch, tmp_path)
  assert jmf.load_tuning(path) == 3
  loaded = jmf.autotune(add_factory, configs=THREE, name="test-file")
  assert loaded.best_config(X, X) == THREE[2]  # timed again, not AutotuneError
  assert loaded.last_report["timed"] == [0, 1, 2] and loaded.last_report["source"] == "tuned"


@no_gpu
def test_a_failure_that_will_repeat_is_kept_while_other_configs_are_timed(cpu_timing, monkeypatch, tmp_path):
  path = tmp_path / "tuning.json"
  tune_and_save(path)
  lasting = "resources: XlaRuntimeError: INVALID_ARGUMENT: ... lower smem_bytes"
  path.write_text(edited(json.loads(path.read_text()),
                         lambda d: next(r for r in d["timings"] if json.loads(r["config"])["work"] == 0).update(
                             us=None, error=lasting)))
  fresh_machine(monkeypatch, tmp_path)
  assert jmf.load_tuning(path) == 3
  loaded = jmf.autotune(add_factory, configs=THREE, name="test-file")
  assert loaded.best_config(X, X) == THREE[1]  # the one that asks for too much is not tried again
  assert loaded.last_report["timed"] == [] and loaded.last_report["table"][2]["error"] == lasting
  # A one-off failure in the same place is timed again.
  path.write_text(path.read_text().replace(lasting, "launch: XlaRuntimeError: out of memory"))
  fresh_machine(monkeypatch, tmp_path)
  assert jmf.load_tuning(path) == 3
  again = jmf.autotune(add_factory, configs=THREE, name="test-file")
  assert again.best_config(X, X) == THREE[2] and again.last_report["timed"] == [2]


def test_the_runtime_still_says_what_the_resource_markers_look_for():
  # Resource failures are told from their text: each runtime marker must still be in the runtime's messages.
  from jax_mosaic_ffi.store import tuning_failures
  csrc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", "runtime")
  if not os.path.isdir(csrc):
    pytest.skip("runs from a source checkout (csrc/)")
  text = "".join(open(os.path.join(csrc, name)).read() for name in os.listdir(csrc) if name.endswith(".cc"))
  for marker in tuning_failures.RESOURCE_MARKERS:
    assert marker in text or marker.startswith("CUDA_ERROR_"), marker
  assert tuning_failures.launch_failure("launch failed: CUDA_ERROR_OUT_OF_RESOURCES (too many resources)") == \
      "resources"
  assert tuning_failures.launch_failure("RESOURCE_EXHAUSTED: Out of memory while trying to allocate") == "launch"
  assert tuning_failures.compile_failure("RESOURCE_EXHAUSTED: out of memory") == "compile (out of memory)"
