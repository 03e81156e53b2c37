"""The test files of one part of the suite, so that a long run can be made in several calls (scripts/gpu_check.sh).

    python scripts/test_parts.py K N < collected.txt

reads pytest's ``--collect-only -q`` output (one node id per line, ``tests/test_x.py::test_y[...]``) and prints
the test files of part K of N (1 <= K <= N), one per line. Whole files, so that a module's fixtures (a compile
shared by its tests) run once; the files go to the parts greedily, most tests first, so every part gets about
as many tests; the same collection gives the same parts, and every file is in exactly one part. Standard
library only.
"""

from __future__ import annotations

import collections
import sys


def parts(node_ids, count: int) -> list[list[str]]:
  """The files of each of ``count`` parts, each part's files sorted."""
  per_file = collections.Counter(node.split("::", 1)[0] for node in node_ids if "::" in node)
  loads = [0] * count
  chosen: list[list[str]] = [[] for _ in range(count)]
  for name, tests in sorted(per_file.items(), key=lambda item: (-item[1], item[0])):
    k = min(range(count), key=lambda j: (loads[j], j))
    loads[k] += tests
    chosen[k].append(name)
  return [sorted(files) for files in chosen]


def main(argv) -> int:
  try:
    k, n = int(argv[1]), int(argv[2])
  except (IndexError, ValueError):
    print("usage: test_parts.py K N < pytest --collect-only -q output", file=sys.stderr)
    return 2
  if not 1 <= k <= n:
    print(f"test_parts.py: part {k} of {n} does not exist (1 <= K <= N)", file=sys.stderr)
    return 2
  print("\n".join(parts(sys.stdin.read().splitlines(), n)[k - 1]))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
