"""Runs the benchmarks, each process in turn, then writes the report.

    python -m benchmarks [--only launch,bandwidth | --only launch/cb_on] [--out DIR] [--doc PATH] [--splice] [--list]

With --splice (for --only), the page keeps every other section as the run that wrote it left them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time

from benchmarks import REPO, machine, report, suite
from benchmarks.markdown import failure, last_line

DEFAULT_OUT = os.path.join(REPO, "build", "benchmarks")


def _parse(argv, modules):
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", help="benchmarks (or benchmark/run) to run, comma-separated (default: all of "
                                     f"{', '.join(m.NAME for m in modules)}); a run named here that skips fails")
  parser.add_argument("--out", default=DEFAULT_OUT,
                      help="where the raw results (benchmarks.json), a copy of the page and figures go "
                           "(default: %(default)s)")
  parser.add_argument("--doc", default=report.DOC, help="the Markdown page to write (default: %(default)s)")
  parser.add_argument("--splice", action="store_true",
                      help="replace only the sections of the benchmarks run in the page at --doc, keeping the rest")
  parser.add_argument("--list", action="store_true", help="list the benchmarks and their runs, run nothing")
  args = parser.parse_args(argv)
  try:
    args.selected = _select(args.only or ",".join(m.NAME for m in modules), modules)
  except ValueError as e:
    parser.error(str(e))
  return args


def _select(only: str, modules) -> list[tuple]:
  """(module, [runs]) for `only`: names, or name/run for one process."""
  by_name = {m.NAME: m for m in modules}
  chosen = {}
  for entry in filter(None, (e.strip() for e in only.split(","))):
    name, _, run_name = entry.partition("/")
    if name not in by_name:
      raise ValueError(f"no benchmark {name!r}; there are {', '.join(by_name)}")
    runs = [r for r in by_name[name].RUNS if not run_name or r.name == run_name]
    if not runs:
      raise ValueError(f"{name} has no run {run_name!r}; it has {', '.join(r.name for r in by_name[name].RUNS)}")
    chosen.setdefault(name, [])
    chosen[name] += [r for r in runs if r not in chosen[name]]
  return [(by_name[name], runs) for name, runs in chosen.items()]


def _list(modules) -> None:
  for module in modules:
    print(f"{module.NAME}: {module.TITLE}")
    for run in module.RUNS:
      flags = f"  XLA_FLAGS+={run.xla_flags}" if run.xla_flags else ""
      print(f"  {module.NAME}/{run.name}{' (optional)' if run.optional else ''}{flags}")


def measure(selected, raw: str | None = None) -> dict:
  """Runs every selected process; the results dict the report reads, also written to `raw` after each run (a
  call killed at its time limit keeps the runs that ended)."""
  results = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "machine": machine.describe(), "results": {}, "runs": {}}
  print("machine: " + machine.summary(results["machine"]), flush=True)
  # One kernel disk cache for the whole suite, empty at the start (NVRTC runs once per kernel), removed at its end.
  # Its errors ignored: a child stopped at its timeout may leave files there that we cannot remove.
  with tempfile.TemporaryDirectory(prefix="jmf-bench-cache-", ignore_cleanup_errors=True) as cache:
    env = {"JAX_MOSAIC_FFI_CACHE_DIR": cache, "JAX_MOSAIC_FFI_POISON_OUTPUTS": "0"}
    for module, runs in sorted(selected, key=lambda item: item[0].ORDER):
      for run in runs:
        start = time.perf_counter()
        result = suite.run_in_child(module, run, env)
        seconds = time.perf_counter() - start
        results["results"].setdefault(module.NAME, {})[run.name] = result
        outcome = run_outcome(result, run)
        results["runs"][f"{module.NAME}/{run.name}"] = {"seconds": seconds, "outcome": outcome,
                                                        "optional": run.optional}
        print(f"== {module.NAME}/{run.name}: {seconds:.1f} s, {outcome}", flush=True)
        if raw:
          _write_json(results, raw)
  return results


def _write_json(results: dict, path: str) -> None:
  with open(path + ".partial", "w") as f:
    json.dump(results, f, indent=1)
  os.replace(path + ".partial", path)


def run_outcome(result: dict, run: suite.Run) -> str:
  """The Runs table's outcome: "ok", "ok, but n/a: <parts>", or why it failed or skipped."""
  why, lost = failure(result), sorted(result.get("errors") or ())
  if not why and lost and result.get("measured") is False:
    why = f"failed: no part measured: {', '.join(lost)}"
  if why:
    return ("n/a (optional): " if run.optional else "") + why
  return f"ok, but n/a: {', '.join(lost)}" if lost else "ok"  # the process finished; these parts did not measure


def main(argv=None) -> int:
  modules = suite.discover()
  args = _parse(argv, modules)
  if args.list:
    _list(modules)
    return 0
  started, started_at = time.perf_counter(), time.time()
  os.makedirs(args.out, exist_ok=True)
  raw = os.path.join(args.out, "benchmarks.json")  # before the page: whatever the rendering does, numbers are kept
  results = measure(args.selected, raw)
  text = report.write(results, args.doc, splice=args.splice)
  for name in [args.doc] + [os.path.join(os.path.dirname(args.doc), n) for n in _figures(modules)]:
    fresh = os.path.exists(name) and os.path.getmtime(name) >= started_at  # not a figure left from an older run
    if fresh and os.path.dirname(os.path.abspath(name)) != os.path.abspath(args.out):
      shutil.copy(name, args.out)
  print(text)
  print(f"raw results: {raw}; page: {args.doc}; {time.perf_counter() - started:.0f} s in all")
  # A run asked for by name must measure: its skip (no torch, one GPU) is a failure of the call that asked.
  passing = ("ok",) if args.only else ("ok", "skipped")
  failed = [name for name, run in results["runs"].items() if not run["optional"]
            and not run["outcome"].startswith(passing)]
  if failed:
    print("failed: " + "; ".join(f"{n}: {last_line(results['runs'][n]['outcome'])}" for n in failed), file=sys.stderr)
  return 1 if failed else 0


def _figures(modules) -> list[str]:
  return [m.FIGURE for m in modules if getattr(m, "FIGURE", None)]


if __name__ == "__main__":
  sys.exit(main())
