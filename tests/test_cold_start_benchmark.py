"""The cold-start benchmark (benchmarks/cold_start.py) on the CPU: its goals and table from results in the shape its
GPU run writes, and its plumbing: the child lowers a workload, the record command makes the workload's pack from
it, and a fresh child with that pack and an empty cache compiles nothing (the GPU run then times the same
children running)."""

import importlib
import os

import pytest

import benchmarks_package

bench = benchmarks_package.load()
goals = bench.goals
import benchmarks.cold_start as cold_start  # noqa: E402  (after the package is loaded from this tree)


def _cold():
  return {"calls": 14, "cold_s": 30.0, "cold_kernels_s": 25.0, "cold_xla_s": 2.0, "cold_compiles": 14,
          "cold_tunings": 0}


def _workload(pack_s=0.5, warm_s=0.45, compiles=0):
  return {**_cold(), "warm_s": warm_s, "pack_s": pack_s, "pack_kernels_s": 0.3, "pack_xla_s": 0.15, "both_s": 0.4,
          "both_xla_s": 0.01, "pack_over_warm": pack_s / warm_s, "pack_compiles": compiles, "pack_hits": 14,
          "winners_from_pack": 0, "pack_bytes": 900_000, "pack_listing": "x.jmfpack: 14 entries"}


def test_the_goals_judge_the_slowest_workload_and_any_compile():
  main = {"arch": "sm_100", "errors": {},
          "workloads": {"cuda_corpus": _workload(), "triton_matmul": _workload(pack_s=0.7, warm_s=0.5)},
          "measured": True, "pack_over_warm": 1.4, "pack_compiles": 0}
  dsl = {"arch": "sm_100", "workloads": {"gluon_gemm": {"skipped": "a Hopper (sm_90a) kernel; this GPU is sm_100"},
                                         "quack_softmax": _workload(compiles=1)},
         "errors": {"cute_gemm": "RuntimeError: boom"}, "measured": True, "pack_over_warm": 1.0, "pack_compiles": 1}
  verdicts = {v.goal.metric: v for v in goals.verdicts({"results": {"cold_start": {"main": main, "dsl": dsl}}})}
  assert verdicts["cold_start/main/pack_over_warm"].status == "not met"
  assert verdicts["cold_start/main/pack_compiles"].status == "met"
  assert verdicts["cold_start/dsl/pack_over_warm"].status == "met"
  assert verdicts["cold_start/dsl/pack_compiles"].status == "not met"
  peers = {"arch": "sm_90", "errors": {}, "measured": False,
           "workloads": {"jax_triton_matmul": {"skipped": "not installed: No module named 'jax_triton'"},
                         "cutlass_call_gemm": _cold()}}
  (text,) = cold_start.tables({"main": main, "dsl": dsl, "peers": peers})
  # Each time in its two parts: the kernels' and XLA's compile; and with XLA's persistent cache as well.
  assert ("| cuda_corpus | 14 | 30.00 s (25.00 + 2.00 s); 14 compiles, 0 tuned | 0.450 s | 0.500 s (0.300 + 0.150 s) "
          "| 0.400 s (XLA 0.010 s) | **1.11x** |") in text
  assert "| jax_triton_matmul | n/a | not installed: No module named 'jax_triton' |" in text
  assert "| cutlass_call_gemm | 14 | 30.00 s (25.00 + 2.00 s); 14 compiles, 0 tuned |  | no pack |" in text
  verdicts = {v.goal.metric for v in goals.verdicts({"results": {"cold_start": {"peers": peers}}})}
  assert not any("peers" in metric for metric in verdicts)  # the peers' rows are shown, not judged
  assert "| gluon_gemm | n/a | a Hopper (sm_90a) kernel; this GPU is sm_100 |" in text
  assert "| cute_gemm | failed | RuntimeError: boom |" in text and "| fa4_forward | n/a | not run |" in text
  (text,) = cold_start.tables({"main": main, "dsl": {"error": "exit code 1\nTimeout"}})
  assert "| gluon_gemm | n/a | run failed (exit code 1): Timeout |" in text
  widths = {line.count("|") for line in text.splitlines() if line.startswith("|")}
  assert len(widths) == 1
  assert cold_start.tables({"main": {"skipped": "needs a GPU"}}) == ["n/a: skipped: needs a GPU"]


def test_the_child_and_the_record_command_make_a_pack_that_compiles_nothing(tmp_path):
  """Two CUDA corpus kernels: lowered by the child on the CPU under the record command, then lowered again by a
  fresh child with the pack, an empty cache and the strict mode."""
  listing = cold_start.record_pack("cuda_corpus", "sm_90", None, str(tmp_path / "corpus.jmfpack"),
                                   {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "record-cache")}, limit=2)
  assert "2 compiles" in listing
  lowered = cold_start.child("cuda_corpus", "lower", {
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "empty"), "JAX_MOSAIC_FFI_PACKS": str(tmp_path / "corpus.jmfpack"),
      "JAX_MOSAIC_FFI_PACKS_STRICT": "1"}, limit=2)
  assert lowered["calls"] == 2 and lowered["compiles"] == 0 and lowered["pack_hits"] == 2
  assert not os.path.exists(tmp_path / "empty") or not os.listdir(tmp_path / "empty")


def test_a_peers_row_says_why_it_was_not_run_where_its_package_is_not_importable(tmp_path):
  for workload, module in (("jax_triton_matmul", "jax_triton"), ("cutlass_call_gemm", "cutlass.jax")):
    try:
      importlib.import_module(module)
      continue  # importable: its row is measured on a GPU
    except ImportError as e:
      missing = str(e)
    results, errors = {}, {}
    cold_start._measure_all([workload], 90, "sm_90", str(tmp_path), results, errors)
    assert results == {workload: {"skipped": f"not installed: {missing}"}} and errors == {}


def test_every_workload_is_known_and_an_unknown_one_is_refused():
  assert set(cold_start.HOPPER_ONLY) <= set(cold_start.WORKLOADS) and set(cold_start.PEERS) <= set(cold_start.WORKLOADS)
  assert {w for run in cold_start.RUNS for w in run.kwargs["workloads"]} == set(cold_start.WORKLOADS)
  with pytest.raises(ValueError, match="no workload 'nope'"):
    cold_start.prepare("nope")


def test_the_compilers_table_and_its_goal():
  # The compilers run (benchmarks/cold_compile.py) in the shape it writes: a front end that is missing is its row.
  row = lambda ours, native: {"ours_s": ours, "native_s": native, "ratio": ours / native, "rounds": 3}  # noqa: E731
  compilers = {"arch": "sm_90a", "measured": True, "errors": {"cute": "not installed: No module named 'cutlass'"},
               "rows": {"nvrtc_small": {**row(0.026, 0.022), "first_in_process_s": 0.2},
                        "nvrtc_halves": row(0.66, 0.60), "triton": row(0.2, 0.1)}, "nvrtc_over_alone": 0.026 / 0.022}
  (text, table) = cold_start.tables({"main": {"skipped": "needs a GPU"}, "compilers": compilers})
  assert text == "n/a: skipped: needs a GPU"
  assert "| CUDA C++, a small kernel | `jmf.cuda_kernel` | NVRTC alone | 26.0 ms | 22.0 ms | **1.18x** |" in table
  assert "| Triton, an elementwise kernel |" in table and "| **2.00x** |" in table
  assert "| CuTe DSL, the corpus's add_one | `jmf.cute_call`, built and lowered | `cute.compile` | n/a | n/a | " \
         "not installed: No module named 'cutlass' |" in table
  assert "took 200.0 ms" in table
  verdicts = {v.goal.metric: v for v in goals.verdicts({"results": {"cold_start": {"compilers": compilers}}})}
  assert verdicts["cold_start/compilers/nvrtc_over_alone"].status == "met"
  slow = {**compilers, "nvrtc_over_alone": 1.3}
  verdicts = {v.goal.metric: v for v in goals.verdicts({"results": {"cold_start": {"compilers": slow}}})}
  assert verdicts["cold_start/compilers/nvrtc_over_alone"].status == "not met"
