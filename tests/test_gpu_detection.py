"""Where GPU tests run, and why they skip when they do: told apart by what the machine has."""

import os
import subprocess
import sys

import pytest

from jax_mosaic_ffi.base import driver_probe
from jax_mosaic_ffi.base import gpu_info

import fresh_process

CONFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
no = lambda: False  # noqa: E731
yes = lambda: True  # noqa: E731


def test_each_sign_of_a_driver_counts_alone(tmp_path):
  absent = str(tmp_path / "absent")
  assert driver_probe.evidence(proc_version=absent, load_libcuda=no, nvidia_smi=no) == []
  present = tmp_path / "version"
  present.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159\n")
  assert driver_probe.evidence(proc_version=str(present), load_libcuda=no, nvidia_smi=no) == [f"{present} exists"]
  assert driver_probe.evidence(proc_version=absent, load_libcuda=yes, nvidia_smi=no) == ["libcuda.so.1 loads"]
  assert driver_probe.evidence(proc_version=absent, load_libcuda=no, nvidia_smi=yes) == ["nvidia-smi lists a GPU"]


def test_nvidia_smi_counts_only_when_it_lists_a_gpu(tmp_path):
  for output, code, expected in [("GPU 0: NVIDIA H200 (UUID: GPU-1)", 0, True), ("", 0, False),
                                 ("NVIDIA-SMI has failed", 9, False)]:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{output}'\nexit {code}\n")
    smi.chmod(0o755)
    assert driver_probe._nvidia_smi_lists_a_gpu(which=lambda _: str(smi)) is expected
  assert driver_probe._nvidia_smi_lists_a_gpu(which=lambda _: None) is False


def test_the_script_setup_env_runs_answers_with_its_exit_code():
  probe = driver_probe.__file__
  # A bare interpreter with nothing installed: the standard library only.
  finished = subprocess.run([sys.executable, "-I", probe], capture_output=True, text=True,
                            timeout=fresh_process.HANG_GUARD_S)
  assert finished.returncode == (0 if driver_probe.evidence() else 1), finished
  assert finished.stdout.strip()


def test_skip_reasons_say_what_is_missing():
  reason = lambda *a, signs=(): gpu_info.gpu_unavailable_reason(*a, driver_evidence=lambda: list(signs))  # noqa: E731
  assert reason(1, 1) is None and reason(2, 2) is None
  assert reason(1, 2) == "needs 2 GPUs, found 1"
  assert reason(0, 1).startswith("no NVIDIA driver on this machine")
  assert reason(0, 2).startswith("no NVIDIA driver on this machine")
  with_driver = reason(0, 1, "Unknown backend: 'cuda' requested, but no platforms that are instances of cuda are "
                             "present.\nmore", signs=["libcuda.so.1 loads"])
  assert with_driver.startswith("an NVIDIA driver is here (libcuda.so.1 loads) but jax has no CUDA backend")
  assert "jax_mosaic_ffi[cuda]" in with_driver and "scripts/test.sh" in with_driver
  assert with_driver.endswith("jax said: Unknown backend: 'cuda' requested, but no platforms that are instances "
                              "of cuda are present.")


def test_this_machine_gets_the_reason_that_fits_it():
  import conftest
  count, error = conftest._cuda_devices()
  reason = gpu_info.gpu_unavailable_reason(count, 1, error)
  if count:
    assert reason is None
  elif driver_probe.evidence():
    assert "but jax has no CUDA backend" in reason
  else:
    assert reason.startswith("no NVIDIA driver") and not os.path.exists(driver_probe.PROC_VERSION)


SAMPLE_TESTS = '''
import pytest

@pytest.mark.gpu
def test_one(): pass

@pytest.mark.gpu
def test_two(): pass

@pytest.mark.multi_gpu
def test_three(): pass

def test_another_skip(): pytest.skip("another reason")

def test_runs(): pass
'''


@pytest.mark.skipif(gpu_info.has_gpu(), reason="checks the summary where the GPU tests skip")
@pytest.mark.parametrize("args", [[], ["-v"], ["-n", "2"]], ids=["quiet", "verbose", "xdist"])
def test_the_gpu_tests_skipped_are_one_summary_line_and_other_skips_stay_as_they_are(tmp_path, args):
  if "-n" in args:
    pytest.importorskip("xdist")
  verbose = "-v" in args
  # The suite's conftest, around tests of each kind: with -ra as pyproject.toml sets it.
  (tmp_path / "conftest.py").write_text(f"exec(compile(open({CONFTEST!r}).read(), {CONFTEST!r}, 'exec'))\n")
  (tmp_path / "test_sample.py").write_text(SAMPLE_TESTS)
  result = subprocess.run([sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "-W", "ignore",
                           *args, "test_sample.py"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=fresh_process.HANG_GUARD_S,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(CONFTEST)})
  lines = result.stdout.splitlines()
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  reason = gpu_info.gpu_unavailable_reason(0)
  gpu_lines = [line for line in lines if reason in line and line.startswith("SKIPPED")]
  assert lines[-1].startswith("=") and "1 passed, 4 skipped" in lines[-1], lines[-1]
  assert any(line.startswith("SKIPPED [1] test_sample.py:13: another reason") for line in lines), result.stdout
  if verbose:  # each test, as -ra shows a skip
    assert len(gpu_lines) == 3 and all("test_sample.py:" in line for line in gpu_lines), gpu_lines
  else:  # one line, right before the result line
    assert gpu_lines == [f"SKIPPED [3] GPU tests (markers gpu, multi_gpu): {reason}"] == [lines[-2]], lines[-6:]
