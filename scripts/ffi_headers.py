#!/usr/bin/env python3
"""Header drift: the XLA FFI declarations we depend on, in every jaxlib release the supported range admits,
compared with the checked manifest csrc/ffi/checked_ffi_headers.json.

  python scripts/ffi_headers.py check            # exit 1, with the diff, when a release differs from the manifest
  python scripts/ffi_headers.py check --update   # after reading that diff (and porting csrc/ffi/): rewrite it
                                                 # (exit 2 where pip cannot list or download jaxlib)

A patch release may change the record extension's ABI under an unchanged FFI API version (jaxlib 0.12.1 did),
so no version number alone tells us that a release is safe: the declarations' text does. Each release's
`xla/ffi/api/*.h` come from its cp312 manylinux x86_64 wheel (pip download, cached under build/ffi-headers/).
Standard library and pip only; tests import it by path (tests/test_ffi_headers.py).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

REPO = pathlib.Path(__file__).resolve().parent.parent
MANIFEST = REPO / "csrc" / "ffi" / "checked_ffi_headers.json"
CACHE_DIR = REPO / "build" / "ffi-headers"
VERSIONS_PY = REPO / "jax_mosaic_ffi" / "base" / "versions.py"
WHEEL_TARGET = ("--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_27_x86_64")
HEADERS_IN_WHEEL = "jaxlib/include/xla/ffi/api/"

VERSION_MACROS = ("XLA_FFI_API_MAJOR", "XLA_FFI_API_MINOR", "XLA_FFI_Extension_Record_MajorVersion",
                  "XLA_FFI_Extension_Record_MinorVersion")
# The types csrc/ reads or hands to XLA. csrc/ does not decode the collectives extension, so its declarations
# are not among them (add them here the day it does).
TYPES = ("XLA_FFI_Extension", "XLA_FFI_ExtensionId", "XLA_FFI_Api_Version", "XLA_FFI_RecordAction",
         "XLA_FFI_RecordFrame", "XLA_FFI_RecordApi", "XLA_FFI_Record_Extension", "XLA_FFI_RecordKernel",
         "XLA_FFI_KernelLaunchParams", "XLA_FFI_KernelArg", "XLA_FFI_KernelArgs", "XLA_FFI_KernelArgType",
         "XLA_FFI_LaunchDims", "XLA_FFI_Dim3", "XLA_FFI_SourceFormat", "XLA_FFI_KernelSpec", "XLA_FFI_ByteSpan")
NAMES = VERSION_MACROS + TYPES
ABSENT = "(absent from this release)"

# The record-extension layouts csrc/ffi/ declares, by the (major, minor) the headers announce. Record 0.2 only
# added a SourceFormat value to 0.1, so both are called through one layout.
RECORD_LAYOUTS = {(0, 1): "record-0.1", (0, 2): "record-0.1", (0, 5): "record-0.5"}
# What a layout is made of: every release given one layout name must declare these identically.
LAYOUT_TYPES = ("XLA_FFI_RecordFrame", "XLA_FFI_RecordApi", "XLA_FFI_Record_Extension", "XLA_FFI_RecordAction",
                "XLA_FFI_RecordKernel", "XLA_FFI_KernelLaunchParams", "XLA_FFI_KernelArg", "XLA_FFI_KernelArgs",
                "XLA_FFI_KernelArgType", "XLA_FFI_LaunchDims", "XLA_FFI_Dim3", "XLA_FFI_ByteSpan")

WHAT_TO_DO = (
    "What to do: read the diff. If a layout csrc/ uses changed (XLA_FFI_RecordApi, a struct it passes), declare the "
    "new layout in csrc/ffi/, name it in RECORD_LAYOUTS (scripts/ffi_headers.py) and port the record stage to it; "
    "if only something we do not use changed, note it in docs/compatibility.md. Then rewrite the manifest with "
    "`python scripts/ffi_headers.py check --update` and commit it with the change.")


class IndexUnavailable(RuntimeError):
  """pip could not list or download jaxlib (no network, or no index that has it)."""


def parse_version(version: str) -> tuple[int, ...]:
  """The leading numeric components, as jax_mosaic_ffi.base.versions.parse reads them."""
  parts = []
  for piece in version.split("."):
    match = re.match(r"\d+", piece)
    if match is None:
      break
    parts.append(int(match.group()))
    if match.end() != len(piece):
      break
  return tuple(parts)


def supported_range(versions_py: pathlib.Path = VERSIONS_PY) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(OLDEST, BEFORE) of versions.py, read without importing it (it imports jax, which this script needs not)."""
  values = {}
  for node in ast.parse(versions_py.read_text()).body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
      if node.targets[0].id in ("OLDEST", "BEFORE"):
        values[node.targets[0].id] = ast.literal_eval(node.value)
  return values["OLDEST"], values["BEFORE"]


def pip(*args: str) -> subprocess.CompletedProcess:
  # Few retries: an unreachable index should say so in seconds, not after pip's default backoff.
  return subprocess.run([sys.executable, "-m", "pip", *args, "--retries", "1", "--timeout", "30",
                         "--disable-pip-version-check"], capture_output=True, text=True)


def releases_in_range(versions_py: pathlib.Path = VERSIONS_PY) -> list[str]:
  """Every jaxlib release pip can see (a cp312 manylinux x86_64 wheel) inside versions.py's range, oldest first."""
  result = pip("index", "versions", "jaxlib", *WHEEL_TARGET)
  listed = re.search(r"^Available versions:(.*)$", result.stdout, re.M)
  if result.returncode != 0 or listed is None:
    raise IndexUnavailable(f"`pip index versions jaxlib` failed: {(result.stderr or result.stdout).strip()[-800:]}")
  oldest, before = supported_range(versions_py)
  releases = [v.strip() for v in listed.group(1).split(",") if v.strip()]
  return sorted((v for v in releases if oldest <= parse_version(v) and parse_version(v)[:len(before)] < before),
                key=parse_version)


def fetch(release: str, cache_dir: pathlib.Path = CACHE_DIR) -> pathlib.Path:
  """The folder holding jaxlib `release`'s xla/ffi/api/*.h, downloaded and extracted into cache_dir once."""
  if not re.fullmatch(r"\d+(\.\d+)*", release):
    raise ValueError(f"{release!r} is not a jaxlib release number (such as 0.12.1)")
  api_dir = pathlib.Path(cache_dir) / release
  if api_dir.is_dir():
    return api_dir
  cache_dir = pathlib.Path(cache_dir)
  cache_dir.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f".{release}-") as scratch:
    result = pip("download", "-q", "--no-deps", *WHEEL_TARGET, f"jaxlib=={release}", "-d", scratch)
    wheels = list(pathlib.Path(scratch).glob(f"jaxlib-{release}-*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
      raise IndexUnavailable(f"pip could not download the jaxlib {release} wheel: {result.stderr.strip()[-800:]}")
    extracted = pathlib.Path(scratch) / "api"
    extracted.mkdir()
    with zipfile.ZipFile(wheels[0]) as wheel:
      for member in wheel.namelist():
        name = member[len(HEADERS_IN_WHEEL):]
        if member.startswith(HEADERS_IN_WHEEL) and name.endswith(".h") and "/" not in name:
          (extracted / name).write_bytes(wheel.read(member))
    if not any(extracted.glob("*.h")):
      raise RuntimeError(f"the jaxlib {release} wheel has no {HEADERS_IN_WHEEL}*.h: where did the headers go?")
    try:
      extracted.rename(api_dir)  # whole or not at all: a stopped run leaves no half folder behind
    except OSError:
      if not api_dir.is_dir():  # else another run put it there first
        raise
  return api_dir


def without_comments(source: str) -> str:
  strings_or_comments = r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/'
  return re.sub(strings_or_comments, lambda m: m.group() if m.group()[0] in "\"'" else " ", source, flags=re.S)


def layout(text: str) -> str:
  """One canonical spelling of a C declaration: token spacing fixed, a member per line, nesting indented."""
  tokens = re.findall(r"\w+|[^\s\w]", text)
  out, braces, parens = [], 0, 0
  for i, token in enumerate(tokens):
    following = tokens[i + 1] if i + 1 < len(tokens) else ""
    if token == "}":
      braces -= 1
      out.append("\n" + "  " * braces)
    out.append(token)
    braces += token == "{"
    parens += (token == "(") - (token == ")")
    word_next = re.match(r"\w", following) is not None
    if token in ("{", ";") or (token == "," and braces > 0):
      out.append("\n" + "  " * braces + "    " * parens)
    elif token == "=" or following == "=" or token == ",":
      out.append(" ")
    elif (re.match(r"\w", token) or token == "}") and (word_next or following == "{"):
      out.append(" ")
    elif token == "*" and (word_next or following == "(") and (i == 0 or tokens[i - 1] != "("):
      out.append(" ")
  return re.sub(r"[ \t]+\n", "\n", re.sub(r"\n\s*\n", "\n", "".join(out))).strip()


def matching_brace(code: str, start: int) -> int:
  depth = 0
  for i in range(start, len(code)):
    depth += (code[i] == "{") - (code[i] == "}")
    if depth == 0:
      return i
  raise ValueError("unbalanced braces")


def declarations(api_dir: pathlib.Path) -> dict[str, str]:
  """Each name of NAMES -> its declaration's canonical text in the headers of api_dir, or ABSENT.

  A type's text is its definition (`typedef struct X {...} X;`, `struct X {...};`, `typedef enum {...} X;`)
  followed by its XLA_FFI_DEFINE_STRUCT_TRAITS line (which fixes its struct_size); only forward-declared, it is
  the forward declaration. A macro's is its #define.
  """
  found: dict[str, list[str]] = {name: [] for name in NAMES}
  forward: dict[str, list[str]] = {name: [] for name in NAMES}
  traits: dict[str, list[str]] = {name: [] for name in NAMES}
  for header in sorted(pathlib.Path(api_dir).glob("*.h")):
    source = without_comments(header.read_text(errors="replace")).replace("\\\n", " ")
    code_lines = []
    for line in source.splitlines():
      define = re.match(r"\s*#\s*define\s+(\w+)\b(.*)", line)
      if define and define.group(1) in found:
        found[define.group(1)].append(f"#define {define.group(1)} {' '.join(define.group(2).split())}".strip())
      code_lines.append("" if line.lstrip().startswith("#") else line)
    code = "\n".join(code_lines)
    position = 0
    opening = re.compile(r"\b(typedef\s+)?(?:struct|enum|union)\s*(\w+)?\s*\{")
    while (match := opening.search(code, position)) is not None:
      end = matching_brace(code, match.end() - 1)
      tail = re.match(r"\s*(\w+)?\s*;", code[end + 1:]) if match.group(1) else re.match(r"\s*;", code[end + 1:])
      position = end + 1
      if tail is None:
        continue
      name = tail.group(1) if match.group(1) else match.group(2)
      if name in found:
        found[name].append(layout(code[match.start():end + 1 + tail.end()]))
      position = end + 1 + tail.end()
    for match in re.finditer(r"\btypedef\s+(?:struct|enum|union)\s+\w+\s+(\w+)\s*;", code):
      if match.group(1) in forward:
        forward[match.group(1)].append(layout(match.group()))
    for match in re.finditer(r"\bXLA_FFI_DEFINE_STRUCT_TRAITS\s*\(\s*(\w+)\s*,\s*\w+\s*\)\s*;", code):
      if match.group(1) in traits:
        traits[match.group(1)].append(layout(match.group()))
  return {name: "\n".join((found[name] or forward[name]) + traits[name]) or ABSENT for name in NAMES}


def macro_number(text: str) -> int | None:
  match = re.fullmatch(r"#define \w+ (\d+)", text)
  return int(match.group(1)) if match else None


def describe(decls: dict[str, str]) -> dict:
  """A manifest entry: the release's FFI API and record versions, the layout of ours for it, its declarations."""
  api = [macro_number(decls["XLA_FFI_API_MAJOR"]), macro_number(decls["XLA_FFI_API_MINOR"])]
  record = [macro_number(decls["XLA_FFI_Extension_Record_MajorVersion"]),
            macro_number(decls["XLA_FFI_Extension_Record_MinorVersion"])]
  return {"ffi_api": api, "record_extension": record, "record_layout": RECORD_LAYOUTS.get(tuple(record)),
          "declarations": dict(decls)}


def load(path: pathlib.Path = MANIFEST) -> dict[str, dict]:
  """The manifest's releases, each entry with its declarations' text filled in."""
  try:
    stored = json.loads(pathlib.Path(path).read_text())
    texts = {key: "\n".join(lines) for key, lines in stored["texts"].items()}
    return {release: {**entry, "declarations": {name: texts[key] if key else ABSENT
                                                 for name, key in entry["declarations"].items()}}
            for release, entry in stored["releases"].items()}
  except (KeyError, TypeError, AttributeError, ValueError) as error:
    raise ValueError(f"{path} is not a manifest this script wrote ({type(error).__name__}: {error}): restore it "
                     "from git, or rewrite it with `python scripts/ffi_headers.py check --update`") from None


def save(entries: dict[str, dict], path: pathlib.Path = MANIFEST) -> None:
  """Writes the manifest, each distinct declaration text stored once under its name and a hash of the text."""
  texts, releases = {}, {}
  for release in sorted(entries, key=parse_version):
    keys = {}
    for name, text in entries[release]["declarations"].items():
      if text == ABSENT:
        keys[name] = None
        continue
      keys[name] = f"{name}/{hashlib.sha256(text.encode()).hexdigest()[:10]}"
      texts[keys[name]] = text.split("\n")
    releases[release] = {**entries[release], "declarations": keys}
  stored = {"about": "The XLA FFI declarations csrc/ depends on, per jaxlib release, as checked by hand; written by "
                     "`python scripts/ffi_headers.py check --update`, compared by `... check` (CI). "
                     "docs/compatibility.md says what to do when they differ.",
            "releases": releases, "texts": dict(sorted(texts.items()))}
  pathlib.Path(path).write_text(json.dumps(stored, indent=1) + "\n")


def record_versions(path: pathlib.Path = MANIFEST) -> dict[str, tuple[int, int]]:
  """Each checked release -> the (major, minor) of its record extension."""
  return {release: tuple(entry["record_extension"]) for release, entry in load(path).items()}


def versions_lines(entry: dict) -> list[str]:
  return [f"ffi_api = {entry['ffi_api']}", f"record_extension = {entry['record_extension']}",
          f"record_layout = {entry['record_layout']}"]


def record_layouts(path: pathlib.Path = MANIFEST) -> dict[str, str]:
  """Each checked release -> the name of the record layout of ours that serves it (RECORD_LAYOUTS)."""
  return {release: entry["record_layout"] for release, entry in load(path).items()}


def rendered(entry: dict) -> list[str]:
  lines = versions_lines(entry)
  for name in sorted(entry["declarations"]):
    lines += ["", f"== {name}", *entry["declarations"][name].split("\n")]
  return lines


def diff(old: dict, new: dict, old_label: str, new_label: str) -> list[str]:
  """A unified diff of two entries: the versions, then each declaration that differs, under its name."""
  lines = []
  pairs = [("versions", versions_lines(old), versions_lines(new))] + [
      (name, old["declarations"].get(name, ABSENT).split("\n"), new["declarations"].get(name, ABSENT).split("\n"))
      for name in sorted(set(old["declarations"]) | set(new["declarations"]))]
  for name, before, after in pairs:
    if before != after:
      lines += list(difflib.unified_diff(before, after, f"{old_label}: {name}", f"{new_label}: {name}", lineterm=""))
  return lines


def drift(release: str, found: dict, checked: dict[str, dict]) -> str | None:
  """What is wrong with release's entry `found` (describe() of its headers) against the manifest's `checked`."""
  if release not in checked:
    known = ", ".join(sorted(checked, key=parse_version)) or "none"
    return (f"jaxlib {release} is in the supported range but its FFI headers were never checked (the manifest "
            f"has {known}). Its declarations:\n" + "\n".join(rendered(found)) + f"\n{WHAT_TO_DO}")
  if found == checked[release]:
    return None
  lines = diff(checked[release], found, f"manifest {release}", f"headers {release}")
  if found["record_layout"] is None:
    lines.append(f"Its record extension {found['record_extension']} has no layout of ours in RECORD_LAYOUTS.")
  return f"jaxlib {release}'s FFI headers differ from the checked manifest:\n" + "\n".join(lines) + f"\n{WHAT_TO_DO}"


def layout_problems(entries: dict[str, dict]) -> list[str]:
  """A release with no layout of ours, or two releases given one layout name that declare it differently."""
  problems, first = [], {}
  for release in sorted(entries, key=parse_version):
    entry = entries[release]
    if entry["record_layout"] is None:
      problems.append(f"jaxlib {release}'s record extension {entry['record_extension']} has no layout of ours: "
                      f"declare it in csrc/ffi/ and name it in RECORD_LAYOUTS (scripts/ffi_headers.py)")
      continue
    if entry["record_layout"] not in first:
      first[entry["record_layout"]] = release
      continue
    other = first[entry["record_layout"]]
    for name in LAYOUT_TYPES:
      if entry["declarations"][name] != entries[other]["declarations"][name]:
        lines = difflib.unified_diff(entries[other]["declarations"][name].split("\n"),
                                     entry["declarations"][name].split("\n"), f"jaxlib {other}", f"jaxlib {release}",
                                     lineterm="")
        problems.append(f"jaxlib {release} and {other} both use layout {entry['record_layout']}, but declare {name} "
                        f"differently: the layout needs a new name and its own declaration in csrc/ffi/\n" +
                        "\n".join(lines))
  return problems


def check(update: bool = False, cache_dir: pathlib.Path = CACHE_DIR, manifest: pathlib.Path = MANIFEST,
          releases: list[str] | None = None, out=sys.stdout) -> int:
  """0 when every release in range matches the manifest; 1 (each difference printed) when not."""
  releases = releases_in_range() if releases is None else releases
  checked = load(manifest) if pathlib.Path(manifest).exists() else {}
  found = {release: describe(declarations(fetch(release, cache_dir))) for release in releases}
  if update:
    entries = {**checked, **found}
    problems = layout_problems(entries)
    if not problems:
      save(entries, manifest)
      print(f"{manifest}: written for jaxlib {', '.join(releases)}", file=out)
      return 0
  else:
    problems = [p for p in (drift(r, found[r], checked) for r in releases) if p] + layout_problems(checked)
  for problem in problems:
    print(f"error: {problem}\n", file=out)
  if not problems:
    print(f"FFI headers: jaxlib {', '.join(releases)} match {manifest}", file=out)
  return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("command", choices=["check"])
  parser.add_argument("--update", action="store_true", help="rewrite the manifest from the headers")
  parser.add_argument("--cache", type=pathlib.Path, default=CACHE_DIR, help="where the headers are kept")
  parser.add_argument("--releases", help="comma-separated jaxlib releases instead of those pip sees in range")
  args = parser.parse_args(argv)
  releases = args.releases.split(",") if args.releases else None
  try:
    return check(args.update, args.cache, MANIFEST, releases)
  except IndexUnavailable as error:
    print(f"error: {error}\n(The check needs pip to reach an index that has jaxlib.)", file=sys.stderr)
    return 2
  except (ValueError, RuntimeError) as error:
    print(f"error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
