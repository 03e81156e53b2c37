"""Header drift (scripts/ffi_headers.py): the XLA FFI declarations csrc/ depends on, per jaxlib release, against
the checked manifest csrc/ffi/checked_ffi_headers.json.

The unit tests write header folders of their own, shaped like jaxlib's (a record extension in record_c_api.h,
the base types in c_api.h), and change one thing at a time; the slow test runs the real check over the network.
"""

import importlib.util
import io
import os
import pathlib
import subprocess
import sys

import pytest

import fresh_process

REPO = pathlib.Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("ffi_headers", REPO / "scripts" / "ffi_headers.py")
ffi_headers = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ffi_headers)

C_API = """\
/* Copyright: the synthetic headers of tests/test_ffi_headers.py */
#ifndef C_API_H_
#define C_API_H_
#define XLA_FFI_DEFINE_STRUCT_TRAITS(sname, last_field) \\
  typedef struct sname sname;                           \\
  enum { sname##_STRUCT_SIZE = 0 }
#ifdef __cplusplus
extern "C" {
#endif
typedef struct XLA_FFI_ExtensionId {
  int64_t extension_type;  // unique
  int32_t major_version;
  int32_t minor_version;
} XLA_FFI_ExtensionId;
XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_ExtensionId, minor_version);
typedef struct XLA_FFI_Extension XLA_FFI_Extension;
struct XLA_FFI_Extension {
  size_t struct_size;
  XLA_FFI_ExtensionId id;
  const XLA_FFI_Extension* next;
};
XLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Extension, next);
#define XLA_FFI_API_MAJOR 0
#define XLA_FFI_API_MINOR 5
#ifdef __cplusplus
}
#endif
#endif
"""

RECORD_C_API = """\
#include "c_api.h"
#define XLA_FFI_Extension_Record_MajorVersion 0
#define XLA_FFI_Extension_Record_MinorVersion {minor}
typedef struct XLA_FFI_Command XLA_FFI_Command;
typedef struct XLA_FFI_LaunchDims {{
  XLA_FFI_Dim3 grid;
  XLA_FFI_Dim3 block;{cluster}
}} XLA_FFI_LaunchDims;
typedef struct XLA_FFI_RecordApi {{
  XLA_FFI_Error* (*create_launch)(
      XLA_FFI_RecordContext* ctx,
      {launch_params}
      const XLA_FFI_Command** out_command  //
  );
  XLA_FFI_Error* (*request_stream_capture)(XLA_FFI_RecordContext* ctx);
}} XLA_FFI_RecordApi;
"""

OLD_LAUNCH = "const char* kernel_name, XLA_FFI_LaunchDims launch_dims, const XLA_FFI_KernelArgs* args,"
NEW_LAUNCH = "const XLA_FFI_RecordKernel* kernel, const XLA_FFI_KernelLaunchParams* launch_params,"


def headers(folder: pathlib.Path, *, minor: int = 2, launch_params: str = OLD_LAUNCH, cluster: bool = False,
            c_api: str = C_API) -> pathlib.Path:
  folder.mkdir(parents=True)
  (folder / "c_api.h").write_text(c_api)
  cluster_member = "\n  XLA_FFI_Dim3 cluster;" if cluster else ""
  (folder / "record_c_api.h").write_text(RECORD_C_API.format(minor=minor, launch_params=launch_params,
                                                             cluster=cluster_member))
  return folder


def checked(tmp_path, folders: dict[str, pathlib.Path]) -> dict[str, dict]:
  """A manifest written from these folders (release -> headers) and read back, as the check reads it."""
  manifest = tmp_path / "manifest.json"
  ffi_headers.save({release: ffi_headers.describe(ffi_headers.declarations(folder))
                    for release, folder in folders.items()}, manifest)
  return ffi_headers.load(manifest)


def drift(manifest: dict, release: str, folder: pathlib.Path) -> str | None:
  return ffi_headers.drift(release, ffi_headers.describe(ffi_headers.declarations(folder)), manifest)


def test_declarations_read_macros_definitions_traits_and_absence(tmp_path):
  decls = ffi_headers.declarations(headers(tmp_path / "h"))
  assert decls["XLA_FFI_API_MINOR"] == "#define XLA_FFI_API_MINOR 5"
  assert decls["XLA_FFI_Extension_Record_MinorVersion"] == "#define XLA_FFI_Extension_Record_MinorVersion 2"
  assert decls["XLA_FFI_Extension"] == (
      "struct XLA_FFI_Extension {\n  size_t struct_size;\n  XLA_FFI_ExtensionId id;\n"
      "  const XLA_FFI_Extension* next;\n};\nXLA_FFI_DEFINE_STRUCT_TRAITS(XLA_FFI_Extension, next);")
  assert "unique" not in decls["XLA_FFI_ExtensionId"]  # comments are not part of a declaration
  assert "      const char* kernel_name,\n" in decls["XLA_FFI_RecordApi"]
  assert decls["XLA_FFI_RecordKernel"] == ffi_headers.ABSENT
  entry = ffi_headers.describe(decls)
  assert (entry["ffi_api"], entry["record_extension"], entry["record_layout"]) == ([0, 5], [0, 2], "record-0.1")


def test_comments_and_whitespace_do_not_count(tmp_path):
  plain = ffi_headers.declarations(headers(tmp_path / "plain"))
  respaced = C_API.replace("  int32_t major_version;", "\tint32_t   major_version ; /* which */") \
                  .replace("const XLA_FFI_Extension* next;", "const XLA_FFI_Extension *next; // the chain")
  assert ffi_headers.declarations(headers(tmp_path / "respaced", c_api=respaced)) == plain


def test_a_changed_create_launch_signature_is_drift(tmp_path):
  manifest = checked(tmp_path, {"0.12.0": headers(tmp_path / "old")})
  assert drift(manifest, "0.12.0", tmp_path / "old") is None
  message = drift(manifest, "0.12.0", headers(tmp_path / "new", launch_params=NEW_LAUNCH))
  assert "jaxlib 0.12.0's FFI headers differ from the checked manifest" in message
  assert "--- manifest 0.12.0: XLA_FFI_RecordApi\n+++ headers 0.12.0: XLA_FFI_RecordApi\n" in message
  assert ("\n-      const char* kernel_name,\n-      XLA_FFI_LaunchDims launch_dims,\n"
          "-      const XLA_FFI_KernelArgs* args,\n+      const XLA_FFI_RecordKernel* kernel,\n"
          "+      const XLA_FFI_KernelLaunchParams* launch_params,\n") in message
  assert "check --update" in message and "csrc/ffi/" in message


def test_a_new_struct_member_is_drift(tmp_path):
  manifest = checked(tmp_path, {"0.12.0": headers(tmp_path / "old")})
  message = drift(manifest, "0.12.0", headers(tmp_path / "new", cluster=True))
  assert "\n+  XLA_FFI_Dim3 cluster;\n" in message
  assert "--- manifest 0.12.0: XLA_FFI_LaunchDims\n+++ headers 0.12.0: XLA_FFI_LaunchDims\n" in message


def test_a_bumped_minor_version_is_drift_with_no_layout_of_ours(tmp_path):
  manifest = checked(tmp_path, {"0.12.0": headers(tmp_path / "old")})
  message = drift(manifest, "0.12.0", headers(tmp_path / "new", minor=3))
  assert "\n-#define XLA_FFI_Extension_Record_MinorVersion 2\n+#define XLA_FFI_Extension_Record_MinorVersion 3\n" \
      in message
  assert ("\n-record_extension = [0, 2]\n-record_layout = record-0.1\n+record_extension = [0, 3]\n"
          "+record_layout = None\n") in message
  assert "Its record extension [0, 3] has no layout of ours in RECORD_LAYOUTS." in message


def test_a_release_missing_from_the_manifest_is_named_with_its_declarations(tmp_path):
  manifest = checked(tmp_path, {"0.12.0": headers(tmp_path / "old")})
  message = drift(manifest, "0.12.2", headers(tmp_path / "new"))
  assert "jaxlib 0.12.2 is in the supported range but its FFI headers were never checked" in message
  assert "(the manifest has 0.12.0)" in message and "== XLA_FFI_RecordApi" in message


def test_one_layout_name_for_two_declarations_is_refused(tmp_path):
  manifest = checked(tmp_path, {"0.12.0": headers(tmp_path / "a"), "0.12.1": headers(tmp_path / "b", cluster=True)})
  problems = ffi_headers.layout_problems(manifest)
  assert len(problems) == 1
  assert "jaxlib 0.12.1 and 0.12.0 both use layout record-0.1, but declare XLA_FFI_LaunchDims differently" \
      in problems[0]
  assert "+  XLA_FFI_Dim3 cluster;" in problems[0]


def test_check_and_update_over_cached_headers(tmp_path):
  """check() as CI runs it, over a cache the test filled (fetch downloads nothing for a release it holds)."""
  cache, manifest = tmp_path / "cache", tmp_path / "manifest.json"
  headers(cache / "0.12.0")
  assert ffi_headers.check(True, cache, manifest, ["0.12.0"], out=io.StringIO()) == 0
  report = io.StringIO()
  assert ffi_headers.check(False, cache, manifest, ["0.12.0"], out=report) == 0
  assert "jaxlib 0.12.0 match" in report.getvalue()
  headers(cache / "0.12.1", launch_params=NEW_LAUNCH)
  report = io.StringIO()
  assert ffi_headers.check(False, cache, manifest, ["0.12.0", "0.12.1"], out=report) == 1
  assert "jaxlib 0.12.1 is in the supported range but its FFI headers were never checked" in report.getvalue()
  # Record 0.2 with another create_launch cannot be written under record-0.1's name.
  report = io.StringIO()
  assert ffi_headers.check(True, cache, manifest, ["0.12.0", "0.12.1"], out=report) == 1
  assert "declare XLA_FFI_RecordApi differently" in report.getvalue()
  assert ffi_headers.record_versions(manifest) == {"0.12.0": (0, 2)}


def test_the_manifest_holds_every_tested_release_with_its_layout():
  from jax_mosaic_ffi.base import versions
  entries = ffi_headers.load()
  assert set(versions.TESTED) <= set(entries)
  assert ffi_headers.layout_problems(entries) == []
  record = ffi_headers.record_versions()
  assert record["0.11.2"] == (0, 1) and record["0.12.0.1"] == (0, 2) and record["0.12.1"] == (0, 5)
  assert {release: layout for release, layout in ffi_headers.record_layouts().items() if release in versions.TESTED} \
      == {"0.11.2": "record-0.1", "0.12.1": "record-0.5"}
  # What CI runs: the oldest release in range and the newest the manifest checked (the one pip picks).
  in_range = sorted((r for r in entries if versions.in_range(r)), key=versions.parse)
  assert versions.TESTED == (in_range[0], in_range[-1])


@pytest.mark.slow
def test_the_real_headers_match_the_manifest(tmp_path):
  """Every jaxlib release in range that pip sees, downloaded into this test's folder and compared."""
  try:
    releases = ffi_headers.releases_in_range()
  except ffi_headers.IndexUnavailable as error:
    if os.environ.get("CI"):
      pytest.fail(f"CI must check the FFI headers, but pip cannot reach the index: {error}")
    pytest.skip(f"pip cannot reach an index with jaxlib: {error}")
  assert "0.12.1" in releases and "0.11.2" in releases
  result = subprocess.run([sys.executable, str(REPO / "scripts" / "ffi_headers.py"), "check", "--cache",
                           str(tmp_path)], capture_output=True, text=True, timeout=fresh_process.HANG_GUARD_S)
  if result.returncode == 2 and not os.environ.get("CI"):  # the index listed jaxlib, then a download failed
    pytest.skip(f"pip could not download a jaxlib wheel: {result.stderr[-800:]}")
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"jaxlib {', '.join(releases)} match" in result.stdout


def test_bad_input_is_an_error_naming_what_to_change(tmp_path):
  script = [sys.executable, str(REPO / "scripts" / "ffi_headers.py"), "check", "--cache", str(tmp_path)]
  wrong = subprocess.run(script + ["--releases", "../0.12.1"], capture_output=True, text=True,
                         timeout=fresh_process.HANG_GUARD_S)
  assert wrong.returncode == 2 and "'../0.12.1' is not a jaxlib release number (such as 0.12.1)" in wrong.stderr
  assert "Traceback" not in wrong.stderr and not any(tmp_path.iterdir())
  broken = tmp_path / "manifest.json"
  broken.write_text('{"releases": {"0.12.1": {}}}')
  with pytest.raises(ValueError, match="is not a manifest this script wrote .*restore it from git"):
    ffi_headers.load(broken)
