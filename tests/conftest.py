import os
import shutil

import pytest

import fresh_process

# Every GPU test's outputs start as 0xFF bytes (NaN / -1), so an element a
# kernel fails to write cannot pass for a right answer left by an earlier run.
os.environ.setdefault("JAX_MOSAIC_FFI_POISON_OUTPUTS", "1")
# Triton's own cache is the session's: one shared with another checkout holds kernels of the same code compiled
# there, whose line info names that checkout's files (keys leave paths out, so that a kernel travels).
if "TRITON_CACHE_DIR" not in os.environ:
  import atexit
  import tempfile
  os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="jmf-tests-triton-cache-")
  atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"], True)
# Tests start subprocesses that use the GPU too: do not let XLA take 75% of it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# A compile's bound (300 s by default) only as a hang guard, in this process and its children: how long a compile
# takes depends on the machine's load, and no outcome may. The tests of the bound set their own.
os.environ.setdefault("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S", str(fresh_process.INNER_GUARD_S))
# Eight host devices, so collective lowering can be checked over real meshes
# without GPUs. Set before jax initialises its backends.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
# nvcc, for the tests that check that the sources NVRTC compiles are ones nvcc takes as well. nvcc needs a host
# compiler, which a user's machine need not have: scripts/without_compiler.sh (CI's run from the wheel) hides it.
NVCC = None if os.environ.get("JMF_WITHOUT_COMPILER") else (
    shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None))
NO_NVCC = "no nvcc with a host compiler to compare with"


def _cuda_devices() -> tuple[int, str | None]:
  """How many CUDA devices jax has, and what it said when it has none."""
  import jax
  try:
    return len(jax.devices("cuda")), None
  except RuntimeError as e:
    return 0, str(e)


def pytest_configure(config):
  # Runs from an installed wheel (CI's second venv, scripts/gpu_check.sh wheel) say where it is installed:
  # the tests must import that copy, never this checkout's package.
  expected = os.environ.get("JMF_EXPECT_INSTALLED_UNDER")
  if expected:
    import jax_mosaic_ffi
    from jax_mosaic_ffi import _core
    for path in (jax_mosaic_ffi.__file__, _core.__file__):
      if not os.path.realpath(path).startswith(os.path.realpath(expected) + os.sep):
        raise pytest.UsageError(f"JMF_EXPECT_INSTALLED_UNDER={expected}, but the tests import {path}")


def pytest_report_header(config):
  import jax
  import jaxlib
  import jax_mosaic_ffi
  from jax_mosaic_ffi.base import gpu_info
  count, error = _cuda_devices()
  reason = gpu_info.gpu_unavailable_reason(count, 1, error)
  # Which jax ran is part of a run's record (scripts/gpu_check.sh can put a carried one first on the path).
  where = (f"jax_mosaic_ffi {jax_mosaic_ffi.__version__} from {os.path.dirname(jax_mosaic_ffi.__file__)}; "
           f"jax {jax.__version__}, jaxlib {jaxlib.__version__} from {os.path.dirname(os.path.dirname(jax.__file__))}")
  if reason is None:
    return [where, f"jax_mosaic_ffi: GPU tests run on {count} CUDA device(s)"]
  loud = "driver is here" in reason
  return [where, f"jax_mosaic_ffi: {'WARNING: ' if loud else ''}GPU tests skip: {reason}"]


def _gpu_skip_reasons() -> dict[int, str | None]:
  """Why tests that need 1 or 2 GPUs skip here (None: they run)."""
  from jax_mosaic_ffi.base import gpu_info
  count, error = _cuda_devices()
  return {needed: gpu_info.gpu_unavailable_reason(count, needed, error) for needed in (1, 2)}


def pytest_collection_modifyitems(config, items):
  reasons = _gpu_skip_reasons()
  for item in items:
    needed = 2 if "multi_gpu" in item.keywords else 1 if "gpu" in item.keywords else 0
    reason = needed and reasons[needed]
    if reason:
      item.add_marker(pytest.mark.skip(reason=reason))


def _skip_reason(report) -> str:
  longrepr = report.longrepr
  return longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, config):
  """The GPU tests skipped for want of a GPU: one line per reason before the result line, not one per test
  (``-v`` lists them); every other skip as ``-ra`` shows it. Outermost (tryfirst), so that pytest's short summary
  runs without them inside, and they are back for its count of skipped tests."""
  _key_fuzz_summary(terminalreporter)
  # Asked again here: under pytest-xdist the workers collected, not this process.
  reasons = {reason for reason in _gpu_skip_reasons().values() if reason}
  skipped = terminalreporter.stats.get("skipped", [])
  gpu = [report for report in skipped if _skip_reason(report) in reasons]
  if not gpu or config.get_verbosity() > 0:
    return (yield)
  terminalreporter.stats["skipped"] = [report for report in skipped if _skip_reason(report) not in reasons]
  try:
    return (yield)
  finally:
    terminalreporter.stats["skipped"] = skipped
    for reason in sorted({_skip_reason(report) for report in gpu}):
      count = sum(_skip_reason(report) == reason for report in gpu)
      terminalreporter.write_line(f"SKIPPED [{count}] GPU tests (markers gpu, multi_gpu): {reason}", yellow=True)


@pytest.fixture
def rng(request):
  import numpy as np
  # Fresh inputs on every run; the seed is printed on failure to replay it.
  seed = int.from_bytes(os.urandom(4), "little")
  request.node.user_properties.append(("seed", seed))
  print(f"random seed: {seed}")
  return np.random.default_rng(seed)


# The compile keys' proof (jax_mosaic_ffi/store/key_audit.py): in the front ends' and the caches' tests every
# cache hit, in memory and on disk, is also checked against the compiler's IR (and the processes they start inherit
# it). JAX_MOSAIC_FFI_KEY_AUDIT=0 in the environment runs them without.
_AUDITED = ("test_triton", "test_gluon", "test_cute", "test_disk_cache", "test_caching", "test_compile",
            "test_value_keys", "test_key_", "test_fa4", "test_quack", "test_autotune", "test_tuning", "test_nvrtc",
            "test_kernel_formats", "test_export")


@pytest.fixture(autouse=True)
def _key_audit(request, monkeypatch):
  if request.node.path.name.startswith(_AUDITED) and "JAX_MOSAIC_FFI_KEY_AUDIT" not in os.environ:
    monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "1")


@pytest.fixture
def isolated_disk_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path / "kernel-cache"))
  import jax_mosaic_ffi as jmf
  jmf.clear_kernel_cache()
  return tmp_path / "kernel-cache"


def _key_fuzz_summary(terminalreporter):
  """What the edit fuzzer tried (tests/test_key_fuzz.py): one line per edit and cache, whatever the outcome."""
  import json
  rows = [row for key in ("passed", "failed") for report in terminalreporter.stats.get(key, [])
          if report.when == "call" for name, value in report.user_properties if name == "key_fuzz"
          for row in json.loads(value)]
  if not rows:
    return
  terminalreporter.section("key fuzzer: edits tried, with the key audit on")
  terminalreporter.write_line(f"{'front end':<9} {'cache':<6} {'kind':<18} {'key':<15} {'kernel':<8} edit")
  for r in rows:
    verdict = f"  PROBLEM: {'; '.join(r['problems'])}" if r["problems"] else ""
    terminalreporter.write_line(f"{r['wing']:<9} {r['where']:<6} {r['kind']:<18} {r['key']:<15} {r['kernel']:<8} "
                                f"{r['edit']}{verdict}")
  changed = sum(r["kernel"] == "changed" for r in rows)
  terminalreporter.write_line(f"{len(rows)} edits: {changed} changed the kernel and its key; "
                              f"{sum(bool(r['problems']) for r in rows)} problems")
