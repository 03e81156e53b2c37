"""The benchmarks package of this tree, imported without putting the tree on sys.path (its jax_mosaic_ffi may
have no compiled extension: the installed one must win): its benchmarks, and the kernel corpus
(benchmarks/kernels/) that tests and benchmarks share."""

import importlib
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load():
  if "benchmarks" not in sys.modules:
    spec = importlib.util.spec_from_file_location("benchmarks", os.path.join(REPO, "benchmarks", "__init__.py"),
                                                  submodule_search_locations=[os.path.join(REPO, "benchmarks")])
    package = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = package
    spec.loader.exec_module(package)
  import benchmarks.goals
  import benchmarks.hlo_inspect
  import benchmarks.report
  import benchmarks.suite
  return benchmarks


def module(name: str):
  """A module of the benchmarks package, benchmarks/<name>.py (dots for folders), imported on first use."""
  load()
  return importlib.import_module(f"benchmarks.{name}")


def kernels(name: str):
  """A module of the kernel corpus, benchmarks/kernels/<name>.py."""
  return module(f"kernels.{name}")
