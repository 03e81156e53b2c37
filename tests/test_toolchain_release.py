"""NVRTC, nvJitLink and the driver checked together at the first compile (cuda/nvrtc/release.py): releases that
cannot work together are named, with their packages and the command that fixes them. The check is fed this
machine's real versions and pairs made from them; the slow test installs NVRTC 13.5 beside nvJitLink 13.0 in a venv
of its own and compiles for real, the issue's case."""

import dataclasses
import os
import pathlib
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from jax_mosaic_ffi.cuda.nvrtc import release

import fresh_process


def test_the_installed_toolchain_works_together():
  installed = release.Toolchain.installed()
  assert installed.nvjitlink is not None and installed.nvrtc[0] >= 12
  assert installed.packages.get("nvidia-cuda-nvrtc", "").startswith(".".join(map(str, installed.nvrtc)))
  assert release.problems(installed) == []
  # What this package requires of both, as its metadata says: the command a mismatch names installs it.
  pins = release.required()
  assert pins["nvidia-cuda-nvrtc"] == pins["nvidia-nvjitlink"] and pins["nvidia-cuda-nvrtc"].startswith("==")


def test_an_nvrtc_newer_than_nvjitlink_is_named_with_its_packages_and_the_fix():
  installed = release.Toolchain.installed()
  newer = (installed.nvjitlink[0], installed.nvjitlink[1] + 5)
  mismatched = dataclasses.replace(installed, nvrtc=newer,
                                   packages={**installed.packages, "nvidia-cuda-nvrtc": f"{newer[0]}.{newer[1]}.37"})
  (problem,) = release.problems(mismatched)
  pins = release.required()
  linker = f"{installed.nvjitlink[0]}.{installed.nvjitlink[1]}"
  assert problem.startswith(f"NVRTC {newer[0]}.{newer[1]} (nvidia-cuda-nvrtc {newer[0]}.{newer[1]}.37) is newer "
                            f"than nvJitLink {linker} (nvidia-nvjitlink {installed.packages['nvidia-nvjitlink']})")
  assert "Unsupported .version" in problem
  assert (f"pip install 'nvidia-cuda-nvrtc{pins['nvidia-cuda-nvrtc']}' 'nvidia-nvjitlink{pins['nvidia-nvjitlink']}'"
          in problem)
  # The other way round works: nvJitLink reads the PTX of older releases.
  assert release.problems(dataclasses.replace(installed, nvjitlink=newer)) == []


def test_a_driver_older_than_the_toolchain_is_named():
  installed = release.Toolchain.installed()
  old_driver = dataclasses.replace(installed, driver=(installed.nvrtc[0] - 1) * 1000 + 80)
  (problem,) = release.problems(old_driver)
  assert problem.startswith(f"the NVIDIA driver supports CUDA {installed.nvrtc[0] - 1}.8, older than the CUDA "
                            f"{installed.nvrtc[0]} of NVRTC"), problem
  assert "Install a driver for CUDA" in problem
  assert release.problems(dataclasses.replace(installed, driver=installed.nvrtc[0] * 1000)) == []


@pytest.mark.slow
def test_nvrtc_13_5_beside_nvjitlink_13_0_fails_naming_both_and_the_fix(tmp_path):
  """The issue's case, for real: a venv whose own site-packages hold NVRTC 13.5 and nvJitLink 13.0, over this one's
  (for jax and this package). Skips where pip cannot get NVRTC 13.5."""
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=fresh_process.HANG_GUARD_S)
  python = venv / "bin" / "python"
  site = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
  got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                        "--target", str(site), "nvidia-cuda-nvrtc==13.5.*", "nvidia-nvjitlink==13.0.*"],
                       capture_output=True, text=True, timeout=fresh_process.HANG_GUARD_S)
  if got.returncode != 0:
    pytest.skip(f"pip could not install nvidia-cuda-nvrtc 13.5 here: {got.stderr.strip()[-300:]}")
  (site / "zz_outer.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
  script = textwrap.dedent("""
      import json, warnings
      import jax_mosaic_ffi as jmf
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
          jmf.cuda_kernel('extern "C" __global__ void f(float* y) { y[0] = 1.0f; }', "f", targets=["sm_90"])
          error = None
        except jmf.CompileError as e:
          error = str(e)
      print(json.dumps({"error": error, "warnings": [str(w.message) for w in caught
                                                     if issubclass(w.category, RuntimeWarning)]}))
  """)
  ran = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "JAX_MOSAIC_FFI_CACHE_DIR": "off"}, timeout=fresh_process.HANG_GUARD_S)
  result = fresh_process.Finished(ran.returncode, ran.stdout, ran.stderr).result
  named = ("NVRTC 13.5 (nvidia-cuda-nvrtc 13.5.", ") is newer than nvJitLink 13.0 (nvidia-nvjitlink 13.0.",
           "pip install 'nvidia-cuda-nvrtc==13.0.*' 'nvidia-nvjitlink==13.0.*'")
  assert "Unsupported .version 9.5" in result["error"], result
  assert all(part in result["error"].split("advice: ", 1)[1] for part in named), result
  assert any(all(part in w for part in named) for w in result["warnings"]), result
