"""The scripts a newcomer runs first: how they find Python (scripts/find_python.sh, the one way every script does).

Each test builds a machine of its own out of real interpreters: a PATH folder and a pyenv root in tmp_path,
holding links to this test's Python (>= 3.12) and an older one where there is one, and pyenv's shims as they
answer when the version asked for is not pyenv's global one.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import fresh_process

REPO = pathlib.Path(__file__).resolve().parents[1]
FIND_PYTHON = REPO / "scripts" / "find_python.sh"
# The interpreter under this test's venv: a venv's python is a link that only works inside the venv's folder.
PYTHON = pathlib.Path(sys._base_executable).resolve()
OLD_PYTHON = next((p for p in map(shutil.which, ("python3.11", "python3.10")) if p), None)
# What pyenv's shim says (exit 127) for a version that is installed but not selected.
SHIM = '#!/bin/sh\necho "pyenv: $(basename "$0"): command not found" >&2\nexit 127\n'


def machine(tmp_path, *, pyenv_312: bool, python3: str | None) -> dict:
  """An environment whose only Pythons are: pyenv's shims for python3.12 and python3.13 (failing), python3 (a link
  to ``python3``, or a failing shim), and under the pyenv root a 3.12 where ``pyenv_312``."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name in ("python3.12", "python3.13"):
    (bin_dir / name).write_text(SHIM)
    (bin_dir / name).chmod(0o755)
  if python3 is None:
    (bin_dir / "python3").write_text(SHIM)
    (bin_dir / "python3").chmod(0o755)
  else:
    (bin_dir / "python3").symlink_to(python3)
  root = tmp_path / "pyenv"
  (root / "versions").mkdir(parents=True)
  if pyenv_312:
    version = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    (root / "versions" / version / "bin").mkdir(parents=True)
    (root / "versions" / version / "bin" / "python").symlink_to(PYTHON)
  # The system's tools (bash, sha256sum, git, ...), but no Python: a folder of links to them.
  tools = tmp_path / "tools"
  tools.mkdir()
  for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
    for tool in pathlib.Path(folder).iterdir() if os.path.isdir(folder) else ():
      if not tool.name.startswith(("python", "pip", "pydoc", "idle", "2to3")) and not (tools / tool.name).exists():
        (tools / tool.name).symlink_to(tool)
  return {"PATH": f"{bin_dir}:{tools}", "PYENV_ROOT": str(root), "HOME": str(tmp_path)}


def find_python(env: dict, jmf_python: str | None = None) -> subprocess.CompletedProcess:
  env = dict(env, **({"JMF_PYTHON": jmf_python} if jmf_python is not None else {}))
  return subprocess.run(["bash", "-c", f'source "{FIND_PYTHON}"; find_python'], capture_output=True, text=True,
                        env=env, timeout=fresh_process.HANG_GUARD_S)


def test_pyenvs_python_is_found_where_its_shims_point_at_an_older_version(tmp_path):
  env = machine(tmp_path, pyenv_312=True, python3=OLD_PYTHON)
  found = find_python(env)
  assert found.returncode == 0, found.stderr
  assert found.stdout.strip().startswith(str(tmp_path / "pyenv" / "versions")), found.stdout
  assert found.stderr == ""


def test_a_jmf_python_that_does_not_run_is_said_and_passed_over(tmp_path):
  # The case: JMF_PYTHON=python3.12, a shim of a version pyenv has but does not select.
  env = machine(tmp_path, pyenv_312=True, python3=OLD_PYTHON)
  found = find_python(env, "python3.12")
  assert found.returncode == 0 and "/pyenv/versions/" in found.stdout, found.stderr
  assert found.stderr.strip() == ("note: JMF_PYTHON=python3.12 is not a Python >= 3.12 that runs (pyenv: python3.12: "
                                  "command not found); looking for one"), found.stderr
  # One that runs is taken as it is.
  assert find_python(env, str(PYTHON)).stdout.strip() == str(PYTHON)


@pytest.mark.skipif(OLD_PYTHON is None, reason="needs a Python older than 3.12 to stand for python3")
def test_an_older_jmf_python_is_named_with_its_version(tmp_path):
  env = machine(tmp_path, pyenv_312=True, python3=OLD_PYTHON)
  found = find_python(env, OLD_PYTHON)
  version = subprocess.run([OLD_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True).stdout.strip()
  assert f"is not a Python >= 3.12 that runs (Python {version})" in found.stderr, found.stderr
  assert found.returncode == 0 and "/pyenv/versions/" in found.stdout


def test_where_there_is_none_it_says_what_it_tried_and_how_to_get_one(tmp_path):
  env = machine(tmp_path, pyenv_312=False, python3=OLD_PYTHON)
  found = find_python(env)
  assert found.returncode == 1 and found.stdout == ""
  assert found.stderr.splitlines() == [
      "error: no Python >= 3.12 found (tried python3.13 python3.12 python3); jax_mosaic_ffi needs one (jax >= 0.11 "
      "does).",
      "       Install one (pyenv install 3.12, or your system's python3.12 package) or set JMF_PYTHON to its path."]


@pytest.mark.parametrize("script", ["build_wheel.sh", "demo.sh", "test.sh", "docs.sh"])
def test_every_setup_script_finds_python_the_one_way(tmp_path, script):
  # Each stops at find_python's message where there is no Python (before building or installing anything), and
  # none has a way of its own (build_wheel.sh had: "no Python >= 3.12 at python3: set JMF_PYTHON").
  env = machine(tmp_path, pyenv_312=False, python3=OLD_PYTHON)
  env["JMF_VENV"] = str(tmp_path / "venv")  # none yet, as in a fresh clone
  result = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=fresh_process.HANG_GUARD_S)
  assert result.returncode == 1, result.stdout + result.stderr
  assert "error: no Python >= 3.12 found (tried " in result.stderr, result.stderr
  assert not (tmp_path / "venv").exists()


PIP_STEPS = REPO / "scripts" / "pip_steps.sh"
# Lines of `pip install -v -e .` as pip 23 and scikit-build-core 1.1 print them, with the noise between them.
PIP_VERBOSE = """\
Using pip 23.2.1 from /venv/lib/python3.12/site-packages/pip (python 3.12)
Obtaining file:///checkout
  Installing build dependencies: started
  Running command pip subprocess to install build dependencies
  Collecting jaxlib==0.11.2
    Downloading jaxlib-0.11.2-cp312-cp312-manylinux_2_27_x86_64.whl (89.9 MB)
  Installing build dependencies: finished with status 'done'
Collecting numpy>=1.26 (from jax_mosaic_ffi==0.1.0)
  *** scikit-build-core 1.1.2 using CMake 3.25.1 (editable)
  *** Configuring CMake...
  -- The CXX compiler identification is GNU 12.2.0
  [1/40] Building CXX object CMakeFiles/jmf_runtime.dir/csrc/contract/tensor_maps.cc.o
  [28/40] Building CXX object CMakeFiles/nanobind-static-abi3.dir/tmp/env/site-packages/nanobind/src/nb_type.cpp.o
  [40/40] Linking CXX shared module _core.abi3.so
Installing collected packages: flatbuffers, numpy
"""


def pip_steps(tmp_path, status: int) -> subprocess.CompletedProcess:
  pip = tmp_path / "pip"
  pip.write_text(f"#!/bin/sh\ncat <<'EOF'\n{PIP_VERBOSE}EOF\necho \"args: $*\"\nexit {status}\n")
  pip.chmod(0o755)
  log = tmp_path / "install.log"
  script = (f'source "{PIP_STEPS}"; say_requirements "triton>=3.6,<3.10; platform_system == \'Linux\'" "pytest>=8"; '
            f'pip_showing_steps "{log}" "{pip}" install -e .')
  return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=fresh_process.HANG_GUARD_S)


def test_a_pip_install_says_each_step_and_keeps_the_whole_output(tmp_path):
  result = pip_steps(tmp_path, 0)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      "     triton>=3.6,<3.10; platform_system == 'Linux'",
      "     pytest>=8",
      "   pip: the build's own requirements (jax 0.11.2 for its FFI headers, nanobind, scikit-build-core, CMake)",
      "   pip: jaxlib==0.11.2",
      "   pip: numpy>=1.26",
      "   build: CMake configures the C++ extension",
      "   build: [1/40] compiling csrc/contract/tensor_maps.cc",
      "   build: [28/40] compiling nanobind/src/nb_type.cpp",
      "   build: [40/40] linking _core.abi3.so",
      "   pip: installing flatbuffers, numpy...",
  ]
  assert (tmp_path / "install.log").read_text() == PIP_VERBOSE + "args: install -e . -v\n"


def test_a_failed_pip_install_shows_the_end_of_its_output_and_fails(tmp_path):
  result = pip_steps(tmp_path, 3)
  assert result.returncode == 3
  assert result.stderr.splitlines()[-2:] == ["args: install -e . -v",
                                             f"error: pip failed (exit 3); its whole output: {tmp_path}/install.log"]
