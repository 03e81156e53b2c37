"""jax_mosaic_ffi's benchmarks, run as a package:

    python -m benchmarks [--only launch,bandwidth] [--out DIR]   # measure, write docs/benchmarks.md
    python -m benchmarks.report results.json                      # the Markdown again, from saved results

Each benchmark is a module here that defines NAME, TITLE, ORDER, RUNS (its
processes: XLA reads its flags once per process), run(**kwargs) -> dict
(measures, in a fresh process) and tables(results) -> [Markdown] (renders
the saved results, without jax). Goals live in one table, goals.py, that
reads metrics by path. Adding a benchmark (autotuning, vmap, ...) is one
module that defines those names, plus its rows in goals.GOALS.

Modules import jax inside functions only: the parent process imports them all
to find and render them, and must neither start a GPU backend nor fix XLA's
flags before a child sets them.
"""

import glob
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _keep_unbuilt_source_tree_off_path() -> None:
  """`python -m benchmarks` from the repository root puts the source tree first
  on sys.path, and its jax_mosaic_ffi has no compiled extension unless it was
  built in place: then the installed package must win, here and in every
  process started from here (PYTHONPATH is inherited)."""
  if glob.glob(os.path.join(REPO, "jax_mosaic_ffi", "base", "_core*.so")):
    return

  def is_repo(entry: str) -> bool:
    return os.path.realpath(entry or os.getcwd()) == os.path.realpath(REPO)

  sys.path[:] = [entry for entry in sys.path if not is_repo(entry)]
  if os.environ.get("PYTHONPATH"):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        entry for entry in os.environ["PYTHONPATH"].split(os.pathsep) if entry and not is_repo(entry))


_keep_unbuilt_source_tree_off_path()
