"""The benchmark report on CPU: goals, tables and the command line, from recorded results.

tests/data/benchmark_results.json is synthetic, in the shape `python -m
benchmarks` writes: one optional run failed on an unknown XLA flag, one path
failed, one run skipped, one stage count missing, one corpus kernel failed
and one disagreed with its XLA equivalent.
"""

import importlib
import inspect
import json
import os
import re
import subprocess
import sys

import pytest

import benchmarks_package
import fresh_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "data", "benchmark_results.json")


bench = benchmarks_package.load()
goals, report, suite = bench.goals, bench.report, bench.suite


@pytest.fixture
def results():
  with open(FIXTURE) as f:
    return json.load(f)


def _python(*args, cwd, env=None):
  env = {**os.environ, "PYTHONPATH": REPO, **(env or {})}
  return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                        timeout=fresh_process.HANG_GUARD_S, cwd=cwd, env=env)


def test_every_benchmark_is_found_in_order_with_unique_runs():
  modules = suite.discover()
  names = [m.NAME for m in modules]
  assert names == ["launch", "bandwidth", "inplace", "sites", "compile", "cold_start", "job_share", "vmap", "shadow",
                   "allreduce", "cross_process", "autotune", "gluon_native", "triton_native", "cute_native",
                   "cutile_native", "vs_jax_triton", "fa4_attention", "vs_quack_jax", "corpus", "pallas_ops", "gemm"]
  for module in modules:
    runs = [r.name for r in module.RUNS]
    assert runs and len(set(runs)) == len(runs) and all("/" not in r for r in runs)
    assert callable(module.run) and callable(module.tables) and module.TITLE


def test_launch_runs_set_xla_flags_and_only_pdl_variants_are_optional():
  launch = suite.by_name()["launch"]
  runs = {r.name: r for r in launch.RUNS}
  assert set(runs) == {f"cb_{cb}{pdl}" for cb in ("on", "off") for pdl in ("", "_pdl_on", "_pdl_off")} | {
      "cb_on_phases"}
  assert runs["cb_on_phases"].kwargs["phases"] and not runs["cb_on_phases"].xla_flags
  assert "--xla_gpu_enable_command_buffer=" in runs["cb_off"].xla_flags and not runs["cb_on"].xla_flags
  assert "--xla_gpu_enable_pdl=false" in runs["cb_on_pdl_off"].xla_flags
  assert "--xla_gpu_enable_pdl_launch=true" in runs["cb_off_pdl_on"].xla_flags
  assert [r.name for r in launch.RUNS if not r.optional] == ["cb_on", "cb_off"]


def test_goal_verdicts_from_recorded_results(results):
  by_metric = {v.goal.metric: v for v in goals.verdicts(results)}
  on = by_metric["launch/cb_on/us_per_call/mosaic"]
  assert on.status == "not met" and on.judged == pytest.approx(1.98 / 1.67)
  assert "ours 0.55 us, XLA's 0.57 us" in on.explanation  # its context was looked up
  assert "ours 20 us, XLA's 5 us, a custom call that does nothing n/a us" in on.explanation
  assert by_metric["launch/cb_off/us_per_call/mosaic"].status == "met"
  assert by_metric["bandwidth/main/ratio"].status == "met"
  assert by_metric["compile/main/warm_disk_ms"].judged == pytest.approx(1.91 / 111.7)
  skipped = by_metric["allreduce/main/min_speedup_small"]
  assert skipped.status == "not measured" and "needs 2 or more GPUs" in skipped.reason


def test_a_goal_says_why_its_number_is_missing(results):
  assert goals.lookup(results, "nope/main/x") == (None, "nope was not run")
  assert goals.lookup(results, "launch/cb_on_pdl_off/us_per_call/mosaic")[1].startswith(
      "run failed (exit code -6): Unknown flag in XLA_FLAGS")
  assert goals.lookup(results, "launch/cb_on/us_per_call/mosaic_gpu")[1] == (
      "failed: AssertionError: assert rule is not None")


def test_goals_read_keys_their_benchmarks_write():
  modules = suite.by_name()
  for goal in goals.GOALS:
    assert goal.compare in goals.COMPARE and goal.name
    for path in [goal.metric, goal.baseline, *goal.context.values()]:
      if path is None:
        continue
      name, run, *keys = path.split("/")
      module = modules[name]
      assert run in {r.name for r in module.RUNS}, path
      source = inspect.getsource(module)
      assert all(f'"{key}"' in source for key in keys), path  # the run writes that key
    goal.explain_unmet.format(value="v", baseline="b", ratio="r", threshold="t",
                              **{k: "c" for k in goal.context})  # names nothing it lacks


def test_the_page_from_recorded_results(results):
  page = report.render(results)
  for title in ["Goals", "Launch overhead", "Where the time goes", "XLA's PDL flags",
                "Collective target: stages per execution", "Memory-bound kernel", "In-place update (1 GiB)",
                "Per call site", "Compile caches",
                "One-shot all-reduce", "Corpus kernels against XLA", "Runs"]:
    assert f"## {title}\n" in page or f"### {title}\n" in page, title
  assert "NVIDIA H200" in page and "driver 580.95.05" in page and "NVRTC 13.0" in page and "2026-12-02" in page
  assert ", Triton" not in page  # the fixture's machine had none; with it, the header names the version
  with_triton = dict(results["machine"], packages={**results["machine"]["packages"], "triton": "3.9.0"})
  assert ", Triton 3.9.0" in bench.machine.summary(with_triton)
  assert "| custom call, execute-only empty handler (captured) | 0.79 | 1.08 |" in page
  ours = "mosaic_kernel (PDL by default: wait, then launch_dependents, at entry)"
  assert f"| {ours} | 1.98 | 4.44 | 1.19 | 1.09 |" in page
  assert f"| {ours} | 1.98 (1.19x) | 1.99 (1.20x) | n/a |" in page  # the failed PDL-off process
  assert "command buffers on, XLA PDL flags off: n/a: run failed (exit code -6): Unknown flag in XLA_FLAGS" in page
  assert ("Distinct output addresses over 6 calls: mosaic_kernel (PDL by default: wait, then launch_dependents, "
          "at entry) with command buffers on: 1 dropped, 2 kept;") in page
  assert "| command buffers on | 3.10 | 1.98 | 200 (1.00) | 200 (1.00) |" in page
  assert f"| {ours} | 1.98 | 0.55 | 1.43 | 4.44 | 4.31 | 0.13 | 20.0 | 9.0 | 110.0 |" in page  # where the time goes
  assert "| custom call, execute-only empty handler (captured) | 0.79 | n/a | n/a | 1.08 | n/a | n/a | n/a |" in page
  assert "0.54 us with PDL edges" in page
  assert "(XLA's phases): n/a: no XLA timing lines parsed" in page
  assert "GPU stamps of mosaic_kernel, uses_pdl=False (the kernel as written) (command buffers off): n/a: " \
         "RuntimeError: CUDA call failed" in page
  assert "counts n/a: this build's kernel_cache_stats() has no collective_prepares" in page
  assert "Without donation / with: **1.96x**" in page
  assert ("| tiled SGEMM, alpha A @ B (sgemm_smem.cu) | 2048^3 fp32 | alpha * jnp.matmul, precision=HIGHEST (fp32) "
          "| 1105.0 | 352.0 | 3.14 | 15.5 / 48.8 TFLOP/s | yes (8.2e-07) |") in page
  assert "| same kernel |  | alpha * jnp.matmul, default precision" in page  # a second XLA equivalent
  assert ("| 4096x4096 bf16 | jnp amax, scale, clip, astype(float8_e4m3fn) | 16.2 | 18.0 | 0.90 | 3.11 / 2.80 TB/s "
          "| **no** (0.143 > 0.1) |") in page  # a mismatch is a row of the table, not a failed run
  assert "- transpose: n/a: RuntimeError: CUDA_ERROR_OUT_OF_MEMORY: out of memory" in page  # a kernel that failed
  assert "staged" not in page and not re.search(r"\bNone\b *\||\bnan\b|\binf\b", page)
  assert "{" not in page.replace("{0: 0}", "")  # no template left unformatted


def test_every_table_has_its_method_and_rows_of_equal_width(results):
  page = report.render(results)
  for block in page.split("\n\n"):
    lines = block.splitlines()
    if lines and lines[0].startswith("|"):
      assert len({line.count(" | ") for line in lines}) == 1, block


def test_a_renderer_that_fails_costs_only_its_section(results):
  results["results"]["bandwidth"] = {"main": {"ratio": 0.5}}  # keys missing: its tables() raises
  page = report.render(results)
  assert "## Memory-bound kernel\n\nCould not render these results: KeyError" in page
  assert "## Compile caches" in page


def test_report_command_line_writes_the_page(tmp_path, results):
  doc = tmp_path / "benchmarks.md"
  done = _python("-m", "benchmarks.report", FIXTURE, "--doc", str(doc), "--no-figures", cwd=tmp_path)
  assert done.returncode == 0, done.stderr
  assert doc.read_text() == report.render(results) and doc.read_text() in done.stdout


def test_benchmarks_command_line_lists_and_refuses_unknown_names(tmp_path):
  done = _python("-m", "benchmarks", "--list", cwd=tmp_path)
  assert done.returncode == 0, done.stderr
  assert "launch/cb_off_pdl_off (optional)" in done.stdout and "inplace/main" in done.stdout
  done = _python("-m", "benchmarks", "--only", "launch,nope", cwd=tmp_path)
  assert done.returncode == 2 and "no benchmark 'nope'" in done.stderr


def test_a_run_that_measured_nothing_fails_and_one_asked_for_must_not_skip(tmp_path):
  main = importlib.import_module("benchmarks.__main__")
  run, optional = suite.Run("gemm"), suite.Run("gemm", optional=True)
  every_case_failed = {"cases": {}, "errors": {"ring_4096": "Boom: a", "ring_8192": "Boom: b"}, "measured": False}
  assert main.run_outcome(every_case_failed, run) == "failed: no part measured: ring_4096, ring_8192"
  assert main.run_outcome(every_case_failed, optional).startswith("n/a (optional): failed: no part measured")
  one_failed = {"cases": {"ring_4096": {}}, "errors": {"ring_8192": "Boom: b"}, "measured": True}
  assert main.run_outcome(one_failed, run) == "ok, but n/a: ring_8192"
  assert main.run_outcome({"x": 1.0}, run) == "ok"
  assert main.run_outcome({"skipped": "no torch"}, run) == "skipped: no torch"
  # Asked for by name, a run that skips (here: no GPU) fails the command; in the whole suite it would not.
  done = _python("-m", "benchmarks", "--only", "gluon_native/launch", "--out", str(tmp_path / "out"),
                 "--doc", str(tmp_path / "benchmarks.md"), cwd=tmp_path)
  assert done.returncode == 1, done.stdout + done.stderr
  assert "failed: gluon_native/launch: skipped: needs" in done.stderr
  raw = json.loads((tmp_path / "out" / "benchmarks.json").read_text())  # written after each run
  assert raw["runs"]["gluon_native/launch"]["outcome"].startswith("skipped: needs")
  assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["benchmarks.json", "benchmarks.md"]


def test_a_benchmark_run_leaves_no_kernel_cache_behind(tmp_path):
  # The suite's kernel disk cache is a temporary folder of the run's own: removed when the run ends. A benchmark
  # that needs no GPU (it lowers only; n/a where jax-triton is absent) runs here with the temporary folder at tmp.
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  done = _python("-m", "benchmarks", "--only", "vs_jax_triton/lowering", "--out", str(tmp_path / "out"),
                 "--doc", str(tmp_path / "benchmarks.md"), cwd=tmp_path, env={"TMPDIR": str(tmp)})
  assert done.returncode == 0 and "== vs_jax_triton/lowering:" in done.stdout, done.stdout + done.stderr
  assert (tmp_path / "out" / "benchmarks.json").is_file()
  assert not [p.name for p in tmp.iterdir() if p.name.startswith("jmf-bench-cache-")], list(tmp.iterdir())


def test_finding_and_rendering_imports_no_jax(tmp_path):
  # The parent process must not fix XLA's flags (or hold a GPU) before its children set theirs.
  script = ("import sys, json, benchmarks.report as r; r.render(json.load(open(sys.argv[1]))); "
            "print(sorted(m for m in ('jax', 'jaxlib', 'jax_mosaic_ffi') if m in sys.modules))")
  done = _python("-c", script, FIXTURE, cwd=tmp_path)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "[]"


# Two executions as jaxlib 0.11.2 logs them at TF_CPP_MAX_VLOG_LEVEL=3 (abridged), between our markers.
_XLA_LOG = """\
@@jax_mosaic_ffi phase marker mosaic
I1203 08:36:25.763168     800 gpu_executable.cc:679] [0] Using 0 additional communication streams.
I1203 08:36:25.763170     800 gpu_executable.cc:692] [0] Using 0 additional compute streams.
I1203 08:36:25.763179     879 pjrt_stream_executor_client.cc:1550] Start device execution for jit_f
I1203 08:36:25.763206     800 gpu_executable.cc:731] [0] Prepared GPU executable module: jit_f for execution
I1203 08:36:25.763220     800 gpu_executable.cc:794] [0] Start GpuExecutable::ExecuteOnStream module: jit_f
I1203 08:36:25.763229     800 cuda_command_buffer.cc:973] Launch command buffer executable graph 0x2a2fe160
I1203 08:36:25.763240     800 gpu_executable.cc:797] [0] End GpuExecutable::ExecuteOnStream module: jit_f
I1203 08:36:25.763263     800 se_gpu_pjrt_client.cc:2169] [0] GpuExecutable::ExecuteAsyncOnStreamImpl(jit_f) \
time: 122 us (122 us) (cumulative: 398 ms, max: 390 ms, #called: 24)
I1203 08:36:25.764000     800 gpu_executable.cc:692] [0] Using 0 additional compute streams.
I1203 08:36:25.764040     800 gpu_executable.cc:731] [0] Prepared GPU executable module: jit_f for execution
I1203 08:36:25.764050     800 gpu_executable.cc:794] [0] Start GpuExecutable::ExecuteOnStream module: jit_f
I1203 08:36:25.764060     800 gpu_executable.cc:797] [0] End GpuExecutable::ExecuteOnStream module: jit_f
I1203 08:36:25.764070     800 se_gpu_pjrt_client.cc:2169] [0] GpuExecutable::ExecuteAsyncOnStreamImpl(jit_f) \
time: 130 us (130 us) (cumulative: 398 ms, max: 390 ms, #called: 25)
I1203 08:36:25.764080     800 gpu_executable.cc:692] [0] Using 0 additional compute streams.
@@jax_mosaic_ffi phase marker end
I1203 08:36:25.765000     800 gpu_executable.cc:692] [0] Using 0 additional compute streams.
"""


def test_xla_phases_are_read_from_xla_log_lines():
  import benchmarks.xla_phases as xla_phases
  parts = xla_phases.split_by_marker(_XLA_LOG.splitlines())
  assert list(parts) == ["mosaic"] and len(parts["mosaic"]) == 14
  phases = xla_phases.parse(parts["mosaic"])
  assert phases["executions"] == 2  # the unfinished third execution does not count
  assert phases["prepare"] == pytest.approx((36 + 40) / 2)  # from the compute streams' line
  assert phases["execute"] == pytest.approx((20 + 10) / 2)
  assert phases["after"] == pytest.approx((23 + 10) / 2)
  assert phases["xla_total"] == pytest.approx(126)
  assert xla_phases.parse(["I1203 08:36:25.763168 800 a.cc:1] something else"]) == {"executions": 0}


def _triton_native_case(ours_us, triton_us, unit="TFLOP/s", winners=None, at_ours=None):
  us = {"ours": ours_us, "triton": triton_us, **({"triton_at_our_config": at_ours} if at_ours else {})}
  return {"chain": 5, "rounds": 15, "max_error": {"ours": 1.2e-3, "triton": 1.1e-3}, "unit": unit, "work": 1.1e12,
          "us": us, "throughput": {k: 1.1e12 / v / 1e6 for k, v in us.items()}, "speed": triton_us / ours_us,
          **({"winners": winners} if winners else {})}


def test_the_triton_native_rows_and_goals():
  config = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
            "num_ctas": 1}
  other = dict(config, BLOCK_M=256, BLOCK_N=128)
  results = {"date": "2026-12-03 18:00 UTC", "machine": {}, "results": {"triton_native": {
      "matmul": {"decorated": False, "errors": {}, "speed": {"matmul_4096": 0.98, "matmul_8192": 0.5},
                 "cases": {"matmul_4096": _triton_native_case(200.0, 196.0, winners={"triton": config,
                                                                                      "ours": config}),
                           "matmul_8192": _triton_native_case(3000.0, 1500.0, winners={"triton": config,
                                                                                        "ours": other},
                                                              at_ours=1600.0)}},
      "attention": {"decorated": False, "cases": {}, "speed": {},
                    "errors": {"attention": "CompileError: out of shared memory",
                               "attention_causal": "CompileError: out of shared memory"}},
      "rowwise": {"skipped": "needs a GPU visible to both jax and torch"},
      "launch": {"chain": 200, "errors": {}, "us_per_call": {"ours": 2.0, "triton_eager": 8.0, "triton_enqueue": 7.5}},
  }}}
  by_metric = {v.goal.metric: v for v in goals.verdicts(results)}
  assert by_metric["triton_native/matmul/speed/matmul_4096"].status == "met"
  slow = by_metric["triton_native/matmul/speed/matmul_8192"]
  assert slow.status == "not met" and "ours 3000 us, Triton's launcher 1500 us" in slow.explanation
  failed = by_metric["triton_native/attention/speed/attention_causal"]
  assert failed.status == "not measured" and failed.reason == "failed: CompileError: out of shared memory"
  assert by_metric["triton_native/rowwise/speed/softmax"].reason == "skipped: needs a GPU visible to both jax and torch"
  launch = by_metric["triton_native/launch/us_per_call/ours"]
  assert launch.status == "met" and launch.judged == pytest.approx(0.25)
  page = report.render(results)
  assert "## Triton kernels as users write them: our runtime against Triton's own launcher\n" in page
  assert ("| grouped matmul, 4096^3 fp16 | 196 (5612) | 200 (5500) | **0.98x** | TFLOP/s "
          "| M128 N256 K64 G8 w8 s3 / M128 N256 K64 G8 w8 s3 | 1.1e-03 / 1.2e-03 |") in page
  assert "| M128 N256 K64 G8 w8 s3 / M256 N128 K64 G8 w8 s3 (Triton at ours: 1600 us) |" in page
  assert "| flash attention fwd, causal, 4x32x4096x128 fp16 | n/a | n/a | n/a | CompileError: out of shared" in page
  assert "- rowwise: n/a: skipped: needs a GPU visible to both jax and torch" in page
  assert "Our side receives the decorated functions themselves" in page  # which way our side received the kernels
  assert "| ours / Triton | **0.25x** |" in page and "| Triton launcher, eager | 8 (7.5) |" in page


def test_a_failed_launch_measurement_is_the_goals_reason():
  failed = {"errors": {"ours": "AssertionError: launch chain: expected 200"}}
  results = {"results": {"triton_native": {"launch": failed}}}
  verdict = next(v for v in goals.verdicts(results) if v.goal.metric == "triton_native/launch/us_per_call/ours")
  assert verdict.reason == "failed: AssertionError: launch chain: expected 200"
  assert "Launch cost: n/a: AssertionError: launch chain: expected 200" in report.render(results)


def test_the_vs_jax_triton_rows_say_na_where_jax_triton_is_absent():
  side = {"lower_s": [1.7, 0.02], "stablehlo_bytes": 53000, "export_bytes": 25000,
          "target": "jax_mosaic_ffi_launch_v1", "attribute_bytes": 23000, "inflated_bytes": 107000,
          "ptx_images": 1, "cubin_images": 1}
  missing = "ModuleNotFoundError: No module named 'jax_triton' (jax-triton is not installed)"
  results = {"results": {"vs_jax_triton": {
      "lowering": {"jax_triton": {"error": missing},
                   "jmf": {name: {"first": side, "second": dict(side, lower_s=[0.6, 0.01])}
                           for name in ("matmul", "matmul_one", "softmax")}},
      "gpu": {"cases": {"matmul": {"us": {"jmf": 410.0}, "max_error": {"jmf": 1e-3}},
                        "softmax": {"us": {"jmf": 20.0}, "max_error": {"jmf": 1e-7}},
                        "add": {"us": {"jmf": 1.5}, "max_error": {"jmf": 0.0}}},
              "errors": {"jax_triton": missing}, "host": {"us_per_call": {"jmf": 2.0}, "chain": 200}},
  }}}
  page = report.render(results)
  assert "## jax-triton's triton_call, through jax-triton and through jax_mosaic_ffi\n" in page
  assert ("| grouped matmul 4096^3 fp16, @triton.autotune (6 configs) | jax_mosaic_ffi | 1.70 / 0.02 | 0.60 | 53 kB "
          "| 25 kB | 1 PTX, 1 cubin | `jax_mosaic_ffi_launch_v1`: attributes 23 kB, code 107 kB inflated |") in page
  assert "| fused softmax 4096x1024 fp32, @triton.heuristics | jax-triton | n/a | n/a |" in page
  assert "| grouped matmul 4096^3 fp16, @triton.autotune (6 configs) | n/a | 410 | n/a |" in page
  assert "| host cost per call, jitted chain of 200 adds (wall us) | n/a | 2 | n/a |" in page
  assert "- jax_triton: n/a: ModuleNotFoundError" in page


def test_the_vs_quack_jax_rows_show_each_sides_outcome():
  def side(target, code):
    fwd = {"lower_s": [0.3, 0.01], "targets": [target], "attribute_bytes": code}
    return {"forward": fwd, "grad": {"lower_s": [0.25, 0.01], "targets": [target], "attribute_bytes": code},
            "export_bytes": 1600 + code, "vmap": {"targets": [target], "attribute_bytes": code}}
  first = {"quack": side("quack_softmax_fwd_bf16_8192", 0), "jmf": side("jax_mosaic_ffi_cute_v1", 7200)}
  results = {"results": {"vs_quack_jax": {
      "lowering": {"versions": {"quack-kernels": "0.6.5"},
                   **{s: {"first": first[s], "second": first[s]} for s in ("quack", "jmf")}},
      "gpu": {"cases": {"forward": {"us": {"quack": 120.0, "jmf": 119.0}, "max_error": {}},
                        "grad": {"us": {"jmf": 300.0}, "max_error": {}}},
              "checks": {"vmap": {"quack": {"error": "ValueError: expected a 2-D tensor"},
                                  "jmf": {"max_error": 0.0039}},
                         "exported": {"quack": {"error": "XlaRuntimeError: no handler for quack_softmax_fwd"},
                                      "jmf": {"first_call_s": 0.2, "max_error": 0.0039}}},
              "errors": {"grad/quack": "TypeError: boom"}, "host": {"us_per_call": {"quack": 6.0, "jmf": 3.0}},
              "versions": {"jax": "0.11.2"}}}}}
  page = report.render(results)
  assert "| jax_mosaic_ffi | 0.30 / 0.01 | 0.30 | 0.25 / 0.25 | 8.8 kB | 7.2 kB in `jax_mosaic_ffi_cute_v1` |" in page
  assert "| quack.softmax_jax | 0.30 / 0.01 | 0.30 | 0.25 / 0.25 | 1.6 kB | 0.0 kB in `quack_softmax_fwd" in page
  assert "| softmax 16384x8192 bf16 | 120 | 119 | **1.01x** |" in page
  assert "| softmax forward + backward (`jax.grad`) 16384x8192 bf16 | n/a | 300 | n/a |" in page
  assert "| host cost per call, jitted chain of 200 softmaxes 256x1024 (wall us) | 6 | 3 | **2.00x** |" in page
  assert ("| `jax.vmap` over 4 softmaxes | fails: ValueError: expected a 2-D tensor | matches numpy (max error "
          "3.9e-03) |  |") in page
  assert "| exported forward, called in a fresh process | fails: XlaRuntimeError" in page
  assert "- grad/quack: n/a: TypeError: boom" in page


def test_the_fa4_attention_rows_compare_each_side_with_ours():
  results = {"results": {"fa4_attention": {"gpu": {
      "cases": {"causal_d128": {"us": {"fa4": 500.0, "ours": 500.0, "cudnn": 600.0},
                                "tflops": {"fa4": 550.0, "ours": 550.0, "cudnn": 458.3}, "max_error": {},
                                "grad": {"us": {"fa4": 2000.0, "ours": 1600.0, "cudnn": 2400.0},
                                         "tflops": {"fa4": 481.0, "ours": 601.0, "cudnn": 401.0}, "max_error": {}}},
                "causal_d64": {"us": {"ours": 200.0}, "tflops": {"ours": 344.0}, "max_error": {}}},
      "errors": {"causal_d64/fa4": "ModuleNotFoundError: No module named 'torch'",
                 "causal_d64/grad/ours": "AssertionError: the dQ is off by 1.0e+00 of its largest element"},
      "versions": {"jax": "0.11.2"}, "chain": 10, "rounds": 15}}}}
  page = report.render(results)
  forward, grad = page.split("Forward and backward (`grad`")
  assert ("| causal, batch 4, seqlen 4096, 16 heads, head dim 128, bf16 | 500 us, 550 TFLOP/s | 500 us, 550 TFLOP/s "
          "| 600 us, 458 TFLOP/s | **1.00x** | **1.20x** |") in forward
  assert ("| causal, batch 8, seqlen 2048, 16 heads, head dim 64, bf16 | n/a | 200 us, 344 TFLOP/s | n/a | n/a |"
          in forward)
  assert ("| causal, batch 4, seqlen 4096, 16 heads, head dim 128, bf16 | 2000 us, 481 TFLOP/s | 1600 us, 601 TFLOP/s "
          "| 2400 us, 401 TFLOP/s | **1.25x** | **1.50x** |") in grad
  assert "head dim 64" not in grad.split("\n- ")[0]  # no grad results for that case: no row
  assert "- causal_d64/fa4: n/a: ModuleNotFoundError" in page
  assert "- causal_d64/grad/ours: n/a: AssertionError: the dQ is off" in page


def test_the_pallas_ops_rows_compare_pallas_and_cudnn_with_ours():
  results = {"results": {"pallas_ops": {"gpu": {
      "cases": {"mha_causal_d128": {"forward": {"us": {"ours": 400.0, "pallas": 600.0, "cudnn": 380.0}},
                                    "grad": {"us": {"ours": 1200.0, "pallas": 3000.0}}},
                "softmax": {"forward": {"us": {"ours": 50.0}}}},
      "errors": {"softmax/pallas": "skipped: jax 0.12.1 ships no jax.experimental.pallas.ops.gpu.softmax"},
      "versions": {"jax": "0.11.2"}, "chain": 10, "rounds": 15}}}}
  page = report.render(results)
  assert ("| mha causal, batch 4, seqlen 4096, 16 heads, head dim 128 | 400 us | 600 us | 380 us | **1.50x** | "
          "**0.95x** |") in page
  assert ("| mha causal, batch 4, seqlen 4096, 16 heads, head dim 128 (forward + backward) | 1200 us | 3000 us | "
          "n/a | **2.50x** | n/a |") in page
  assert "| softmax, (16384, 4096) | 50 us | n/a | n/a | n/a | n/a |" in page
  assert "- softmax/pallas: n/a: skipped: jax 0.12.1 ships no" in page


def test_a_run_of_some_benchmarks_is_spliced_into_the_page(tmp_path, results):
  page = report.render(results)
  assert "## jax-triton's triton_call" not in page  # the full run had no such section: it goes before Runs
  later = {"date": "2026-12-05 10:00 UTC", "machine": results["machine"], "results": {
      "bandwidth": {"main": {"ratio": 0.5}},  # a section the page has, rendered from broken results
      "vs_jax_triton": {"lowering": {"jax_triton": {"error": "ModuleNotFoundError: no jax_triton"},
                                     "jmf": {"error": "boom"}}, "gpu": {"skipped": "no GPU"}}}}
  doc, raw = tmp_path / "benchmarks.md", tmp_path / "later.json"
  doc.write_text(page)
  raw.write_text(json.dumps(later))
  done = _python("-m", "benchmarks.report", str(raw), "--doc", str(doc), "--splice", "--no-figures", cwd=tmp_path)
  assert done.returncode == 0, done.stderr
  new = doc.read_text()
  origin = "*This section alone is from a later run of its benchmark, on 2026-12-05 10:00 UTC:"
  assert new.count(origin) == 2
  assert "## Memory-bound kernel\n\n" + origin in new and "Could not render these results: KeyError" in new
  assert new.index("## jax-triton's triton_call") < new.index("## Runs\n")
  # Its goal is this run's, marked so; everything else is the full run's, byte for byte.
  goal = "| Memory-bound kernel: at least 90% of device-to-device copy bandwidth |"
  assert _line(new, goal) == goal + " 0.5 | >= 0.9 | **not met** (later run, 2026-12-05 10:00 UTC) |"
  sections = lambda text: {s.split("\n", 1)[0]: s for s in ("\n" + text).split("\n## ")[1:]}  # noqa: E731
  before, after = sections(page), sections(new)
  assert new.startswith(page.split("\n## ")[0])
  assert after["Goals"].replace(_line(new, goal), _line(page, goal)) == before["Goals"]
  for title, text in before.items():
    if title not in ("Memory-bound kernel", "Goals"):
      assert after[title] == text, title
  assert set(after) - set(before) == {"jax-triton's triton_call, through jax-triton and through jax_mosaic_ffi"}
  assert new.endswith("\n") and "\n\n\n" not in new


def _line(page: str, start: str) -> str:
  [line] = [line for line in page.splitlines() if line.startswith(start)]
  return line


def test_a_spliced_run_brings_its_goals_runs_and_notes(results):
  # The full run's cb_on goal was not met (with its explanation); a later launch run meets it and adds a run row.
  # The page is older than the Gluon goals.
  page = "\n".join(line for line in report.render(results).split("\n") if not line.startswith("| Gluon"))
  goal = "| Command buffers on: a mosaic_kernel call costs at most XLA's own kernel |"
  assert "**not met**" in _line(page, goal) and "\n- Command buffers on: a mosaic_kernel call" in page
  later = {"date": "2026-12-06 19:00 UTC", "machine": results["machine"], "results": {
      "launch": {"cb_on": {"us_per_call": {"mosaic": 1.5, "xla_triton": 2.0}}},
      "gluon_native": {"launch": {"skipped": "no torch"}}},
      "runs": {"launch/cb_on": {"seconds": 12.5, "outcome": "ok", "optional": False},
               "gluon_native/launch": {"seconds": 1.0, "outcome": "skipped: no torch", "optional": False}}}
  new = report.spliced(page, later)
  assert _line(new, goal) == goal + " 1.5 vs 2 us (0.75x) | <= 1x | **met** (later run, 2026-12-06 19:00 UTC) |"
  assert "\n- Command buffers on: a mosaic_kernel call" not in new  # its explanation was the old verdict's
  assert "\n- Command buffers off:" in new  # another goal's stays
  # gluon_native's goals were not on the page: added at the end of the goals table, saying why unmeasured.
  goals_table = new.split("\n## Goals\n")[1].split("\n## ")[0]
  launch_goal = _line(new, "| Gluon kernel launches")
  assert "not measured (skipped: no torch) (later run, 2026-12-06 19:00 UTC)" in launch_goal
  table_lines = [line for line in goals_table.splitlines() if line.startswith("| ")]
  assert [line[:20] for line in table_lines[-2:]] == ["| Gluon kernel launc", "| Gluon TMA kernel l"]
  gemm = sum(g.metric.startswith("gluon_native/gemm/") for g in goals.GOALS)  # of a run not in this one
  assert gemm and len(table_lines) == 2 + len(goals.GOALS) - gemm
  runs = new.split("\n## Runs\n")[1]
  assert _line(runs, "| launch/cb_on |") == "| launch/cb_on | 12.5 | ok (later run, 2026-12-06 19:00 UTC) |"
  assert _line(runs, "| gluon_native/launch |").endswith("| skipped: no torch (later run, 2026-12-06 19:00 UTC) |")
  assert _line(runs, "| launch/cb_off |") == _line(page.split("\n## Runs\n")[1], "| launch/cb_off |")
  assert new.endswith("\n") and "\n\n\n" not in new
