"""No file of jax_mosaic_ffi/ or csrc/ over 400 lines: scripts/check_file_sizes.py, which scripts/lint.sh runs."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "check_file_sizes.py")


def run(root) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, text=True)


def test_this_tree_has_no_file_over_400_lines():
  result = run(ROOT)
  assert result.returncode == 0, result.stderr


def test_a_file_over_400_lines_is_named_with_its_length(tmp_path):
  (tmp_path / "jax_mosaic_ffi" / "call").mkdir(parents=True)
  (tmp_path / "csrc" / "runtime").mkdir(parents=True)
  (tmp_path / "jax_mosaic_ffi" / "call" / "fine.py").write_text("x = 1\n" * 400)
  (tmp_path / "csrc" / "runtime" / "fine.h").write_text("// a\n" * 400)
  assert run(tmp_path).returncode == 0
  (tmp_path / "jax_mosaic_ffi" / "call" / "big.py").write_text("x = 1\n" * 401)
  (tmp_path / "csrc" / "runtime" / "big.cc").write_text("// a\n" * 450)
  (tmp_path / "csrc" / "runtime" / "notes.txt").write_text("a\n" * 999)  # not code: not counted
  result = run(tmp_path)
  assert result.returncode == 1
  problems = sorted(result.stderr.splitlines())
  assert problems == ["csrc/runtime/big.cc: 450 lines, over 400: split it into named files",
                      "jax_mosaic_ffi/call/big.py: 401 lines, over 400: split it into named files"]
