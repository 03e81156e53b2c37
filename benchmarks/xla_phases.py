"""XLA's own host time per execution, by phase, read from its verbose log.

With command buffers on, the GPU side of a chain of our calls costs what
XLA's own kernels cost (launch.py stamps it with the GPU clock); what is left
is host work. XLA times it itself: with TF_CPP_MAX_VLOG_LEVEL=3 each
execution logs when it starts preparing its thunks, when they are prepared,
when the thunks ran, and the whole execution's host time. This module runs
jitted chains in such a process and reads those lines back.

The lines are jaxlib 0.11.2's (gpu_executable.cc and se_gpu_pjrt_client.cc);
where another jaxlib logs otherwise, nothing parses and the table says n/a.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile

# The messages that bound each phase, in the order one execution logs them.
MARKS = (
    ("prepare", "additional compute streams"),  # then the thunks' Prepare, Initialize
    ("prepared", "Prepared GPU executable"),
    ("start", "Start GpuExecutable::ExecuteOnStream"),
    ("end", "End GpuExecutable::ExecuteOnStream"),
    ("done", "ExecuteAsyncOnStreamImpl("),  # after the execution's scoped state is gone
)
_TOTAL = re.compile(r"ExecuteAsyncOnStreamImpl\([^)]*\) time: (\d+) us")
_MARKER = "@@jax_mosaic_ffi phase marker "


def _seconds(line: str) -> float | None:
  """The time of day of a glog line ("I1203 08:36:25.763040 800 file.cc:42] ...")."""
  try:
    hours, minutes, seconds = line.split()[1].split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
  except (IndexError, ValueError):
    return None


def parse(lines) -> dict:
  """Per-execution medians in us: prepare (the thunks' Prepare and Initialize),
  execute (the thunks: here one graph launch), after (from the thunks' end to
  XLA's timing line: the execution's state torn down), xla_total (XLA's own
  figure for the whole execution), and the number of executions read."""
  phases = {"prepare": [], "execute": [], "after": [], "xla_total": []}
  seen: dict[str, float] = {}
  for line in lines:
    name = next((n for n, text in MARKS if text in line), None)
    if name is None:
      continue
    when = _seconds(line)
    if when is None:
      continue
    if name == "prepare":
      seen = {}  # a new execution (communication and compute streams log alike: the last one counts)
    seen[name] = when
    if name != "done":
      continue
    total = _TOTAL.search(line)
    if all(n in seen for n, _ in MARKS) and total:
      phases["prepare"].append(seen["prepared"] - seen["prepare"])
      phases["execute"].append(seen["end"] - seen["start"])
      phases["after"].append(seen["done"] - seen["end"])
      phases["xla_total"].append(float(total.group(1)) * 1e-6)
    seen = {}
  count = len(phases["xla_total"])
  result = {name: statistics.median(v) * 1e6 for name, v in phases.items() if v}
  return {**result, "executions": count}


def split_by_marker(lines) -> dict[str, list[str]]:
  """The log lines between our markers, by the marker's name."""
  parts: dict[str, list[str]] = {}
  current = None
  for line in lines:
    if _MARKER in line:
      name = line.split(_MARKER, 1)[1].strip()
      current = None if name == "end" else parts.setdefault(name, [])
      continue
    if current is not None:
      current.append(line)
  return parts


def measure(programs: dict, executions: int = 200) -> dict:
  """{name: parse()} for each jitted program of `programs` {name: (maker of a
  blocking call)}, in a process whose stderr is XLA's log. Must run before
  anything imports jax: XLA reads the log level once."""
  import sys
  if "jax" in sys.modules:
    raise RuntimeError("xla_phases.measure must run before jax is imported")
  os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
  os.environ["TF_CPP_MAX_VLOG_LEVEL"] = "3"
  log = tempfile.TemporaryFile()
  saved = os.dup(2)
  os.dup2(log.fileno(), 2)
  errors = {}
  try:
    for name, make in programs.items():
      try:
        call = make()
        for _ in range(5):  # compiled, recorded, warm
          call()
      except Exception as e:  # reported, not fatal: the other programs still count
        errors[name] = f"{type(e).__name__}: {e}"[-1500:]
        continue
      sys.stderr.flush()
      os.write(2, f"\n{_MARKER}{name}\n".encode())
      for _ in range(executions):
        call()
      sys.stderr.flush()
      os.write(2, f"\n{_MARKER}end\n".encode())
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
  log.seek(0)
  lines = (raw.decode(errors="replace") for raw in log)
  parts = split_by_marker(lines)
  log.close()
  measured = {name: parse(parts.get(name, ())) for name in programs if name not in errors}
  return {"phases": measured, "errors": errors}
