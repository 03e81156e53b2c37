"""Installation: the supported jax range, the release wheel, the version, the no-GPU note.

The wheel tests take the release wheel of these sources (scripts/build_wheel.sh,
built once per source state, or $JMF_WHEEL): its tag, the ELF needs of its
extension, its contents and metadata; then they install it into a fresh venv
and run a CPU smoke subset of these tests against the installed copy, not
this checkout.
"""

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base import versions

import elf_info
import fresh_process

REPO = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
# The compiled extension, as the wheel holds it: in the bottom layer, next to its one importer (base/native.py).
EXTENSION = "jax_mosaic_ffi/base/_core.abi3.so"
SMOKE_TESTS = ("test_install.py", "test_module_format.py", "test_compile.py", "test_lowering.py")


def run_python(code: str, env_extra=None, python=sys.executable, cwd=None):
  env = dict(os.environ, **(env_extra or {}))
  # -P: not the working directory on sys.path, where this checkout's package
  # (without its extension when installed from the wheel) would shadow the installed one.
  return subprocess.run([python, "-P", "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                        cwd=cwd, timeout=fresh_process.HANG_GUARD_S)


def _requirement(requirements, name):
  return next(r for r in requirements if re.match(rf"{name}\s*[<>=\[]", r))


@pytest.mark.skipif(not PYPROJECT.exists(), reason="needs the source checkout")
def test_supported_range_is_the_same_in_pyproject_and_at_import():
  project = tomllib.loads(PYPROJECT.read_text())
  deps = project["project"]["dependencies"]
  for name in ("jax", "jaxlib"):
    assert _requirement(deps, name).replace(" ", "") == f"{name}{versions.SUPPORTED}"
  assert project["project"]["optional-dependencies"]["cuda"] == [f"jax[cuda13]{versions.SUPPORTED}"]
  # The headers come from the oldest jaxlib in range.
  oldest = ".".join(map(str, versions.OLDEST))
  assert any(r.replace(" ", "").startswith(f"jaxlib=={oldest};") for r in project["build-system"]["requires"])
  assert versions.TESTED[0] == oldest and all(versions.in_range(v) for v in versions.TESTED)
  # CI runs the oldest in a venv of its own (the README command gets the newest).
  assert f"JMF_JAX={oldest}" in (REPO / ".ci" / "run").read_text()


@pytest.mark.skipif(not PYPROJECT.exists(), reason="needs the source checkout")
def test_installs_of_one_checkout_never_share_a_build_folder():
  # A build folder inside the checkout (build/{wheel_tag}) was shared by every install of it: two at once (two
  # venvs, or pip install . beside scripts/test.sh) ran CMake in one folder and broke each other.
  settings = tomllib.loads(PYPROJECT.read_text())["tool"]["scikit-build"]
  assert "build-dir" not in settings, "a build folder of its own per build: scikit-build-core's temporary one"
  setup = (REPO / "scripts" / "setup_env.sh").read_text()
  # The scripts' builds: one folder per venv (kept for incremental rebuilds), and one install per venv at a time.
  assert 'defines=("--config-settings=build-dir=$venv/build/{wheel_tag}")' in setup
  locked = setup.index('flock "$install_lock"')
  assert locked < setup.index("pip install -q") < setup.index("exec {install_lock}>&-")


def test_version_range():
  assert versions.parse("0.12.0.1") == (0, 12, 0, 1)
  assert versions.parse("0.13.0.dev20261101") == (0, 13, 0)
  assert versions.parse("0.12.1rc1") == (0, 12, 1)
  assert [v for v in ("0.11.1", "0.11.2", "0.11.9", "0.12.0.1", "0.12.7", "0.13.0", "1.0.0")
          if versions.in_range(v)] == ["0.11.2", "0.11.9", "0.12.0.1", "0.12.7"]
  assert versions.problem("0.12.0.1", "0.12.0.1", "0.11.2") is None
  message = versions.problem("0.13.0", "0.13.0", "0.11.2")
  assert ">=0.11.2,<0.13" in message and "jax 0.13.0 and jaxlib 0.13.0" in message
  assert "pip install" in message
  # Built against newer headers than the running jaxlib: XLA would refuse the handlers.
  assert "Rebuild" in versions.problem("0.11.2", "0.11.2", "0.12.0.1")


def test_installed_package_has_its_extension_and_device_headers():
  # Whether installed editable (scripts/test.sh) or from the wheel.
  assert pathlib.Path(_core.__file__).is_file()
  package = pathlib.Path(jmf.__file__).parent
  assert (package / "include" / "jax_mosaic_ffi" / "collective.cuh").is_file()
  # Set by the wheel test, which runs this in the venv it installed the wheel into.
  expected = os.environ.get("JMF_EXPECT_INSTALLED_UNDER")
  if expected:
    assert str(package).startswith(expected) and _core.__file__.startswith(expected)
  assert versions.in_range(_core.BUILT_AGAINST["jaxlib"])


def test_unsupported_jax_is_refused_at_import_with_the_range():
  result = run_python("""
      import jax, jaxlib
      jax.__version__ = jaxlib.__version__ = "0.13.0"
      try:
        import jax_mosaic_ffi
      except ImportError as e:
        print("REFUSED:", e)
      """)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "REFUSED:" in result.stdout and versions.SUPPORTED in result.stdout, result.stdout


def test_skipping_the_version_check_warns_and_turns_record_handlers_off():
  result = run_python("""
      import warnings
      import jax, jaxlib
      jax.__version__ = jaxlib.__version__ = "0.13.0"
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import jax_mosaic_ffi
      print([str(w.message) for w in caught if "0.13.0" in str(w.message)])
      print("RECORD OFF:", jax_mosaic_ffi.call.registration._RECORD_UNSUPPORTED is not None)
      """, {versions.SKIP_CHECK_ENV: "1"})
  assert result.returncode == 0, result.stderr[-3000:]
  assert "continuing because" in result.stdout and "RECORD OFF: True" in result.stdout, result.stdout


def test_bootstrap_accepts_the_running_ffi_api_version_and_records_nothing_unproven():
  # The bootstrap needs no GPU: run it on the CPU backend. It checks the FFI API version the running jaxlib reports
  # against the built and the newest checked ones, then registers the record probe (for CUDA, which nothing runs
  # here) through that jaxlib's XLA_FFI_Api. No probe program ran, so no record layout is proven: the kernel targets
  # must not get record handlers.
  result = run_python("""
      import json
      import jax, numpy as np
      import jax_mosaic_ffi as jmf
      from jax_mosaic_ffi import _core
      jax.ffi.register_ffi_type(jmf.registration.STATE_TYPE_NAME, _core.state_type(), platform="cpu")
      jax.ffi.register_ffi_target("jmf_test_bootstrap", {"execute": _core.bootstrap_handler()},
                                  platform="cpu", api_version=1)
      call = jax.ffi.ffi_call("jmf_test_bootstrap", jax.ShapeDtypeStruct((1,), np.int32))
      with jax.default_device(jax.devices("cpu")[0]):
        jax.jit(call)().block_until_ready()
      bootstrapped = _core.record_registration()
      print("BOOTSTRAP:", json.dumps({"bootstrapped": bootstrapped, "registered": _core.register_record_targets(),
                                      "after": _core.record_registration()}))
      """)
  assert result.returncode == 0, result.stderr[-3000:]
  (line,) = [line for line in result.stdout.splitlines() if line.startswith("BOOTSTRAP: ")]
  seen = json.loads(line[len("BOOTSTRAP: "):])
  assert seen["bootstrapped"]["attempted"] and seen["bootstrapped"]["probe_registered"], seen
  assert seen["bootstrapped"]["message"] == "the record probe is registered", seen
  assert not seen["bootstrapped"]["probe_seen"] and seen["bootstrapped"]["record_version"] is None, seen
  assert seen["registered"] is False and not seen["after"]["registered"], seen
  assert seen["after"]["message"] == "no record layout was proven", seen


@pytest.mark.skipif(gpu_info.has_gpu(), reason="checks the machine without a GPU")
def test_no_gpu_is_said_once_and_the_rest_works(tmp_path):
  result = run_python("""
      import warnings
      warnings.simplefilter("always")
      import jax, jax.numpy as jnp, numpy as np
      import jax_mosaic_ffi as jmf
      kernel = jmf.cuda_kernel('extern "C" __global__ void k(float* y) {}', "k")
      kernel = jmf.cuda_kernel('extern "C" __global__ void k2(float* y) {}', "k2")
      f = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((8,), jnp.float32), grid=1, block=8)
      text = jax.jit(f).trace().lower(lowering_platforms=("cuda",)).as_text()
      print("LOWERED:", "jax_mosaic_ffi_launch_v1" in text)
      """, {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")})
  assert result.returncode == 0, result.stderr[-3000:]
  assert "LOWERED: True" in result.stdout
  notes = [line for line in result.stderr.splitlines() if "NoGpuWarning" in line]
  assert len(notes) == 1, result.stderr
  assert "cannot run on this machine" in notes[0] and "Traceback" not in result.stderr


# A CuTe DSL call first asks the driver about the GPU inside jax's trace (its compile): the warning still names the
# user's line, not jax's internals.
@pytest.mark.skipif(gpu_info.has_gpu(), reason="checks the machine without a GPU")
@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL (the cute extra)")
def test_no_gpu_is_said_at_the_users_line_when_first_asked_inside_a_trace(tmp_path):
  model = tmp_path / "model.py"
  model.write_text("import jax, jax.numpy as jnp\nimport jax_mosaic_ffi as jmf\nimport cute_kernels\n"
                   "x = jax.ShapeDtypeStruct((4096,), jnp.float32)\n"
                   "f = jmf.cute_call(cute_kernels.add_one, output_shape_dtype=x)\n"
                   'lowered = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))\n')
  result = run_python(f"""
      import sys
      sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
      exec(compile(open({str(model)!r}).read(), {str(model)!r}, "exec"), {{"__name__": "__main__"}})
      """, {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")})
  assert result.returncode == 0, result.stderr[-3000:]
  notes = [line for line in result.stderr.splitlines() if "NoGpuWarning" in line]
  assert len(notes) == 1 and notes[0].startswith(f"{model}:6: NoGpuWarning: "), result.stderr


def _wheel() -> pathlib.Path:
  """The release wheel of these sources: $JMF_WHEEL, else scripts/build_wheel.sh's (built once per source hash)."""
  if os.environ.get("JMF_WHEEL"):
    return pathlib.Path(os.environ["JMF_WHEEL"])
  result = subprocess.run(["bash", str(REPO / "scripts" / "build_wheel.sh")], capture_output=True, text=True,
                          env=dict(os.environ, JMF_PYTHON=sys.executable), timeout=fresh_process.HANG_GUARD_S)
  assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
  return pathlib.Path(result.stdout.split()[-1])


def _link_or_copy(src, dst):
  try:
    os.link(src, dst)
  except OSError:
    shutil.copy2(src, dst)


def _python313():
  for candidate in ("/root/.pyenv/versions/3.13.0/bin/python", "python3.13"):
    found = shutil.which(candidate)
    if found and run_python("import sys; assert sys.version_info[:2] == (3, 13)", python=found).returncode == 0:
      return found
  return None


@pytest.fixture(scope="module")
def wheel() -> pathlib.Path:
  return _wheel()


def _wheel_tag(wheel: pathlib.Path) -> str:
  return "-".join(wheel.stem.split("-")[2:])


# What a manylinux_2_28 system is sure to have (PEP 600, auditwheel's policy): the extension links nothing else.
MANYLINUX_LIBRARIES = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                       "ld-linux-x86-64.so.2"}


@pytest.mark.slow
@pytest.mark.skipif(not PYPROJECT.exists(), reason="needs the source checkout")
def test_wheel_is_manylinux_2_28_abi3_and_needs_no_more_than_that(wheel):
  # One wheel for every CPython >= 3.12 on every Linux with glibc >= 2.28.
  assert _wheel_tag(wheel) == "cp312-abi3-manylinux_2_28_x86_64", wheel.name
  with zipfile.ZipFile(wheel) as z:
    info = z.read(f"jax_mosaic_ffi-{jmf.__version__}.dist-info/WHEEL").decode()
    extension = z.read(EXTENSION)
  assert "Tag: cp312-abi3-manylinux_2_28_x86_64" in info and "Root-Is-Purelib: false" in info, info
  libraries, versions = elf_info.needs(extension)
  # No C++ runtime of the build machine (libc++ is linked in), and not the CUDA driver: the user's
  # driver provides libcuda.so.1, which we dlopen (csrc/driver/cuda_driver.cc).
  assert set(libraries) <= MANYLINUX_LIBRARIES, libraries
  assert all(not lib.startswith(("libstdc++", "libgcc_s", "libcuda")) for lib in versions), versions
  newest_glibc = max((elf_info.newest(v, "GLIBC") for v in versions.values()), default=())
  assert () < newest_glibc <= (2, 28), versions


def _expected_wheel_files() -> set[str]:
  """The package as the checkout has it (Python files, device headers), its extension, and the metadata."""
  package = REPO / "jax_mosaic_ffi"
  files = {str(p.relative_to(REPO)) for p in package.rglob("*")
           if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".so", ".pyc")}
  dist_info = f"jax_mosaic_ffi-{jmf.__version__}.dist-info"
  return files | {EXTENSION} | {
      f"{dist_info}/{name}" for name in ("METADATA", "WHEEL", "RECORD", "licenses/LICENSE")}


@pytest.mark.slow
@pytest.mark.skipif(not PYPROJECT.exists(), reason="needs the source checkout")
def test_wheel_holds_the_package_its_device_headers_and_nothing_else(wheel):
  with zipfile.ZipFile(wheel) as z:
    names = {n for n in z.namelist() if not n.endswith("/")}
  expected = _expected_wheel_files()
  assert not expected - names, f"missing from the wheel: {sorted(expected - names)}"
  assert not names - expected, f"in the wheel but not in the package: {sorted(names - expected)}"
  # What NVRTC compiles kernels against at run time (cuda/nvrtc/): our device headers and the compat headers.
  assert "jax_mosaic_ffi/include/jax_mosaic_ffi/collective.cuh" in names
  assert "jax_mosaic_ffi/include/jmf_compat/jmf_compat_prelude.h" in names
  assert wheel.stat().st_size < 4 << 20, f"{wheel.stat().st_size} bytes: what made the wheel this large?"


@pytest.mark.slow
@pytest.mark.skipif(not PYPROJECT.exists(), reason="needs the source checkout")
def test_wheel_metadata_is_what_an_index_shows(wheel):
  with zipfile.ZipFile(wheel) as z:
    metadata = z.read(f"jax_mosaic_ffi-{jmf.__version__}.dist-info/METADATA").decode()
  headers = metadata.split("\n\n", 1)[0].splitlines()
  assert f"Version: {jmf.__version__}" in headers
  assert "License-Expression: Apache-2.0" in headers and "License-File: LICENSE" in headers
  assert "Requires-Python: >=3.12" in headers
  for classifier in ("Environment :: GPU :: NVIDIA CUDA :: 13", "Operating System :: POSIX :: Linux",
                     "Programming Language :: Python :: 3.12", "Programming Language :: Python :: 3.13"):
    assert f"Classifier: {classifier}" in headers
  assert {"Provides-Extra: triton", "Provides-Extra: test", "Provides-Extra: cuda"} <= set(headers)
  assert "Description-Content-Type: text/markdown" in headers
  # The README is the description: its first line and its install command.
  assert "# jax_mosaic_ffi" in metadata and "pip install jax_mosaic_ffi-" in metadata


def test_the_version_is_set_in_one_place():
  version_file = pathlib.Path(jmf.__file__).parent / "_version.py"
  assert re.fullmatch(r'__version__ = "(\d+\.\d+\.\d+)"', version_file.read_text().splitlines()[-1])
  # What the installed metadata says is what the module says (pyproject reads _version.py).
  assert importlib.metadata.version("jax_mosaic_ffi") == jmf.__version__
  if PYPROJECT.exists():
    project = tomllib.loads(PYPROJECT.read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["scikit-build"]["metadata"]["version"]["input"] == "jax_mosaic_ffi/_version.py"
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## {jmf.__version__}" in changelog or "## Unreleased" in changelog


@pytest.mark.slow
@pytest.mark.skipif(not PYPROJECT.exists(), reason="needs the source checkout")
def test_wheel_installs_into_a_fresh_venv_and_passes_the_smoke_tests(wheel, tmp_path):
  with zipfile.ZipFile(wheel) as z:
    z.extract(EXTENSION, tmp_path / "so")

  # The extension loads under another Python than the one that built it.
  python313 = _python313()
  if python313 is not None:
    result = run_python(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("_core", {str(tmp_path / "so" / EXTENSION)!r})
        core = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(core)
        print(sys.version_info[:2], core.target_names())
        """, python=python313)
    assert result.returncode == 0 and "(3, 13)" in result.stdout, result.stderr[-3000:]

  # A fresh venv holding the wheel and, as hard links (copies across file
  # systems), the dependencies this environment already resolved: installing
  # them again from pip's cache would take a minute for 800 MB of jaxlib and
  # CUDA wheels. `pip check` then holds the wheel's requirements against them.
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=fresh_process.HANG_GUARD_S)
  ours = ("jax_mosaic_ffi", "_editable_skbc_jax_mosaic_ffi", "__editable__")
  site = pathlib.Path(sysconfig.get_paths()["purelib"])
  new_site = pathlib.Path(run_python("import sysconfig; print(sysconfig.get_paths()['purelib'])",
                                     python=str(venv / "bin" / "python")).stdout.strip())
  for entry in site.iterdir():
    if entry.name.startswith(ours):
      continue
    if entry.is_dir():
      shutil.copytree(entry, new_site / entry.name, symlinks=True, copy_function=_link_or_copy)
    else:
      _link_or_copy(entry, new_site / entry.name)
  python = str(venv / "bin" / "python")
  for args in (["install", "-q", "--no-deps", str(wheel)], ["check"]):
    result = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True,
                            timeout=fresh_process.HANG_GUARD_S)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]

  # Imported from the venv, not from this checkout.
  result = run_python("import jax_mosaic_ffi as m; print(m.__file__); print(m._core.__file__)",
                      python=python, cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert all(line.startswith(str(venv)) for line in result.stdout.split()), result.stdout

  # importlib mode and pythonpath = tests (pyproject): the checkout's package
  # directory is never on sys.path, so the tests see the installed copy.
  tests = [str(REPO / "tests" / name) for name in SMOKE_TESTS]
  result = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                           "--rootdir", str(REPO), *tests], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, JAX_MOSAIC_FFI_CACHE_DIR=str(tmp_path / "cache"),
                                   JMF_EXPECT_INSTALLED_UNDER=str(venv)), timeout=fresh_process.HANG_GUARD_S)
  assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
  assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-3000:]
