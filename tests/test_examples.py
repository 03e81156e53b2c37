"""The README's demo runs: on the CPU it compiles and lowers, on a GPU it also runs."""

import os
import subprocess
import sys

import conftest


def test_demo_runs(tmp_path):
  env = dict(os.environ, JAX_MOSAIC_FFI_CACHE_DIR=str(tmp_path / "cache"))
  result = subprocess.run([sys.executable, os.path.join(conftest.EXAMPLES, "demo.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "lowered for CUDA" in result.stdout
  assert "matches numpy" in result.stdout or "did not run the kernel" in result.stdout
