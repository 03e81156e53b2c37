"""scripts/gpu_check.sh's parts (scripts/test_parts.py): whole files, every selected test in exactly one part; its
carried packages (scripts/carried.sh); its benchmarks step (scripts/benchmarks_step.sh), whose failure fails it."""

import os
import pathlib
import subprocess
import sys

import pytest

from jax_mosaic_ffi.base import gpu_info

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "test_parts.py")


def parts_of(ids, n):
  text = "\n".join(ids) + "\n"
  out = []
  for k in range(1, n + 1):
    done = subprocess.run([sys.executable, SCRIPT, str(k), str(n)], input=text, capture_output=True, text=True,
                          check=True)
    out.append([line for line in done.stdout.splitlines() if line])
  return out


def test_the_parts_cover_every_file_once_and_balance_the_tests():
  # What pytest --collect-only -q prints: node ids, then a summary line.
  counts = {"tests/test_a.py": 30, "tests/test_b.py": 25, "tests/test_c.py": 10, "tests/test_d.py": 9,
            "tests/test_e.py": 8, "tests/test_f.py": 1}
  ids = [f"{name}::test_{k}[x]" for name, n in counts.items() for k in range(n)] + ["83 tests collected in 1.2s"]
  parts = parts_of(ids, 3)
  files = [f for part in parts for f in part]
  assert sorted(files) == sorted(counts) and len(files) == len(set(files)), parts
  loads = [sum(counts[f] for f in part) for part in parts]
  assert max(loads) - min(loads) <= 10, (parts, loads)
  assert parts_of(list(reversed(ids)), 3) == parts  # the collection's order does not matter
  assert parts_of(ids, 8)[7] == []  # more parts than files: some are empty, none fails


@pytest.mark.parametrize("args", [["0", "3"], ["4", "3"], ["x", "3"], []])
def test_a_part_that_does_not_exist_is_refused(args):
  done = subprocess.run([sys.executable, SCRIPT, *args], input="", capture_output=True, text=True)
  assert done.returncode == 2 and ("does not exist" in done.stderr or "usage" in done.stderr), done.stderr


CARRIED = os.path.join(os.path.dirname(SCRIPT), "carried.sh")


def make_bundle(tmp_path, parts=2):
  """A bundle as scripts/carry_pack.sh makes one: a site folder, xz'd, cut in parts, with its sha256."""
  site = tmp_path / "site"
  (site / "fakepkg" / "extra").mkdir(parents=True)
  (site / "fakepkg" / "__init__.py").write_text("")
  (site / "fakepkg.pth").write_text(
      "import sys, os, fakepkg; sys.path.insert(0, os.path.join(fakepkg.__path__[0], 'extra'))\n")
  carry = tmp_path / "repo" / ".carry"
  carry.mkdir(parents=True)
  blob = subprocess.run(f"tar -C {site} -cf - . | xz -0", shell=True, capture_output=True, check=True).stdout
  size = -(-len(blob) // parts)
  for k in range(parts):
    (carry / f"fake.part-{k:02d}").write_bytes(blob[k * size:(k + 1) * size])
  digest = subprocess.run(["sha256sum"], input=blob, capture_output=True, check=True).stdout.split()[0]
  (carry / "fake.sha256").write_bytes(digest + b"\n")
  return tmp_path / "repo", carry


def carried(*commands, **env):
  script = f"source {CARRIED}; " + "; ".join(commands)
  return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                        env={**os.environ, "JMF_PYTHON": sys.executable, **env})


def test_carried_parts_are_stashed_then_unpacked_with_their_pth_paths(tmp_path):
  repo, _ = make_bundle(tmp_path)
  stash = tmp_path / "stash"
  done = carried(f"carried_stash {repo} {stash}", f"carried_path {stash} fake")
  assert done.returncode == 0, done.stderr
  *said, last = done.stdout.strip().splitlines()
  assert said == ["== stashed fake.part-00", "== stashed fake.part-01", "== stashed fake.sha256"], said
  paths = last.split(":")
  assert paths == [str(stash / "fake.site" / "fakepkg" / "extra"), str(stash / "fake.site")], paths
  again = carried(f"carried_path {stash} fake")  # unpacked once: the stamp holds
  assert again.returncode == 0 and "unpacking" not in again.stderr, again.stderr


def test_a_missing_or_foreign_part_is_named_not_unpacked(tmp_path):
  repo, carry = make_bundle(tmp_path, parts=3)
  (carry / "fake.part-01").unlink()  # a call that went to a cold machine: this part never arrived
  stash = tmp_path / "stash"
  done = carried(f"carried_stash {repo} {stash}", f"carried_path {stash} fake")
  assert done.returncode != 0 and "fake.part-00 fake.part-02" in done.stderr and "carry them again" in done.stderr
  assert not (stash / "fake.site").exists()
  nothing = carried(f"carried_path {stash} other")
  assert nothing.returncode != 0 and "no carried bundle other" in nothing.stderr


def test_carried_paths_are_installed_in_the_venv_ahead_of_its_other_pth_paths_and_removed(tmp_path):
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  site = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        capture_output=True, text=True, check=True).stdout.strip()
  machine, first, second = (tmp_path / name for name in ("machine", "first", "second"))
  for folder in (machine, first, second):
    folder.mkdir()
  (pathlib.Path(site) / "_jmf_parent_site.pth").write_text(f"{machine}\n")   # as setup_env.sh writes it, offline

  def path_of_venv():
    said = subprocess.run([venv / "bin" / "python", "-c", "import sys; print(*sys.path, sep=chr(10))"],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    return [p for p in said if p in (str(machine), str(first), str(second))]

  done = carried(f"carried_install {venv} {first}:{second}")
  assert done.returncode == 0, done.stderr
  assert path_of_venv() == [str(first), str(second), str(machine)]   # a carried jax or Triton wins over the machine's
  assert carried(f"carried_install {venv}").returncode == 0
  assert path_of_venv() == [str(machine)]
  assert carried(f"carried_install {venv}").returncode == 0   # nothing to remove


def test_a_carried_tileiras_is_linked_into_a_folder_for_path(tmp_path):
  """cuTile looks for tileiras on PATH where its lookup through nvidia.cu13 misses the carried one: the bundle's
  tileiras and tileirdisasm, linked into a folder of their own (nothing else of that bin/ goes on PATH)."""
  stash, carried_site, other = tmp_path / "stash", tmp_path / "cutile.site", tmp_path / "other.site"
  stash.mkdir()
  bin_ = carried_site / "nvidia" / "cu13" / "bin"
  bin_.mkdir(parents=True)
  for tool in ("tileiras", "tileirdisasm", "ptxas"):
    (bin_ / tool).write_text(f"#!/bin/sh\necho {tool} carried\n")
    (bin_ / tool).chmod(0o755)
  other.mkdir()
  done = carried(f"carried_tools {stash} {other}:{carried_site}")
  assert done.returncode == 0 and done.stdout.strip() == str(stash / "tools"), done.stderr
  assert sorted(p.name for p in (stash / "tools").iterdir()) == ["tileiras", "tileirdisasm"]
  found = subprocess.run(["bash", "-c", "tileiras"], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{stash / 'tools'}:{os.environ['PATH']}"})
  assert found.stdout.strip() == "tileiras carried"
  done = carried(f"carried_tools {stash} {other}")   # a bundle without tileiras: no folder, the last one gone
  assert done.returncode == 0 and done.stdout.strip() == "" and not (stash / "tools").exists()


STEP = os.path.join(os.path.dirname(SCRIPT), "benchmarks_step.sh")


def benchmarks_step(out, *command):
  # TMPDIR: what the command leaves in the temporary folder (the benchmarks' kernel cache) is the test's own.
  return subprocess.run(["bash", "-c", f'source {STEP}; benchmarks_step "$@"', "-", str(out), *command],
                        capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(SCRIPT)),
                        env={**os.environ, "TMPDIR": str(out)})


def test_a_benchmark_run_that_succeeds_passes_and_its_output_is_kept(tmp_path):
  done = benchmarks_step(tmp_path, "bash", "-c", "echo '| a table |'; echo 'raw results: here'")
  assert done.returncode == 0 and done.stderr == "", done.stderr
  assert "| a table |" in done.stdout and (tmp_path / "bench.log").read_text().endswith("raw results: here\n")


def test_a_benchmark_process_that_dies_fails_the_step_with_its_last_words(tmp_path):
  done = benchmarks_step(tmp_path, sys.executable, "-c", "print('half a table'); raise SystemExit('killed here')")
  assert done.returncode == 1, done
  assert done.stderr.strip() == (f"error: the benchmarks failed (exit 1): no run reported as failed; the output ends "
                                 f"with: killed here (all of it in {tmp_path}/bench.log)"), done.stderr
  assert "half a table" in (tmp_path / "bench.log").read_text()


def test_failed_benchmarks_fail_the_step_and_are_named_after_the_report_is_written(tmp_path):
  # The real benchmarks, which cannot measure without a GPU: the page and the raw results are written all the same.
  if gpu_info.has_gpu():
    pytest.skip("on a GPU the benchmark measures instead of failing")
  page = tmp_path / "page.md"
  done = benchmarks_step(tmp_path, sys.executable, "-m", "benchmarks", "--only", "sites", "--out", str(tmp_path),
                         "--doc", str(page))
  assert done.returncode == 1, done
  assert done.stderr.startswith("error: the benchmarks failed (exit 1): sites/main: run failed"), done.stderr
  assert done.stderr.rstrip().endswith(f"(all of it in {tmp_path}/bench.log)"), done.stderr
  assert (tmp_path / "benchmarks.json").is_file() and "sites/main" in page.read_text()
