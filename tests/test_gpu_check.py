"""scripts/gpu_check.sh's parts (scripts/test_parts.py): whole files, every selected test in exactly one part."""

import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "test_parts.py")


def parts_of(ids, n):
  text = "\n".join(ids) + "\n"
  out = []
  for k in range(1, n + 1):
    done = subprocess.run([sys.executable, SCRIPT, str(k), str(n)], input=text, capture_output=True, text=True,
                          check=True)
    out.append([line for line in done.stdout.splitlines() if line])
  return out


def test_the_parts_cover_every_file_once_and_balance_the_tests():
  # What pytest --collect-only -q prints: node ids, then a summary line.
  counts = {"tests/test_a.py": 30, "tests/test_b.py": 25, "tests/test_c.py": 10, "tests/test_d.py": 9,
            "tests/test_e.py": 8, "tests/test_f.py": 1}
  ids = [f"{name}::test_{k}[x]" for name, n in counts.items() for k in range(n)] + ["83 tests collected in 1.2s"]
  parts = parts_of(ids, 3)
  files = [f for part in parts for f in part]
  assert sorted(files) == sorted(counts) and len(files) == len(set(files)), parts
  loads = [sum(counts[f] for f in part) for part in parts]
  assert max(loads) - min(loads) <= 10, (parts, loads)
  assert parts_of(list(reversed(ids)), 3) == parts  # the collection's order does not matter
  assert parts_of(ids, 8)[7] == []  # more parts than files: some are empty, none fails


@pytest.mark.parametrize("args", [["0", "3"], ["4", "3"], ["x", "3"], []])
def test_a_part_that_does_not_exist_is_refused(args):
  done = subprocess.run([sys.executable, SCRIPT, *args], input="", capture_output=True, text=True)
  assert done.returncode == 2 and ("does not exist" in done.stderr or "usage" in done.stderr), done.stderr
