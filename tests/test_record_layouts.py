"""The record stage calls only a command-buffer record extension whose layout we declare and checked.

jaxlib 0.12.1 changed the record extension's ABI (record 0.2 -> 0.5, a new create_launch) under an unchanged FFI
API version, so the decision is made from the running extension's own (major, minor), by an exact list
(csrc/ffi/record_layouts.h, exposed as core.record_layout_for), never by jaxlib's version or a ">=". Here, without a
GPU: the decision for every jaxlib release in the supported range (read from the checked manifest of their headers),
the fallback for every version nobody declared, and a compile of our declarations against each release's real
headers (tests/ffi_layouts/check_layouts.cc), which must fail when a declaration is wrong. On the GPU: the probe reads
the running extension and the kernels are recorded through the layout it proved.
"""

import os
import shutil
import subprocess
import warnings

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.call import registration

import fresh_process
import ffi_headers_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(REPO, "tests", "ffi_layouts", "check_layouts.cc")
CSRC = os.path.join(REPO, "csrc")
ffi_headers = ffi_headers_script.load()
CHECKED = ffi_headers.load()  # the manifest: each checked release's versions and the layout of ours it uses

# What each release's record extension is and which layout it needs: facts read from the wheels' headers
# (docs/compatibility.md), stated here too so that a manifest edited to agree with a wrong build cannot pass.
KNOWN = {"0.11.2": ((0, 1), "record-0.1"), "0.12.0.1": ((0, 2), "record-0.1"), "0.12.1": ((0, 5), "record-0.5")}


def test_each_supported_jaxlib_gets_the_layout_its_record_version_declares():
  versions = ffi_headers.record_versions()
  layouts = ffi_headers.record_layouts()
  assert set(KNOWN) <= set(versions), sorted(versions)
  for release, (version, layout) in KNOWN.items():
    assert versions[release] == version, release
    assert layouts[release] == layout, release
  for release, version in versions.items():
    assert core.record_layout_for(*version) == layouts[release], (release, version)
  # The drift check's names for the layouts are the C++ core's own.
  for version, layout in ffi_headers.RECORD_LAYOUTS.items():
    assert core.record_layout_for(*version) == layout, version


@pytest.mark.parametrize("version", [(0, 0), (0, 3), (0, 4), (0, 6), (0, 99), (1, 0), (1, 5), (-1, 5), (0, -1)])
def test_a_record_version_nobody_declared_gets_no_record_handlers(version):
  assert core.record_layout_for(*version) is None
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    layout, reason = registration.decide_record_layout(version)
  assert layout is None
  assert f"record extension is {version[0]}.{version[1]}" in reason and "does not declare" in reason
  (warning,) = [w for w in seen if issubclass(w.category, jmf.StreamCaptureWarning)]
  assert "stream capture" in str(warning.message) and f"{version[0]}.{version[1]}" in str(warning.message)


def test_a_declared_version_decides_without_a_warning():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert registration.decide_record_layout((0, 5)) == ("record-0.5", None)
    assert registration.decide_record_layout((0, 1)) == ("record-0.1", None)


def compile_check(include_root, csrc=CSRC):
  compiler = shutil.which("g++") or shutil.which("c++")
  if compiler is None or os.environ.get("JMF_WITHOUT_COMPILER"):
    pytest.skip("no C++ compiler here to check the layouts with")
  return subprocess.run([compiler, "-std=c++20", "-fsyntax-only", "-I", str(include_root), "-I", str(csrc), CHECK],
                        capture_output=True, text=True)


def headers_of(release, tmp_path_factory):
  """The folder to put on the include path for `release`'s xla/ffi/api/ headers."""
  try:
    api = ffi_headers.fetch(release)
  except Exception as e:  # no index reachable: only CI must have it
    if os.environ.get("CI"):
      raise
    pytest.skip(f"jaxlib {release}'s wheel could not be fetched here: {e}")
  root = tmp_path_factory.mktemp(f"headers-{release}")
  (root / "xla" / "ffi").mkdir(parents=True)
  (root / "xla" / "ffi" / "api").symlink_to(api, target_is_directory=True)
  return root


@pytest.mark.slow
@pytest.mark.parametrize("release", sorted(CHECKED))
def test_our_layouts_are_each_releases_declarations(release, tmp_path_factory):
  done = compile_check(headers_of(release, tmp_path_factory))
  assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_check_fails_on_a_wrong_declaration(tmp_path, tmp_path_factory):
  # Record 0.5's launch parameters with two members swapped, and its create_launch with a wider count.
  root = headers_of("0.12.1", tmp_path_factory)
  wrong = tmp_path / "csrc"
  (wrong / "ffi").mkdir(parents=True)
  text = open(os.path.join(CSRC, "ffi", "record_layouts.h")).read()
  swapped = text.replace("  uint32_t shared_mem_bytes;\n  int32_t uses_pdl;\n  const KernelArgs* args;",
                         "  int32_t uses_pdl;\n  uint32_t shared_mem_bytes;\n  const KernelArgs* args;")
  v0_5_launch = ("const Command* const* dependencies, {} num_dependencies,\n" + " " * 42 +
                 "const Command** out);\nusing Api = ApiWith<CreateLaunchFn>;\n}}  // namespace v0_5")
  widened = swapped.replace(v0_5_launch.format("uint32_t"), v0_5_launch.format("int64_t"))
  assert swapped != text and widened != swapped  # the edits took
  (wrong / "ffi" / "record_layouts.h").write_text(widened)
  done = compile_check(root, csrc=wrong)
  assert done.returncode != 0
  for member in ("shared_mem_bytes", "uses_pdl", "create_launch"):
    assert f"static assertion failed: {member}" in done.stderr, done.stderr
  # And a record version with no layout stops the check by name.
  unknown = tmp_path / "unknown"
  (unknown / "xla" / "ffi" / "api").mkdir(parents=True)
  for name in os.listdir(root / "xla" / "ffi" / "api"):
    text = (root / "xla" / "ffi" / "api" / name).read_text()
    minor = "#define XLA_FFI_Extension_Record_MinorVersion "
    (unknown / "xla" / "ffi" / "api" / name).write_text(text.replace(minor + "5", minor + "6"))
  done = compile_check(unknown)
  assert done.returncode != 0 and "has no layout in csrc/ffi/record_layouts.h" in done.stderr, done.stderr


PROBED = '''
    import json
    import jax, jaxlib
    import jax_mosaic_ffi as jmf
    from jax_mosaic_ffi.base.native import core
    jmf.register()
    print(json.dumps({"status": jmf.registration.status(), "core": core.record_registration(),
                      "jaxlib": jaxlib.__version__}))
'''


@pytest.mark.gpu
def test_the_probe_reads_the_running_record_extension_and_proves_its_layout(tmp_path):
  result = fresh_process.run(PROBED, cwd=tmp_path, env={"XLA_FLAGS": ""}).result
  status, seen = result["status"], result["core"]
  version = ffi_headers.record_versions().get(result["jaxlib"])
  assert seen["probe_seen"] and tuple(seen["record_version"]) == version, result
  assert status["record"] and status["record_extension"] == f"{version[0]}.{version[1]}", result
  assert status["record_layout"] == ffi_headers.record_layouts()[result["jaxlib"]], result


@pytest.mark.gpu
def test_without_command_buffers_the_probe_sees_no_record_stage_and_nothing_is_recorded(tmp_path):
  result = fresh_process.run(PROBED, cwd=tmp_path, env={"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}).result
  assert not result["status"]["record"] and "reached no record stage" in result["status"]["message"], result
  assert result["status"]["done"]

