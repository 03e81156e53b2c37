"""The goals the benchmarks are judged by: one table of data, and its verdicts.

A metric is a path into the results, "benchmark/run/key/...". With a
baseline, the verdict is on metric / baseline (a ratio within one run).
`explain_unmet` is a template for when a goal is not met, formatted with
value, baseline, ratio, threshold and the names in `context` (paths too),
each already formatted as a number.
"""

from __future__ import annotations

import dataclasses
import operator

from benchmarks.markdown import failure, last_line, sig, table

COMPARE = {"<=": operator.le, ">=": operator.ge}


@dataclasses.dataclass(frozen=True)
class Goal:
  name: str
  metric: str
  compare: str  # a key of COMPARE
  threshold: float
  baseline: str | None = None
  unit: str = ""
  explain_unmet: str = ""
  context: dict = dataclasses.field(default_factory=dict)


GOALS = (
    Goal("Command buffers on: a mosaic_kernel call costs at most XLA's own kernel",
         metric="launch/cb_on/us_per_call/mosaic", baseline="launch/cb_on/us_per_call/xla_triton",
         compare="<=", threshold=1.0, unit="us",
         explain_unmet=(
             "GPU time per call (clock stamps around the chain): ours {gpu} us, XLA's {xla_gpu} us. Host time per "
             "execution of the chain of 200 in XLA's own prepare phase: ours {prepare} us, XLA's {xla_prepare} us, "
             "a custom call that does nothing {empty_prepare} us; after the graph launch: ours {after} us, XLA's "
             "{xla_after} us. XLA spends this on every custom call, not on its own kernels; launch_parity.md has "
             "the measurements."),
         context={"gpu": "launch/cb_on/gpu_us_per_call/mosaic", "xla_gpu": "launch/cb_on/gpu_us_per_call/xla_triton",
                  "prepare": "launch/cb_on_phases/phases_us_per_execution/mosaic/prepare",
                  "xla_prepare": "launch/cb_on_phases/phases_us_per_execution/xla_triton/prepare",
                  "empty_prepare": "launch/cb_on_phases/phases_us_per_execution/empty_ffi/prepare",
                  "after": "launch/cb_on_phases/phases_us_per_execution/mosaic/after",
                  "xla_after": "launch/cb_on_phases/phases_us_per_execution/xla_triton/after"}),
    Goal("Command buffers off: a mosaic_kernel call costs at most XLA's own kernel",
         metric="launch/cb_off/us_per_call/mosaic", baseline="launch/cb_off/us_per_call/xla_triton",
         compare="<=", threshold=1.0, unit="us",
         explain_unmet=(
             "Without PDL ({no_pdl} us) our launch cannot start before the previous kernel ends; XLA launches "
             "its own kernels with PDL. See the PDL table for what each flag changes."),
         context={"no_pdl": "launch/cb_off/us_per_call/mosaic_no_pdl"}),
    Goal("Command buffers off: at most 1.1x raw stream launches timed on the host",
         metric="launch/cb_off/us_per_call/mosaic", baseline="launch/cb_off/us_per_call/raw_stream_host",
         compare="<=", threshold=1.1, unit="us",
         explain_unmet=(
             "Launched one at a time by XLA's thunk loop, every kernel costs about the same: XLA's own kernel "
             "{xla} us, a plain FFI call {plain} us; a custom call that launches nothing costs {empty} us. The "
             "rest is the launch as XLA's thread sees it, which the raw loop (GPU-side floor {floor} us) does "
             "not pay in the same way; command buffers (XLA's default) remove it."),
         context={"xla": "launch/cb_off/us_per_call/xla_triton", "plain": "launch/cb_off/us_per_call/plain_ffi",
                  "empty": "launch/cb_off/us_per_call/empty_ffi", "floor": "launch/cb_off/us_per_call/raw_stream"}),
    Goal("Memory-bound kernel: at least 90% of device-to-device copy bandwidth",
         metric="bandwidth/main/ratio", compare=">=", threshold=0.90),
    Goal("Compile, warm from disk in a fresh process: at most 5% of a cold compile",
         metric="compile/main/warm_disk_ms", baseline="compile/main/cold_ms", compare="<=", threshold=0.05,
         unit="ms"),
    Goal("Compile, in-process hit: at most 50 us",
         metric="compile/main/memory_hit_us", compare="<=", threshold=50, unit="us"),
    Goal("Typed parameter check: under 1 ms per new call signature (median of 60 new shapes)",
         metric="compile/main/typed_check_us", compare="<=", threshold=1000, unit="us"),
    *(Goal(f"Cold start with a kernel pack ({what}): a fresh process reaches its first result in at most 1.2x a "
           "warm disk cache's time (the slowest workload)",
           metric=f"cold_start/{run}/pack_over_warm", compare="<=", threshold=1.2,
           explain_unmet="The cold-start table's rows say which workload is slow and by how much.")
      for run, what in (("main", "CUDA corpus, autotuned Triton matmul"), ("dsl", "Gluon, CuTe DSL, FA4, quack"))),
    *(Goal(f"Cold start with a kernel pack ({what}): nothing compiled and nothing tuned (strict mode)",
           metric=f"cold_start/{run}/pack_compiles", compare="<=", threshold=0)
      for run, what in (("main", "CUDA corpus, autotuned Triton matmul"), ("dsl", "Gluon, CuTe DSL, FA4, quack"))),
    Goal("Cold NVRTC compile: at most 1.25x NVRTC alone on the same source (the slower of a small kernel and one "
         "including cuda_fp16.h, cuda_bf16.h and cooperative groups)",
         metric="cold_start/compilers/nvrtc_over_alone", compare="<=", threshold=1.25,
         explain_unmet="The compilers table under the cold-start section has both kernels' times."),
    Goal("Autotuned Triton matmul: a second process reaches its first result in at most 10% of the first's time",
         metric="autotune/main/second/triton/first_result_s", baseline="autotune/main/first/triton/first_result_s",
         compare="<=", threshold=0.10, unit="s"),
    Goal("One-shot all-reduce: at least 2x faster than psum at 256 KiB and below (slowest size)",
         metric="allreduce/main/min_speedup_small", compare=">=", threshold=2.0),
    Goal("Hopper GEMM (TMA descriptors built by the runtime): at least 0.9x cuBLAS at 8192, bf16",
         metric="gemm/cb_off/tflops_8192/ours", baseline="gemm/cb_off/tflops_8192/cublas",
         compare=">=", threshold=0.9, unit="TFLOP/s",
         explain_unmet=(
             "Our kernel is one CTA per 128 x 256 tile, not persistent, with a register-to-global epilogue: "
             "the tensor cores idle while a tile's results are stored and the next CTA fills its pipeline. "
             "docs/benchmarks.md says what would close the gap.")),
    *(Goal(f"Triton kernel as users write it, {label}: at least 0.97x Triton's own launcher (GPU time)",
           metric=f"triton_native/{run}/speed/{case}", compare=">=", threshold=0.97,
           explain_unmet=("GPU time per call: ours {ours} us, Triton's launcher {triton} us. The table below has "
                          "both autotuners' winners and, where they differ, Triton's launcher at ours."),
           context={"ours": f"triton_native/{run}/cases/{case}/us/ours",
                    "triton": f"triton_native/{run}/cases/{case}/us/triton"})
      for run, case, label in (("matmul", "matmul_4096", "grouped matmul 4096"),
                               ("matmul", "matmul_8192", "grouped matmul 8192"),
                               ("attention", "attention", "flash attention"),
                               ("attention", "attention_causal", "causal flash attention"),
                               ("rowwise", "softmax", "fused softmax"),
                               ("rowwise", "layer_norm", "layer norm fwd + bwd"))),
    *(Goal(f"Gluon kernel as Triton's tutorials write it, {label}: at least 0.98x Triton's own launcher (GPU time)",
           metric=f"gluon_native/gemm/speed/{case}", compare=">=", threshold=0.98,
           explain_unmet="GPU time per call: ours {ours} us, Triton's launcher {triton} us.",
           context={"ours": f"gluon_native/gemm/cases/{case}/us/ours",
                    "triton": f"gluon_native/gemm/cases/{case}/us/triton"})
      for case, label in (("pipelined_4096", "05-wgmma GEMM 4096"), ("ring_4096", "07-persistence ring GEMM 4096"),
                          ("ring_8192", "07-persistence ring GEMM 8192"))),
    Goal("Gluon kernel launches: a call inside jit costs the host less than Triton's eager launch",
         metric="gluon_native/launch/us_per_call/ours", baseline="gluon_native/launch/us_per_call/triton_eager",
         compare="<=", threshold=1.0, unit="us"),
    Goal("Gluon TMA kernel launches (a host descriptor): a call inside jit costs the host less than Triton's eager "
         "launch, which builds and encodes the descriptor per call",
         metric="gluon_native/launch/tma/us_per_call/ours",
         baseline="gluon_native/launch/tma/us_per_call/triton_eager", compare="<=", threshold=1.0, unit="us"),
    Goal("Triton kernel launches: a call inside jit costs the host no more than Triton's eager launch",
         metric="triton_native/launch/us_per_call/ours", baseline="triton_native/launch/us_per_call/triton_eager",
         compare="<=", threshold=1.0, unit="us"),
    *(Goal(f"CuTe DSL kernel as users write it, {label}: at least 0.98x the DSL's own launch (GPU time)",
           metric=f"cute_native/{run}/speed/{case}", compare=">=", threshold=0.98,
           explain_unmet=("GPU time per call: ours {ours} us, the DSL's launcher (cute.compile on torch tensors) "
                          "{dsl} us."),
           context={"ours": f"cute_native/{run}/cases/{case}/us/ours", "dsl": f"cute_native/{run}/cases/{case}/us/dsl"})
      for run, case, label in (("rowwise", "axpy", "axpy"), ("rowwise", "rmsnorm", "RMSNorm"),
                               ("gemm", "gemm_4096", "Hopper GEMM 4096"), ("gemm", "gemm_8192", "Hopper GEMM 8192"))),
    Goal("CuTe DSL kernel launches: a call inside jit costs the host no more than cutlass_call's",
         metric="cute_native/launch/us_per_call/ours", baseline="cute_native/launch/us_per_call/cutlass_call",
         compare="<=", threshold=1.0, unit="us"),
    Goal("CuTe Hopper GEMM, warm in a fresh process: first result in at most 5% of a cold process's time",
         metric="cute_native/warm_start/warm_s/ours", baseline="cute_native/warm_start/cold_s/ours",
         compare="<=", threshold=0.05, unit="s"),
    *(Goal(f"cuTile sample through cutile_jax, {label}: at least 1.00x cuda.tile.jax's own launcher (GPU time)",
           metric=f"cutile_native/samples/speed/{case}", compare=">=", threshold=1.0,
           explain_unmet="GPU time per call: ours {ours} us, cuda.tile.jax.cutile_call {theirs} us.",
           context={"ours": f"cutile_native/samples/cases/{case}/us/ours",
                    "theirs": f"cutile_native/samples/cases/{case}/us/theirs"})
      for case, label in (("vector_add", "vector add"), ("softmax", "softmax"), ("matmul", "matmul"),
                          ("layer_norm", "layer norm"))),
    *(Goal(f"cuTile kernel launches, {label}: a call inside jit costs the host less than cuda.tile.jax's",
           metric=f"cutile_native/{run}/us_per_call/ours", baseline=f"cutile_native/{run}/us_per_call/theirs",
           compare="<=", threshold=1.0, unit="us")
      for run, label in (("launch", "command buffers on"), ("launch_cb_off", "command buffers off"))),
    *(Goal(f"cuTile cold compile, {case}: no slower than cuTile's export_kernel alone (sm_90, every cache empty)",
           metric=f"cutile_native/compile/compile/{case}/s/ours",
           baseline=f"cutile_native/compile/compile/{case}/s/export_kernel", compare="<=", threshold=1.0, unit="s",
           explain_unmet=("Each compile runs in a child forked for it, so that JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S can "
                          "stop it: a forked compile that does nothing costs {fork} s here, and ours without the "
                          "bound (=0, no fork) {unbounded} s against export_kernel's {baseline} s."),
           context={"fork": f"cutile_native/compile/compile/{case}/s/fork",
                    "unbounded": f"cutile_native/compile/compile/{case}/s/unbounded"})
      for case in ("vector_add", "softmax", "matmul", "layer_norm")),
    *(Goal(f"FlashAttention-4's Hopper {label} through jmf.cute_call: at least 0.98x FA4's own launcher (GPU time)",
           metric=f"fa4_attention/gpu/cases/{case}/us/fa4", baseline=f"fa4_attention/gpu/cases/{case}/us/ours",
           compare=">=", threshold=0.98, unit="us")
      for case, label in (("causal_d128", "forward, causal"), ("full_d128", "forward"))),
    Goal("FlashAttention-4's Hopper forward + backward through jmf.cute_call and jmf.differentiable: at least 0.95x "
         "FA4's own launcher and torch autograd (GPU time, causal)",
         metric="fa4_attention/gpu/cases/causal_d128/grad/us/fa4",
         baseline="fa4_attention/gpu/cases/causal_d128/grad/us/ours", compare=">=", threshold=0.95, unit="us"),
    Goal("quack's softmax through jmf.cute_call: at least 0.98x quack's own JAX binding (GPU time)",
         metric="vs_quack_jax/gpu/cases/forward/us/quack", baseline="vs_quack_jax/gpu/cases/forward/us/jmf",
         compare=">=", threshold=0.98, unit="us"),
    Goal("quack's softmax through jmf.cute_call: a call inside jit costs the host no more than quack's binding",
         metric="vs_quack_jax/gpu/host/us_per_call/jmf", baseline="vs_quack_jax/gpu/host/us_per_call/quack",
         compare="<=", threshold=1.0, unit="us"),
)


@dataclasses.dataclass(frozen=True)
class Verdict:
  goal: Goal
  value: float | None
  baseline: float | None
  judged: float | None  # the value the threshold applies to
  status: str  # "met", "not met" or "not measured"
  reason: str = ""  # why not measured
  explanation: str = ""


def lookup(results: dict, path: str) -> tuple[float | None, str]:
  """The number at `path` in results["results"], or None and why it is missing."""
  keys = path.split("/")
  node, run = results.get("results", {}), None
  for depth, key in enumerate(keys):
    if not isinstance(node, dict) or node.get(key) is None:
      return None, _missing(node, run, keys, depth)
    node = node[key]
    if depth == 1:
      run = node
  if isinstance(node, (int, float)) and not isinstance(node, bool):
    return float(node), ""
  return None, f"{path} is not a number"


def _missing(node, run, keys: list[str], depth: int) -> str:
  if depth < 2:
    return f"{'/'.join(keys[:depth + 1])} was not run"
  reason = failure(run) if isinstance(run, dict) else None  # the whole run failed or was skipped
  errors = run.get("errors", {}) if isinstance(run, dict) else {}
  if not reason and keys[-1] in errors:  # that one path failed, the run went on
    reason = "failed: " + last_line(errors[keys[-1]])
  return reason or f"{'/'.join(keys)} is not in the results"


def judge(goal: Goal, results: dict) -> Verdict:
  value, why = lookup(results, goal.metric)
  baseline, why_baseline = lookup(results, goal.baseline) if goal.baseline else (None, "")
  judged = value if not goal.baseline else (value / baseline if value is not None and baseline else None)
  if judged is None:
    return Verdict(goal, value, baseline, None, "not measured", why or why_baseline)
  met = COMPARE[goal.compare](judged, goal.threshold)
  explanation = "" if met or not goal.explain_unmet else _explain(goal, results, value, baseline, judged)
  return Verdict(goal, value, baseline, judged, "met" if met else "not met", "", explanation)


def _explain(goal: Goal, results: dict, value, baseline, judged) -> str:
  names = {name: sig(lookup(results, path)[0]) for name, path in goal.context.items()}
  return goal.explain_unmet.format(value=sig(value), baseline=sig(baseline), ratio=sig(judged),
                                   threshold=sig(goal.threshold), **names)


def verdicts(results: dict, runs=None) -> list[Verdict]:
  """The verdict of every goal, or of those whose metric is in one of `runs` ("benchmark/run") only."""
  return [judge(goal, results) for goal in GOALS if runs is None or "/".join(goal.metric.split("/")[:2]) in runs]


def rows(results: dict, runs=None) -> tuple[list[list[str]], list[str]]:
  """The goals table's rows and the explanations of unmet goals (Markdown list items), as `verdicts` chooses."""
  rows, notes = [], []
  for v in verdicts(results, runs):
    unit = f" {v.goal.unit}" if v.goal.unit else ""
    if v.goal.baseline:
      measured = f"{sig(v.value)} vs {sig(v.baseline)}{unit} ({sig(v.judged)}x)"
      target = f"{v.goal.compare} {sig(v.goal.threshold)}x"
    else:
      measured, target = f"{sig(v.value)}{unit}", f"{v.goal.compare} {sig(v.goal.threshold)}{unit}"
    verdict = f"**{v.status}**" if v.status != "not measured" else f"not measured ({v.reason})"
    rows.append([v.goal.name, measured if v.status != "not measured" else "n/a", target, verdict])
    if v.explanation:
      notes.append(f"- {v.goal.name}: {v.explanation}")
  return rows, notes


def section(results: dict) -> str:
  """The goals table and the explanations of unmet goals, as Markdown."""
  goal_rows, notes = rows(results)
  text = ("Each goal is read from this run's results by goals.GOALS; a ratio compares two numbers of the "
          "same process.\n\n" + table(["goal", "measured", "target", "verdict"], goal_rows, "lrll"))
  return text + ("\n\n" + "\n".join(notes) if notes else "")
