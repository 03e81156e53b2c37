"""`python -m jax_mosaic_ffi.pack check`: how each GPU of a fleet would be served by a pack, by the runtime's own
image rule, and whether each autotuned call has a winner per GPU model; and the pack CLI's handling of what a
manifest says (escaped, empty notes) and of the program it records."""

import json
import os
import subprocess
import sys

import pytest

from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.pack import __main__ as cli

import fresh_process

KEY = "{:064x}".format


def _entry(n: int, kernel: str, recorded_for: str, images: list[str], front_end: str = "CUDA C++ (NVRTC)",
           kind: str = "compile") -> pack_file.Entry:
  about = {"front_end": front_end, "kernel": kernel, "specialization": "options: none", "targets": [recorded_for],
           "recorded_for": [recorded_for], "toolchain": "nvrtc", "call_sites": ["model.py:1"]}
  return pack_file.Entry(KEY(n), kind, b"payload %d" % n, {**about, **({"images": images} if images else {})})


def _pack(tmp_path, entries, notes=None, name="model.jmfpack", created=None) -> str:
  path = str(tmp_path / name)
  pack_file.write(path, entries, created or {"jax_mosaic_ffi": "test"}, notes or {})
  return path


def _check(capsys, *args) -> tuple[int, str]:
  code = cli.main(["check", *args])
  return code, capsys.readouterr().out


def test_check_names_for_each_gpu_an_exact_cubin_a_family_one_ptx_or_nothing(tmp_path, capsys):
  path = _pack(tmp_path, [
      _entry(1, "k", "sm_90", ["cubin sm_90", "ptx sm_90"]),
      _entry(2, "k", "sm_100f", ["cubin sm_100f", "ptx sm_100f"]),
      _entry(3, "t", "sm_100f", ["cubin sm_100a"], front_end="Triton"),
      _entry(4, "p", "sm_90", ["ptx sm_90"])])
  code, out = _check(capsys, path, "--fleet", "sm_90,sm_100,sm_103,sm_110")
  assert code == 1
  k = out[out.index("'k'"):out.index("'p'")]
  assert "sm_90: exact cubin: cubin sm_90\n" in k
  # A family member takes the family's entry with no setting on the node (store/targets.py).
  assert "sm_100: family cubin: cubin sm_100f (the node takes sm_100f's entry by itself: no setting)\n" in k
  assert "sm_103: family cubin: cubin sm_100f (the node takes sm_100f's entry by itself: no setting)\n" in k
  # Another major version: an older arch's PTX, JIT-compiled there (a problem, but served).
  assert "sm_110: PROBLEM: PTX JIT: ptx sm_90 (the node takes sm_90's entry by itself: no setting): the driver" in k
  # Triton builds sm_100a whatever it is asked: no image of it loads on sm_103.
  t = out[out.index("Triton 't'"):]
  assert "sm_100: exact cubin: cubin sm_100a with JAX_MOSAIC_FFI_TARGETS=sm_100f" in t
  assert "sm_103: PROBLEM: missing: none of its images (cubin sm_100a) loads on sm_103" in t
  p = out[out.index("'p'"):out.index("Triton 't'")]
  assert "sm_90: PROBLEM: PTX JIT: ptx sm_90: the driver compiles it on the node" in p
  assert out.rstrip().endswith("problems: a node would compile, JIT or time there")
  # A fleet the pack covers passes.
  assert _check(capsys, _pack(tmp_path, [_entry(1, "k", "sm_90", ["cubin sm_90"])], name="ok.jmfpack"),
                "--fleet", "sm_90")[0] == 0


def test_check_fails_on_refused_compiles_an_empty_pack_and_old_entries(tmp_path, capsys):
  empty = _pack(tmp_path, [], name="empty.jmfpack")
  code, out = _check(capsys, empty, "--fleet", "sm_90")
  assert code == 1 and "PROBLEM: the pack holds no compile" in out
  refused = _pack(tmp_path, [_entry(1, "k", "sm_90", ["cubin sm_90"])], name="refused.jmfpack",
                  notes={"refused": [{"front_end": "CuTe DSL", "kernel": "gemm", "targets": ["sm_120"],
                                      "error": "CompileError: sm_120 is not supported\nmore"}]})
  code, out = _check(capsys, refused, "--fleet", "sm_90")
  assert code == 1 and "PROBLEM: refused while recording: CuTe DSL 'gemm' for sm_120: CompileError: sm_120" in out
  old = _pack(tmp_path, [_entry(1, "k", "sm_90", [])], name="old.jmfpack")
  code, out = _check(capsys, old, "--fleet", "sm_90")
  assert code == 1 and "does not say which images this compile holds" in out
  with pytest.raises(SystemExit, match="sm_90a is a compile target"):
    cli.main(["check", old, "--fleet", "sm_90a"])


def test_check_wants_a_winner_per_gpu_model_and_never_borrows_another(tmp_path, capsys):
  notes = {"winners": [{"name": "mm", "shapes": "float32[64]", "device": "NVIDIA H200", "compute_capability": "9.0",
                        "config": "0", "us": "1.00"}],
           "untuned": [{"name": "mm", "shapes": "float32[64]", "recorded_for": "sm_100", "why": "no tuning file"}]}
  path = _pack(tmp_path, [_entry(1, "k", "sm_90", ["cubin sm_90"])], notes=notes)
  code, out = _check(capsys, path, "--fleet", "sm_90", "--gpus", "NVIDIA H200,NVIDIA H100 80GB HBM3")
  assert code == 1
  assert "autotuned mm float32[64] on NVIDIA H200: winner in the pack" in out
  assert "autotuned mm float32[64] on NVIDIA H100 80GB HBM3: PROBLEM: no winner in the pack" in out
  code, out = _check(capsys, path, "--fleet", "sm_90")  # without --gpus: the models and archs the pack names
  assert code == 1 and "on GPUs of sm_100: PROBLEM: no tuning file" in out


def test_check_and_list_say_a_winner_is_aliased_and_from_which_model(tmp_path, capsys):
  winner = {"name": "mm", "shapes": "float32[64]", "compute_capability": "9.0", "config": "0", "us": "1.00"}
  notes = {"winners": [{**winner, "device": "NVIDIA H200"},
                       {**winner, "device": "NVIDIA H100 PCIe", "aliased_from": "NVIDIA H200 (9.0)"}]}
  path = _pack(tmp_path, [_entry(1, "k", "sm_90", ["cubin sm_90"])], notes=notes)
  code, out = _check(capsys, path, "--fleet", "sm_90", "--gpus", "NVIDIA H200,NVIDIA H100 PCIe")
  assert code == 0
  assert "autotuned mm float32[64] on NVIDIA H200: winner in the pack\n" in out
  assert ("autotuned mm float32[64] on NVIDIA H100 PCIe: winner in the pack (aliased: measured on NVIDIA H200 "
          "(9.0), asked for with --alias-winners)") in out
  code, out = _check(capsys, path, "--fleet", "sm_90")
  assert code == 0 and "on NVIDIA H100 PCIe: winner in the pack (aliased: measured on NVIDIA H200" in out
  assert cli.main(["list", path]) == 0
  assert "mm float32[64] on NVIDIA H100 PCIe (9.0): 0 (1.00 us); aliased: measured on NVIDIA H200 (9.0)" in (
      capsys.readouterr().out)


def test_an_alias_is_refused_before_the_program_runs_where_its_source_has_no_tuning_file(tmp_path, capsys):
  with pytest.raises(SystemExit, match="--alias-winners: NVIDIA H100 PCIe=NVIDIA H200: no tuning file given"):
    cli.main(["record", str(tmp_path / "out.jmfpack"), "--arch", "sm_90", "--alias-winners",
              "NVIDIA H100 PCIe=NVIDIA H200", "--", "false"])
  with pytest.raises(SystemExit, match="--alias-winners: 'NVIDIA H100 PCIe' is not TARGET=SOURCE"):
    cli.main(["build", str(tmp_path / "out.jmfpack"), str(tmp_path), "--alias-winners", "NVIDIA H100 PCIe"])
  assert not os.path.exists(tmp_path / "out.jmfpack")


def test_text_from_a_manifest_is_escaped_where_it_is_shown(tmp_path, capsys):
  forged = "k\x1b[2K\r/tmp/model.jmfpack: 1 entries, sha256 " + "0" * 64 + "\u202e"
  path = _pack(tmp_path, [_entry(1, forged, "sm_90", ["cubin sm_90"])])
  assert cli.main(["list", path]) == 0
  listing = capsys.readouterr().out
  assert "\x1b" not in listing and "\r" not in listing and "\u202e" not in listing
  assert "k\\x1b[2K\\x0d/tmp/model.jmfpack" in listing and "\\u202e" in listing
  assert _check(capsys, path, "--fleet", "sm_90")[1].count("\x1b") == 0


def test_merge_and_prune_take_notes_with_an_empty_reason(tmp_path, capsys):
  notes = {"untuned": [{"name": "mm", "shapes": "", "recorded_for": "sm_90", "why": ""}],
           "refused": [{"front_end": "Triton", "kernel": "t", "targets": ["sm_90"], "recorded_for": ["sm_90"],
                        "error": ""}]}
  path = _pack(tmp_path, [_entry(1, "k", "sm_90", ["cubin sm_90"])], notes=notes)
  assert cli.main(["merge", str(tmp_path / "merged.jmfpack"), path, path]) == 0
  assert cli.main(["prune", str(tmp_path / "pruned.jmfpack"), path, "--arch", "sm_90"]) == 0
  assert cli.main(["list", str(tmp_path / "merged.jmfpack")]) == 0
  assert "without a winner: autotuned mm  on sm_90: \n" in capsys.readouterr().out


def _cli(*args, env=None) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "jax_mosaic_ffi.pack", *args], env={**os.environ, **(env or {})},
                        capture_output=True, text=True, timeout=fresh_process.HANG_GUARD_S,
                        cwd=fresh_process.private_folder())


def test_a_listing_read_in_part_ends_quietly(tmp_path):
  # Over a pipe's buffer of JSON: `head` closes the pipe while the listing still writes.
  path = _pack(tmp_path, [_entry(n, f"kernel_{n}", "sm_90", ["cubin sm_90"]) for n in range(2000)])
  # Run from a folder of its own, as _cli: from the checkout, `-m` would import its package ahead of an installed one.
  done = subprocess.run(f"{sys.executable} -m jax_mosaic_ffi.pack list --json {path} | head -c 100", shell=True,
                        capture_output=True, text=True, timeout=fresh_process.HANG_GUARD_S,
                        cwd=fresh_process.private_folder())
  assert len(done.stdout) == 100 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
  assert json.loads(_cli("list", "--json", path).stdout)["entries"][0]["kernel"] == "kernel_0"


def test_record_runs_python_from_its_own_venv_and_writes_no_pack_for_a_program_that_compiles_nothing(tmp_path):
  out = str(tmp_path / "nothing.jmfpack")
  # No python on PATH: `python` is the interpreter the command runs in (a venv not on PATH records).
  done = _cli("record", out, "--arch", "sm_90", "--", "python", "-c", "import sys; print('ran', sys.executable)",
              env={"PATH": str(tmp_path)})
  assert f"ran {sys.executable}" in done.stdout, done.stderr
  assert done.returncode == 1 and "compiled no kernel for sm_90, so no pack was written" in done.stderr
  assert not os.path.exists(out)


def test_merge_keeps_where_each_entry_came_from_drops_answered_notes_and_names_conflicts(tmp_path, capsys):
  winner = {"name": "mm", "shapes": "f32[64]", "compute_capability": "9.0", "us": "1.00"}
  a = _pack(tmp_path, [_entry(1, "k", "sm_90", ["cubin sm_90"])], name="a.jmfpack",
            created={"jax": "0.12.0", "toolchains": ["nvrtc 13.0.88"], "recorded_for": ["sm_90"]},
            notes={"winners": [{**winner, "device": "NVIDIA H200", "config": "0"}],
                   "untuned": [{"name": "mm", "shapes": "f32[64]", "device": "NVIDIA B200", "why": "not timed"}],
                   "refused": [{"front_end": "Triton", "kernel": "t", "targets": ["sm_100"], "error": "crashed"}]})
  other = _entry(1, "k", "sm_90", ["cubin sm_90"])
  b = _pack(tmp_path, [pack_file.Entry(other.key, "compile", b"other bytes", other.about),
                       _entry(2, "t", "sm_100", ["cubin sm_100a"], front_end="Triton")], name="b.jmfpack",
            created={"jax": "0.11.2", "toolchains": ["triton 3.9.0"], "recorded_for": ["sm_100"]},
            notes={"winners": [{**winner, "device": "NVIDIA B200", "config": "1"},
                               {**winner, "device": "NVIDIA H200", "config": "1"}]})
  out = str(tmp_path / "merged.jmfpack")
  assert cli.main(["merge", out, a, b]) == 0
  printed = capsys.readouterr().out
  assert f"conflict: compile {KEY(1)[:16]} (k): {a} (" in printed and "hold different bytes" in printed
  assert "conflict: autotuned mm f32[64] on NVIDIA H200: winners 0 and 1" in printed
  merged = pack_file.read(out)
  assert merged.created["jax"] == ["0.12.0", "0.11.2"] and merged.created["recorded_for"] == ["sm_90", "sm_100"]
  assert merged.created["toolchains"] == ["nvrtc 13.0.88", "triton 3.9.0"]
  assert [m.split(" (")[0] for m in merged.created["merged_from"]] == [a, b]
  assert merged.entries[KEY(1)].payload == b"payload 1" and merged.entries[KEY(1)].about["from_pack"].startswith(a)
  assert merged.entries[KEY(2)].about["from_pack"].startswith(b)
  # B's winner answers A's "without a winner" for the B200, and B holds the compile A's recording refused.
  assert merged.notes["untuned"] == () and merged.notes["refused"] == ()
  assert cli.main(["list", out]) == 0 and f"; from {b} (" in capsys.readouterr().out


# --- the environment: only the settings that change the kernel are keyed, and the manifest names them -----------

def test_the_cute_dsl_key_holds_the_settings_it_declares_compiling_and_not_the_others(monkeypatch):
  from jax_mosaic_ffi.cute.compiler import keys as cute_keys
  if "CUTE_DSL_CACHE_DIR" not in cute_keys.not_compiling():
    pytest.skip("nvidia-cutlass-dsl is not installed (or declares its settings otherwise)")
  for name in [k for k in os.environ if k.startswith("CUTE_")]:
    monkeypatch.delenv(name)
  bare = cute_keys.settings_key()
  for name, value in (("CUTE_DSL_CACHE_DIR", "/tmp/elsewhere"), ("CUTE_DSL_LOG_LEVEL", "10"),
                      ("CUTE_DSL_PRINT_IR", "1")):  # the DSL marks these affects_compile=False
    monkeypatch.setenv(name, value)
    assert cute_keys.settings_key() == bare, name
  assert cute_keys.settings_environment() == []
  monkeypatch.setenv("CUTE_DSL_LINEINFO", "1")  # affects_compile=True: keyed, and shown
  assert cute_keys.settings_key() != bare and cute_keys.settings_environment() == ["CUTE_DSL_LINEINFO=1"]


def test_tritons_key_leaves_out_the_knobs_that_only_print_or_dump(monkeypatch):
  pytest.importorskip("triton")
  from jax_mosaic_ffi.triton.compiler import keys as triton_keys
  for name in ("TRITON_KERNEL_DUMP", "TRITON_ALWAYS_COMPILE", "TRITON_DUMP_PTXAS_LOG", "TRITON_DISABLE_LINE_INFO"):
    monkeypatch.delenv(name, raising=False)
  bare = triton_keys.settings_key()
  for name in ("TRITON_KERNEL_DUMP", "TRITON_ALWAYS_COMPILE", "TRITON_DUMP_PTXAS_LOG"):
    monkeypatch.setenv(name, "1")
    assert triton_keys.settings_key() == bare, name
  monkeypatch.setenv("TRITON_DISABLE_LINE_INFO", "1")
  assert triton_keys.settings_key() != bare and triton_keys.settings_environment() == ["TRITON_DISABLE_LINE_INFO=1"]


def test_check_compares_this_environments_keyed_settings_with_the_packs(tmp_path, capsys, monkeypatch):
  entry = _entry(1, "gemm", "sm_90", ["cute sm_90a"], front_end="CuTe DSL")
  path = _pack(tmp_path, [pack_file.Entry(entry.key, "compile", entry.payload,
                                          {**entry.about, "settings": ["CUTE_DSL_LINEINFO=1"]})])
  for name in [k for k in os.environ if k.startswith("CUTE_")]:
    monkeypatch.delenv(name)
  code, out = _check(capsys, path, "--fleet", "sm_90", "--environment")
  assert code == 1 and ("PROBLEM: CuTe DSL kernels were compiled under CUTE_DSL_LINEINFO=1, and this environment "
                        "sets none: a node with it misses them") in out
  monkeypatch.setenv("CUTE_DSL_LINEINFO", "1")
  assert _check(capsys, path, "--fleet", "sm_90", "--environment")[0] == 0
