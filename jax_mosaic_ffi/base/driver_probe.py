"""Is there an NVIDIA driver on this machine? Standard library only.

scripts/setup_env.sh runs this file with a bare interpreter, before anything
is installed, to decide whether the venv needs jax's CUDA plugin; the test
suite asks it why a GPU test cannot run. Three independent signs, since each
one alone can mislead: a container may carry libcuda.so.1 without a kernel
module, or a kernel module without nvidia-smi on PATH.

    python jax_mosaic_ffi/base/driver_probe.py  # exit 0 with the evidence when a driver is here, 1 otherwise
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

PROC_VERSION = "/proc/driver/nvidia/version"


def _loads_libcuda() -> bool:
  try:
    ctypes.CDLL("libcuda.so.1")
    return True
  except OSError:
    return False


def _nvidia_smi_lists_a_gpu(which=shutil.which) -> bool:
  smi = which("nvidia-smi")
  if smi is None:
    return False
  try:
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
  except (OSError, subprocess.SubprocessError):
    return False
  return listed.returncode == 0 and "GPU" in listed.stdout


def evidence(*, proc_version: str = PROC_VERSION, load_libcuda=_loads_libcuda,
             nvidia_smi=_nvidia_smi_lists_a_gpu) -> list[str]:
  """The signs of an NVIDIA driver found here; empty when there is none."""
  found = []
  if load_libcuda():
    found.append("libcuda.so.1 loads")
  if os.path.exists(proc_version):
    found.append(f"{proc_version} exists")
  if nvidia_smi():
    found.append("nvidia-smi lists a GPU")
  return found


if __name__ == "__main__":
  signs = evidence()
  print("; ".join(signs) if signs else "no NVIDIA driver (no libcuda.so.1, no /proc/driver/nvidia, no nvidia-smi)")
  sys.exit(0 if signs else 1)
