"""The CuTe-native benchmark (benchmarks/cute_native.py): its goals and tables from recorded results on any machine
(no jax, no DSL needed); with the CuTe DSL installed, its timed programs lower on the CPU as the GPU run builds
them (the kernels themselves are tested in test_cute_kernels.py)."""

import pytest

import benchmarks_package

bench = benchmarks_package.load()
goals, report = bench.goals, bench.report
import benchmarks.cute_native as native  # noqa: E402  (after the package is loaded from this tree)


def _case(dsl_us, ours_us, cc_us, unit="TFLOP/s", cublas_us=None):
  us = {"dsl": dsl_us, "cutlass_call": cc_us, "ours": ours_us, **({"cublas": cublas_us} if cublas_us else {})}
  work = 1.1e12 if unit == "TFLOP/s" else 8.0e8
  return {"chain": 4, "rounds": 15, "unit": unit, "work": work, "constexprs": {"cluster_m": 1},
          "max_error": {k: 1e-3 for k in us}, "us": us,
          "throughput": {k: work / v / (1e6 if unit == "TFLOP/s" else 1e3) for k, v in us.items()},
          "over_dsl": {k: dsl_us / v for k, v in us.items() if k != "dsl"}}


def _stages(first_result_s):
  calls = {"trace": 0.01, "lower": 0.01, "compile": first_result_s - 0.04, "run": 0.02}
  return {"import_jax": 1.0, "backend": 0.2, "import_dsl": 1.2, "import_front_end": 0.3, "inputs": 0.1, **calls,
          "instantiate": 0.03}


def _warm_start():
  cold = {"ours": 4.0, "cutlass_call": 4.2, "ours_jax_cache": 4.1}
  warm = {"ours": 0.1, "cutlass_call": 4.1, "ours_jax_cache": 0.05}
  return {"size": 8192, "pairs": 2, "cold_s": cold, "warm_s": warm,
          "warm_over_cold": {k: warm[k] / cold[k] for k in cold},
          "process_cold_s": {k: v + 3.0 for k, v in cold.items()},
          "process_warm_s": {k: v + 3.0 for k, v in warm.items()},
          "process_warm_over_cold": {k: (warm[k] + 3.0) / (cold[k] + 3.0) for k in cold},
          "stages": {k: {"cold": _stages(cold[k]), "warm": _stages(warm[k])} for k in cold},
          "cute_compiles": {"ours": [1, 0], "cutlass_call": [0, 0], "ours_jax_cache": [1, 0]}, "errors": {}}


OURS_FAILED = "RuntimeError: ours failed"


def _results(with_ours=True):
  gemm = {"gemm_4096": _case(200.0, 198.0, 201.0, cublas_us=190.0), "gemm_8192": _case(1600.0, 1700.0, 1610.0,
                                                                                        cublas_us=1500.0)}
  rowwise = {"axpy": _case(190.0, 189.0, 191.0, unit="GB/s")}
  runs = {
      "rowwise": {"cases": rowwise, "speed": {"axpy": 190.0 / 189.0},
                  "errors": {"rmsnorm": "AssertionError: rmsnorm: ours result is off by 3.0e-01"}},
      "gemm": {"cases": gemm, "speed": {k: c["over_dsl"]["ours"] for k, c in gemm.items()}, "errors": {}},
      "launch": {"chain": 200, "errors": {}, "us_per_call": {"ours": 1.6, "cutlass_call": 2.4, "mosaic_cuda": 1.5}},
      "launch_cb_off": {"skipped": "needs a GPU visible to both jax and torch"},
      "warm_start": _warm_start(),
  }
  if not with_ours:  # the DSL's launchers measured, ours failed
    runs["rowwise"]["errors"] = {}
    runs["rowwise"]["cases"]["rmsnorm"] = _case(130.0, 131.0, 132.0, unit="GB/s")
    for run in ("rowwise", "gemm"):
      for name, case in runs[run]["cases"].items():
        del case["us"]["ours"], case["over_dsl"]["ours"]
        runs[run]["errors"][name] = OURS_FAILED
      runs[run]["errors"]["ours"] = OURS_FAILED
      runs[run]["speed"] = {}
    runs["launch"]["us_per_call"].pop("ours")
    runs["launch"]["errors"]["ours"] = OURS_FAILED
    warm = runs["warm_start"]
    for key in ("cold_s", "warm_s", "warm_over_cold", "process_cold_s", "process_warm_s", "process_warm_over_cold",
                "stages", "cute_compiles"):
      warm[key].pop("ours")
      warm[key].pop("ours_jax_cache")
    warm["errors"]["ours"] = OURS_FAILED
  return {"date": "2026-12-05 10:00 UTC", "machine": {}, "results": {"cute_native": runs}}


def test_the_goals_read_the_ratios_to_the_dsls_own_launch():
  by_metric = {v.goal.metric: v for v in goals.verdicts(_results())}
  assert by_metric["cute_native/gemm/speed/gemm_4096"].status == "met"
  slow = by_metric["cute_native/gemm/speed/gemm_8192"]
  assert slow.status == "not met" and "ours 1700 us, the DSL's launcher (cute.compile on torch tensors) 1600 us" \
      in slow.explanation
  assert by_metric["cute_native/rowwise/speed/rmsnorm"].reason == (
      "failed: AssertionError: rmsnorm: ours result is off by 3.0e-01")
  launch = by_metric["cute_native/launch/us_per_call/ours"]
  assert launch.status == "met" and launch.judged == pytest.approx(1.6 / 2.4)
  warm = by_metric["cute_native/warm_start/warm_s/ours"]
  assert warm.status == "met" and warm.judged == pytest.approx(0.025)


def test_when_ours_fails_every_goal_of_ours_says_so():
  for verdict in goals.verdicts(_results(with_ours=False)):
    if verdict.goal.metric.startswith("cute_native/"):
      assert verdict.status == "not measured" and "ours failed" in verdict.reason, verdict.goal.metric


def test_the_tables():
  page = report.render(_results())
  assert f"## {native.TITLE}\n" in page
  assert ("| Hopper GEMM 4096^3 bf16, 128x256 tiles | 200 (5500) | 201 (5473) | 198 (5556) | **1.01x** | TFLOP/s "
          "| 190 (5789) | 1.0e-03 / 1.0e-03 / 1.0e-03 / 1.0e-03 |") in page
  assert "| RMSNorm over rows, 16384x8192 bf16 | n/a | n/a | n/a | n/a | AssertionError: rmsnorm: ours result" in page
  assert "| on | 1.6 | 2.4 | **0.67x** | 1.5 |" in page
  assert "| off | skipped: needs a GPU visible to both jax and torch |" in page
  assert "| ours (jmf.cute_call) | 4.00 s | 0.100 s | **2.5%** | 7.00 s | 3.10 s | 44.3% | 1 / 0 |" in page
  assert "| cutlass_call | 4.20 s | 4.100 s | **97.6%** | 7.20 s | 7.10 s | 98.6% | n/a |" in page
  assert "| ours, JAX's compilation cache on too | 4.10 s | 0.050 s | **1.2%** |" in page
  assert "| XLA compile | 3960.0 | 60.0 | 4160.0 | 4060.0 | 4060.0 | 10.0 |" in page
  assert ("Of the warm first result (100.0 ms): trace and lowering, where our cache lookup runs, 20.0 ms; XLA's "
          "compile of the program 30.0 ms;") in page
  page = report.render(_results(with_ours=False))
  assert "| axpy (0.5 x + y), 16384x8192 bf16 | 190 (4211) | 191 (4188) | n/a | n/a | GB/s |" in page
  assert f"- gemm, ours: {OURS_FAILED}" in page
  assert "| on | n/a | 2.4 | n/a | 1.5 |" in page
  assert f"| ours (jmf.cute_call) | n/a | n/a | {OURS_FAILED} |" in page


# ---------------------------------------------------------------- with the DSL, no GPU needed

# In a process of its own: the DSL reads its target (CUTE_DSL_ARCH) once, when it is imported. (4.8.1 on a machine
# without a GPU: compile_options="--gpu-arch sm_90a" compiles, but the object dump of cutlass_call then fails to
# link the runtime's symbols; the environment variable works.)
TIMED_PROGRAMS = """
import json, sys, warnings
import benchmarks_package
benchmarks_package.load()
import benchmarks.cute_native as native
import jax
from hlo_inspect import custom_calls
env = native.environment(with_torch=False)
found = {}
for name in sys.argv[1:]:
  case = native.make_case(name, env)
  for key, call in native.jax_paths(case, env).items():
    program = native.stamped_chain(call, case["carry"], case["chain"])
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # no GPU here
      lowered = jax.jit(program).trace(*case["avals"]).lower(lowering_platforms=("cuda",))
    found[f"{name}/{key}"] = [[c["target"], (c["config"].get("kernel_name") or b"").decode()]
                              for c in custom_calls(lowered)]
print(json.dumps(found))
"""


def test_the_timed_programs_lower_between_two_clock_stamps(tmp_path):
  pytest.importorskip("cutlass.cute", reason="needs the CuTe DSL (pip install nvidia-cutlass-dsl)")
  import fresh_process
  cases = ["axpy", "rmsnorm", "gemm_4096"]
  found = fresh_process.run(TIMED_PROGRAMS, *cases, env={
      "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_CACHE_DIR": str(tmp_path / "dsl"),
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "jmf")}).result
  paths = {"cutlass_call", "ours"} if hasattr(__import__("jax_mosaic_ffi"), "cute_call") else {"cutlass_call"}
  assert set(found) == {f"{c}/{p}" for c in cases for p in paths} | {"gemm_4096/cublas"}
  for key, calls in found.items():
    stamps = [name for target, name in calls if target == "jax_mosaic_ffi_launch_v1"]
    assert stamps.count("clock_before") == 1 and stamps.count("clock_after") == 1, key
    kernels = [c for c in calls if c[1] not in ("clock_before", "clock_after")]
    assert bool(kernels) == (not key.endswith("cublas")), key  # the kernel's own call (cuBLAS: XLA's dot)
