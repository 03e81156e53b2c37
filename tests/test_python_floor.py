"""An older Python is told plainly at `pip install` that the package needs Python >= 3.12: pip resolves the build
requirements before it reads ``requires-python``, so those that need the floor too (jax and jaxlib) carry it as a
marker, and pip gets as far as its own "requires a different Python" instead of "Could not find a version that
satisfies the requirement jax==0.11.2" and a list of 230 versions."""

import glob
import os
import pathlib
import re
import shutil
import subprocess
import tomllib

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

import fresh_process

REPO = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
pytestmark = pytest.mark.skipif(not PYPROJECT.exists(), reason="needs the source checkout")


def _project():
  return tomllib.loads(PYPROJECT.read_text())


def _floor() -> tuple[int, int]:
  match = re.fullmatch(r">=(\d+)\.(\d+)", _project()["project"]["requires-python"].replace(" ", ""))
  assert match, "requires-python is a floor"
  return int(match.group(1)), int(match.group(2))


def _wanted_at(python: tuple[int, int]) -> list[str]:
  environment = {**default_environment(), "python_version": f"{python[0]}.{python[1]}",
                 "python_full_version": f"{python[0]}.{python[1]}.0"}
  requirements = [Requirement(r) for r in _project()["build-system"]["requires"]]
  return [r.name for r in requirements if r.marker is None or r.marker.evaluate(environment)]


def test_the_build_requirements_that_need_the_python_floor_are_marked_with_it():
  major, minor = _floor()
  at_floor, below = _wanted_at((major, minor)), _wanted_at((major, minor - 1))
  assert {"jax", "jaxlib"} <= set(at_floor)  # the FFI headers come from them
  assert not {"jax", "jaxlib"} & set(below), below  # jax 0.11.2 has no release for an older Python
  assert set(at_floor) - set(below) == {"jax", "jaxlib"}


def _older_python() -> str | None:
  major, minor = _floor()
  found = shutil.which(f"python{major}.{minor - 1}")
  candidates = [found] if found else []
  candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{major}.{minor - 1}.*/bin/python")))
  return candidates[0] if candidates else None


@pytest.mark.slow
def test_pip_install_on_an_older_python_says_it_needs_the_floor(tmp_path):
  """For real: pip of the Python below the floor installs what metadata needs of a copy of the checkout (its build
  requirements, from the index or pip's cache), and refuses. Skips without such a Python or an index."""
  python = _older_python()
  if python is None:
    pytest.skip("no Python older than the floor on this machine")
  checkout = tmp_path / "checkout"
  for name in ("pyproject.toml", "README.md", "LICENSE", "CMakeLists.txt", "jax_mosaic_ffi/_version.py"):
    (checkout / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / name, checkout / name)
  ran = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--target", str(tmp_path / "target"),
                        str(checkout)], capture_output=True, text=True, timeout=fresh_process.HANG_GUARD_S)
  output = ran.stdout + ran.stderr
  if "requires a different Python" not in output and re.search(r"No matching distribution found for "
                                                               r"(scikit-build-core|nanobind|nvidia)", output):
    pytest.skip(f"pip found no index for the build requirements here: {output[-300:]}")
  major, minor = _floor()
  assert ran.returncode != 0, output
  assert re.search(rf"requires a different Python: {major}\.{minor - 1}\.\d+ not in '>={major}\.{minor}'",
                   output), output
  assert "jax==0.11.2" not in output, output
