"""What the benchmarks ran on: GPUs, driver, library versions.

Asked without starting a JAX backend, so the parent process holds no GPU
memory while its children measure.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess

PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "cuda-bindings", "triton", "torch")


def describe() -> dict:
  info = {"python": platform.python_version(), "host": platform.node(), "packages": {}}
  for package in PACKAGES:
    try:
      info["packages"][package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  info.update(_nvidia_smi())
  info.update(_commit())
  try:
    from jax_mosaic_ffi.cuda.nvrtc import compiler
    from jax_mosaic_ffi.base import gpu_info
    info["nvrtc"] = "%d.%d" % compiler.nvrtc_version()
    gpus = gpu_info.visible_gpus()
    info["gpu_count"] = len(gpus)
    info.setdefault("gpu", gpus[0].name if gpus else "none")
    info["arch"] = f"sm_{gpus[0].arch}" if gpus else None
  except Exception as e:  # a report without these beats no report
    info.setdefault("gpu", f"unknown ({type(e).__name__}: {e})")
  return info


def _nvidia_smi() -> dict:
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return {}
  lines = [line.split(", ") for line in out.stdout.strip().splitlines() if line.count(", ") == 2]
  if out.returncode != 0 or not lines:
    return {}
  name, driver, memory = lines[0]
  return {"gpu": name, "driver": driver, "gpu_memory": memory}


def _commit() -> dict:
  """The source tree's commit, when it is a git checkout; "+" marks local changes."""
  import benchmarks
  try:
    head = subprocess.run(["git", "-C", benchmarks.REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, timeout=10)
    dirty = subprocess.run(["git", "-C", benchmarks.REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.TimeoutExpired):
    return {}
  if head.returncode != 0:
    return {}
  return {"commit": head.stdout.strip() + ("+" if dirty.stdout.strip() else "")}


def summary(info: dict) -> str:
  """One line: GPU(s), driver, versions."""
  packages = info.get("packages", {})
  gpu = info.get("gpu", "unknown GPU")
  count = info.get("gpu_count")
  gpus = f"{count} x {gpu}" if count and count > 1 else gpu
  arch = f", {info['arch']}" if info.get("arch") else ""
  return (f"{gpus}{arch} (driver {info.get('driver', '?')}), jax {packages.get('jax', '?')}, "
          f"jaxlib {packages.get('jaxlib', '?')}, CUDA plugin {packages.get('jax-cuda13-plugin', '?')}, "
          f"NVRTC {info.get('nvrtc', '?')}, Python {info.get('python', '?')}" +
          "".join(f", {label} {packages[name]}" for name, label in (("triton", "Triton"), ("torch", "torch"))
                  if packages.get(name)) +
          (f", source {info['commit']}" if info.get("commit") else ""))


_BUSY = "s = 0\nfor i in range(8_000_000):\n  s += i\n"


def parallel_capacity() -> float:
  """How many CPUs' work this machine gives a run now: the time of two busy processes at once over one's, turned
  into a count (2.0: two CPUs free; 1.0: work side by side gains nothing, the machine is shared that much). Ratios
  of side-by-side compiles are read against it (the machine's other users' load is not ours to stop)."""
  import subprocess
  import sys
  import time

  def timed(n: int) -> float:
    start = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(n)]
    for child in children:
      child.wait()
    return time.perf_counter() - start
  one, two = sorted(timed(1) for _ in range(3))[1], sorted(timed(2) for _ in range(3))[1]
  return 2 * one / two
