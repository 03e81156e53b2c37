"""Finding the benchmarks and running each of their processes.

A benchmark's RUNS are processes of their own: XLA reads XLA_FLAGS once, at
its first use, so every flag setting is a fresh interpreter. A child runs

    python -m benchmarks.suite NAME RUN

(which is also how to run one by hand), sets the run's flags before anything
imports jax, calls the module's run() and prints its dict as the last line.
In that dict, "error" or "skipped" says the run has no numbers; "errors" maps
the parts that failed (the run went on) to their errors, and "measured":
False says no part measured (the run fails, each part's error still its row).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import types

import benchmarks

RESULT_PREFIX = "RESULT "
CHILD_PREFIX = "CHILD "  # what a benchmark's own child processes print their JSON after (json_child)


@dataclasses.dataclass(frozen=True)
class Run:
  """One process of a benchmark."""

  name: str  # its key in the results
  kwargs: dict = dataclasses.field(default_factory=dict)  # for the module's run()
  xla_flags: str = ""  # added to XLA_FLAGS in that process
  optional: bool = False  # its failure is reported as n/a and does not fail the suite
  timeout_s: float = 150.0  # a hung process must not eat the GPU session: runs take 5-40 s


def discover() -> list[types.ModuleType]:
  """Every module of the package that defines RUNS, in ORDER."""
  found = []
  for info in pkgutil.iter_modules(benchmarks.__path__):
    if info.name.startswith("_"):
      continue
    module = importlib.import_module(f"benchmarks.{info.name}")
    if hasattr(module, "RUNS"):
      found.append(module)
  return sorted(found, key=lambda m: (m.ORDER, m.NAME))


def by_name() -> dict[str, types.ModuleType]:
  return {m.NAME: m for m in discover()}


def run_in_child(module: types.ModuleType, run: Run, env: dict[str, str]) -> dict:
  """Runs one process of `module`; its dict, or {"error": ...} when it failed."""
  environment = {**os.environ, **env}
  # The child imports this package by name; where the source tree has no
  # built extension, benchmarks/__init__.py keeps it off the child's path again.
  environment["PYTHONPATH"] = os.pathsep.join(p for p in (benchmarks.REPO, environment.get("PYTHONPATH")) if p)
  command = [sys.executable, "-m", "benchmarks.suite", module.NAME, run.name]
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=run.timeout_s, env=environment,
                          cwd=tempfile.gettempdir())
  except subprocess.TimeoutExpired as e:
    return {"error": f"timed out after {run.timeout_s:.0f} s\n{_text(e.stderr)[-1500:]}"}
  lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
  if done.returncode != 0 or not lines:
    tail = (done.stderr.strip() or done.stdout.strip())[-1500:]
    return {"error": f"exit code {done.returncode}\n{tail}"}
  return json.loads(lines[-1][len(RESULT_PREFIX):])


def json_child(code: str, args, env: dict[str, str], timeout: float, *, tail: int = 3000) -> dict:
  """Runs ``python -c code *args`` (this repository on its path, `env` added, in the temp folder) and returns
  the JSON of the last line it prints after "CHILD "; raises RuntimeError with the end of its output otherwise.
  -c, not -m: Triton reads its kernels' module, which must not be __main__."""
  environment = {**os.environ, **env}
  environment["PYTHONPATH"] = os.pathsep.join(p for p in (benchmarks.REPO, environment.get("PYTHONPATH")) if p)
  done = subprocess.run([sys.executable, "-c", code, *args], env=environment, capture_output=True, text=True,
                        timeout=timeout, cwd=tempfile.gettempdir())
  lines = [line for line in done.stdout.splitlines() if line.startswith(CHILD_PREFIX)]
  if done.returncode != 0 or not lines:
    raise RuntimeError(f"exit code {done.returncode}\n{(done.stderr.strip() or done.stdout.strip())[-tail:]}")
  return json.loads(lines[-1][len(CHILD_PREFIX):])


def _text(data) -> str:
  return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def child_main(argv: list[str]) -> None:
  name, run_name = argv
  module = by_name()[name]
  run = next(r for r in module.RUNS if r.name == run_name)
  if "jax" in sys.modules:  # its flags would be read already
    raise RuntimeError("jax was imported before the run's XLA flags were set")
  if run.xla_flags:
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {run.xla_flags}".strip()
  os.environ.setdefault("JAX_MOSAIC_FFI_POISON_OUTPUTS", "0")  # a fill before each launch would be timed
  result = module.run(**run.kwargs)
  print(RESULT_PREFIX + json.dumps(result, default=_plain), flush=True)


def _plain(value):
  """numpy scalars as Python numbers (json knows float64 but not float32 or bool_)."""
  if hasattr(value, "item"):
    return value.item()
  raise TypeError(f"{type(value).__name__} in a benchmark's results is not JSON")


if __name__ == "__main__":
  child_main(sys.argv[1:])
