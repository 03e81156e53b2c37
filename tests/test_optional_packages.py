"""Tests that skip what is not installed: collected where Triton, the CuTe DSL, NVSHMEM, torch and pytest-xdist
are absent, the suite has no error, and each module that needs one of them is skipped with the reason.

The environment without them is real: a site folder of this test's own, with links to everything in this venv's
site-packages but the files those distributions installed (their RECORD), read by a fresh interpreter started
without its own site-packages. CI also runs the whole suite in a venv with only the [test] extra (.ci/run).
"""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tomllib

import pytest

import fresh_process

REPO = pathlib.Path(__file__).resolve().parents[1]
# The optional packages' distributions: the extras' (and what only they bring: the DSL's libraries), torch (the
# CuTe DSL's and quack's tests use it where present), jax-triton (its adapter's tests) and pytest-xdist.
OPTIONAL = ("triton", "nvidia-cutlass-dsl", "nvidia-nvshmem-cu13", "torch", "jax-triton", "quack-kernels",
            "flash-attn-4", "pytest-xdist")
OPTIONAL_PREFIXES = ("nvidia-cutlass-dsl-",)  # the DSL's libraries (libs-base, libs-core, libs-cu13, ...)
OPTIONAL_EXTRAS = ("triton", "cute", "nvshmem")


def normalized(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def hidden_files(site: pathlib.Path) -> set[pathlib.Path]:
  """Every file under `site` that one of the OPTIONAL distributions installed."""
  files = set()
  for dist in importlib.metadata.distributions(path=[str(site)]):
    name = normalized(dist.metadata["Name"])
    if name in OPTIONAL or name.startswith(OPTIONAL_PREFIXES):
      files |= {site / f for f in dist.files or () if ".." not in f.parts}
  return files


def link_all_but(source: pathlib.Path, target: pathlib.Path, hidden: set[pathlib.Path], hidden_dirs: set) -> None:
  """target mirrors source with links, leaving out the hidden files: a folder holding some is mirrored inside, but
  not a package whose __init__.py is hidden, nor byte code, nor what is left empty (each would still import)."""
  target.mkdir()
  for entry in source.iterdir():
    if entry in hidden or (entry / "__init__.py") in hidden or entry.name == "__pycache__":
      continue
    if entry in hidden_dirs and entry.is_dir() and not entry.is_symlink():
      link_all_but(entry, target / entry.name, hidden, hidden_dirs)
    else:
      (target / entry.name).symlink_to(entry)
  if not any(target.iterdir()):
    target.rmdir()


def test_the_extras_optional_packages_are_all_hidden_here():
  extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  named = {normalized(re.match(r"[\w.-]+", req).group()) for extra in OPTIONAL_EXTRAS for req in extras[extra]}
  assert named <= set(OPTIONAL), f"add {sorted(named - set(OPTIONAL))} to OPTIONAL"
  assert named


@pytest.mark.slow  # it imports every test module (10 to 90 s on 2 cores); the [test]-only lane runs them all
def test_without_the_optional_packages_nothing_errors_at_collection(tmp_path):
  config = pathlib.Path(sys.prefix) / "pyvenv.cfg"
  if config.exists() and re.search(r"include-system-site-packages\s*=\s*true", config.read_text(), re.I):
    pytest.skip("this venv sees the system's packages (JMF_SYSTEM_SITE_PACKAGES=1), which this test cannot hide")
  site = pathlib.Path(sysconfig.get_paths()["purelib"])
  hidden = hidden_files(site)
  hidden_dirs = {parent for path in hidden for parent in path.parents if site in parent.parents}
  links = tmp_path / "site-packages"
  link_all_but(site, links, hidden, hidden_dirs)
  # -S: not this venv's site-packages, only the mirror (whose .pth files, the editable install's, still apply).
  program = ("import site, sys; site.addsitedir(sys.argv[1]); import pytest; "
             "sys.exit(pytest.main(['--collect-only', '-q', '-rs', '-p', 'no:cacheprovider', 'tests']))")
  # Nor PYTHONPATH, where carried packages come in (scripts/gpu_check.sh's JMF_CARRIED).
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  found = ("import site, sys; site.addsitedir(sys.argv[1]); import importlib.util as u; "
           "print([m for m in ('triton', 'cutlass', 'xdist', 'torch', 'nvidia.nvshmem') "
           "if u.find_spec(m.split('.')[0]) and u.find_spec(m)])")
  probe = subprocess.run([sys.executable, "-S", "-c", found, str(links)], capture_output=True, text=True, env=env,
                         timeout=fresh_process.HANG_GUARD_S)
  assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr
  result = subprocess.run([sys.executable, "-S", "-c", program, str(links)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=fresh_process.HANG_GUARD_S)
  output = result.stdout + result.stderr
  assert result.returncode == 0 and " error" not in output.splitlines()[-1], output[-6000:]
  skipped = "\n".join(line for line in output.splitlines() if line.startswith("SKIPPED"))
  assert "triton is not installed (pip install 'jax_mosaic_ffi[triton]')" in skipped, skipped
  assert "nvidia-cutlass-dsl is not installed (pip install 'jax_mosaic_ffi[cute]')" in skipped, skipped
