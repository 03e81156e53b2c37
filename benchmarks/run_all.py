"""Runs every benchmark, prints the tables, writes docs/benchmarks.md and a plot.

    python benchmarks/run_all.py [--out DIR] [--only launch,bandwidth,sites,compile]

Each benchmark runs in a process of its own (XLA reads its flags once) and
reports a RESULT line; comparisons are ratios inside one run.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DOC = os.path.join(REPO, "docs", "benchmarks.md")


def run(script, *args, env=None):
  command = [sys.executable, os.path.join(HERE, script), *args]
  print(f"== {script} {' '.join(args)}", flush=True)
  result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tempfile.gettempdir(),
                          env={**os.environ, **(env or {})})
  lines = [l for l in result.stdout.splitlines() if l.startswith("RESULT ")]
  if result.returncode != 0 or not lines:
    print(result.stdout[-2000:], result.stderr[-4000:], sep="\n")
    return {"error": (result.stderr or result.stdout)[-1500:]}
  return json.loads(lines[-1][len("RESULT "):])


def machine():
  info = {"python": platform.python_version(), "host": platform.node()}
  try:
    import jax
    import jaxlib
    info["jax"] = jax.__version__
    info["jaxlib"] = jaxlib.__version__
    devices = jax.devices()
    info["device"] = devices[0].device_kind if devices else "none"
  except Exception as e:
    info["device"] = f"unknown ({e})"
  try:
    from cuda.bindings import driver
    driver.cuInit(0)
    info["driver_cuda"] = driver.cuDriverGetVersion()[1]
  except Exception:
    pass
  try:
    from jax_mosaic_ffi import compiler
    info["nvrtc"] = "%d.%d" % compiler.nvrtc_version()
  except Exception:
    pass
  return info


def fmt(v, digits=2):
  return "n/a" if v is None else f"{v:.{digits}f}"


LAUNCH_PATHS = ["raw CUDA graph", "raw stream launches", "raw stream launches (host wall)", "mosaic_kernel", "mosaic_kernel (staged prepare)",
                "plain jax.ffi call", "XLA custom call, empty handler", "XLA kernel (Pallas/Triton)",
                "mosaic_gpu_v2 (Pallas/Mosaic GPU)"]


def launch_table(on, off):
  rows = ["| path | command buffers on (us/call) | off (us/call) |", "|---|---:|---:|"]
  for path in LAUNCH_PATHS:
    rows.append(f"| {path} | {fmt(on.get(path))} | {fmt(off.get(path))} |")
  ratios = ["", "| ratio (mosaic_kernel / other) | on | off |", "|---|---:|---:|"]
  for path in LAUNCH_PATHS:
    if path == "mosaic_kernel":
      continue
    r_on = on["mosaic_kernel"] / on[path] if on.get(path) and on.get("mosaic_kernel") else None
    r_off = off["mosaic_kernel"] / off[path] if off.get(path) and off.get("mosaic_kernel") else None
    ratios.append(f"| vs {path} | {fmt(r_on)} | {fmt(r_off)} |")
  errors = sorted({f"- {k}: {v.strip().splitlines()[-1]}" for r in (on, off) for k, v in r.items()
                   if k.endswith("error")})
  return "\n".join(rows + ratios + ([""] + errors if errors else []) + ["", *goals(on, off)])


def goals(on, off):
  """The launch goals of issue 7, judged on this run's numbers."""
  lines = ["### Against the goals", ""]
  ours_on, xla_on = on.get("mosaic_kernel"), on.get("XLA kernel (Pallas/Triton)")
  if ours_on and xla_on:
    verdict = "met" if ours_on <= xla_on * 1.02 else "not met"
    line = (f"- Command buffers on, at most XLA's own kernel: {fmt(ours_on)} vs {fmt(xla_on)} us "
            f"({fmt(ours_on / xla_on)}x): **{verdict}**.")
    graph_on, empty_on = on.get("raw CUDA graph"), on.get("XLA custom call, empty handler")
    if verdict == "not met" and graph_on and empty_on:
      line += (f" Both are kernel nodes of the graph ({fmt(graph_on)} us each in a raw graph). XLA refreshes "
               f"its own kernel's node itself, but reaches a custom call's node only through an FFI call on "
               f"every execution, and an FFI call that does nothing costs {fmt(empty_on)} us here. So "
               f"mosaic_kernel = node {fmt(graph_on)} + XLA's FFI call {fmt(empty_on)} + "
               f"{fmt(ours_on - graph_on - empty_on)} us in our handler (which skips the node update when no "
               f"address changed). A plain FFI call, captured instead of recorded, costs "
               f"{fmt(on.get('plain jax.ffi call'))} us.")
    lines.append(line)
  ours_off, host_off, gpu_off = (off.get(k) for k in (
      "mosaic_kernel", "raw stream launches (host wall)", "raw stream launches"))
  xla_off, empty_off = off.get("XLA kernel (Pallas/Triton)"), off.get("XLA custom call, empty handler")
  if ours_off and host_off:
    verdict = "met" if ours_off <= 1.1 * host_off else "not met"
    line = (f"- Command buffers off, at most 1.1x raw stream launches: {fmt(ours_off)} vs {fmt(host_off)} us "
            f"launched from the host ({fmt(ours_off / host_off)}x): **{verdict}**.")
    if verdict == "not met" and xla_off and empty_off and gpu_off:
      line += (f" Launched one at a time by XLA's thunk loop, every kernel costs about the same: XLA's own "
               f"kernel {fmt(xla_off)} us, a plain FFI call {fmt(off.get('plain jax.ffi call'))} us, ours "
               f"{fmt(ours_off)} us ({fmt(ours_off / xla_off)}x XLA's kernel); a custom call that launches "
               f"nothing costs {fmt(empty_off)} us. The rest is the launch as XLA's thread sees it, which the "
               f"raw loop (GPU-side floor {fmt(gpu_off)} us) does not pay in the same way; command buffers "
               "(XLA's default) remove it.")
    lines.append(line)
  return lines


def plot(on, off, path):
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  names = [p for p in LAUNCH_PATHS if on.get(p) is not None or off.get(p) is not None]
  fig, ax = plt.subplots(figsize=(9, 4.5))
  y = range(len(names))
  ax.barh([i - 0.2 for i in y], [on.get(n) or 0 for n in names], height=0.4, label="command buffers on")
  ax.barh([i + 0.2 for i in y], [off.get(n) or 0 for n in names], height=0.4, label="command buffers off")
  ax.set_yticks(list(y), names)
  ax.invert_yaxis()
  ax.set_xlabel("microseconds per call (trivial kernel, chain of 200 in one jit)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None, help="also copy the plot and raw results here")
  parser.add_argument("--only", default="launch,bandwidth,sites,compile,allreduce")
  args = parser.parse_args()
  only = set(args.only.split(","))
  results = {"machine": machine(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
  kernel_cache = tempfile.mkdtemp(prefix="jmf-bench-cache-")
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": kernel_cache, "JAX_MOSAIC_FFI_POISON_OUTPUTS": "0"}
  if "launch" in only:
    results["launch_on"] = run("launch_overhead.py", "--command-buffers", "on", env=env)
    results["launch_off"] = run("launch_overhead.py", "--command-buffers", "off", env=env)
  if "bandwidth" in only:
    results["bandwidth"] = run("bandwidth.py", env=env)
  if "sites" in only:
    results["sites"] = run("call_site_costs.py", env=env)
  if "compile" in only:
    results["compile"] = run("compile_cache.py", env=env)
  if "allreduce" in only:
    results["allreduce"] = run("allreduce_latency.py", env=env)

  m = results["machine"]
  sections = [f"# Benchmarks\n\nWritten by `python benchmarks/run_all.py` on {results['date']}: "
              f"{m.get('device')} (driver CUDA {m.get('driver_cuda', '?')}), jax {m.get('jax')}, "
              f"jaxlib {m.get('jaxlib')}, NVRTC {m.get('nvrtc')}, Python {m.get('python')}.\n"
              "Every comparison is a ratio of numbers measured in the same run.\n"]
  on, off = results.get("launch_on", {}), results.get("launch_off", {})
  if on or off:
    sections.append("## Launch overhead\n\nPer-call time of a trivial kernel (256 floats, +1) in a jitted chain "
                    "of 200 calls: host wall time of the whole call over 200, median of 40 rounds with the paths "
                    "interleaved. The raw rows launch the same cubin through the driver (cuda-python): \"raw stream "
                    "launches\" and \"raw CUDA graph\" are timed on the GPU behind a spin kernel, so host speed does "
                    "not count (the floor); \"host wall\" is the same 200 launches timed on the host, as a jitted "
                    "chain is.\n\n" + launch_table(on, off) +
                    f"\n\nRegistration: {on.get('registration', off.get('registration', '?'))}\n")
    image = plot(on, off, os.path.join(REPO, "docs", "launch_overhead.png"))
    if image:
      sections.append("![per-call time by path](launch_overhead.png)\n")
      if args.out:
        import shutil
        shutil.copy(image, args.out)
  bw = results.get("bandwidth")
  if bw:
    sections.append("## Memory-bound kernel\n\n" + ("error: " + bw["error"] if "error" in bw else
                    "| | time (ms) | GB/s |\n|---|---:|---:|\n"
                    f"| vector add 1 GiB (mosaic_kernel; 3 GiB moved) | {fmt(bw['vector_add_ms'], 3)} | "
                    f"{fmt(bw['vector_add_GBps'], 0)} |\n| cuMemcpyDtoD 1 GiB (2 GiB moved) | {fmt(bw['copy_ms'], 3)} | "
                    f"{fmt(bw['copy_GBps'], 0)} |\n\nRatio (vector add / copy bandwidth): **{fmt(bw['ratio'], 3)}** "
                    f"(goal >= 0.90: {'met' if bw['ratio'] >= 0.9 else 'not met'})\n"))
  sites = results.get("sites")
  if sites:
    sections.append("## Per call site\n\n" + ("error: " + sites["error"] if "error" in sites else
                    "| cost | value |\n|---|---:|\n"
                    f"| XLA compile + instantiate per extra call site | {fmt(sites['instantiate_per_call_site_us'], 1)} us |\n"
                    f"| the same for a plain FFI call (no instantiate) | {fmt(sites['plain_ffi_per_call_site_us'], 1)} us |\n"
                    f"| of which our instantiate handler (timed inside it) | {fmt(sites['instantiate_handler_us'], 1)} us |\n"
                    f"| first run of a fresh kernel (module load in prepare) | {fmt(sites['first_run_extra_us'], 1)} us |\n"
                    f"| NVRTC compile, trivial kernel, cold | {fmt(sites['nvrtc_cold_compile_ms'], 1)} ms |\n"
                    f"| same compile, in-memory hit | {fmt(sites['nvrtc_memory_hit_us'], 1)} us |\n"))
  compile_ = results.get("compile")
  if compile_:
    sections.append("## Compile caches\n\n" + ("error: " + compile_["error"] if "error" in compile_ else
                    f"`benchmarks/kernels/fused_mlp.cu` ({compile_['kernel_lines']} lines), `jmf.cuda_kernel` alone, "
                    "medians of 3 fresh processes each.\n\n| path | time | goal |\n|---|---:|---|\n"
                    f"| cold (NVRTC) | {fmt(compile_['cold_ms'], 1)} ms | |\n"
                    f"| warm from disk, fresh process | {fmt(compile_['warm_disk_ms'], 2)} ms "
                    f"({fmt(100 * compile_['warm_over_cold'], 1)}% of cold) | <= 5% of cold |\n"
                    f"| in-process hit | {fmt(compile_['memory_hit_us'], 1)} us | <= 50 us |\n"))
  allreduce = results.get("allreduce")
  if allreduce and "rows" in allreduce:
    table = ["| bytes per device | one-shot all-reduce (us) | psum / NCCL (us) | speedup |", "|---:|---:|---:|---:|"]
    table += [f"| {r['bytes']} | {fmt(r['ours_us'])} | {fmt(r['psum_us'])} | {fmt(r['speedup'])} |"
              for r in allreduce["rows"]]
    sections.append(f"## One-shot all-reduce on {allreduce['devices']} GPUs\n\nGoal: at least 2x faster than psum "
                    "at 256 KiB and below.\n\n" + "\n".join(table) + "\n")
  elif allreduce:
    sections.append("## One-shot all-reduce\n\nNot run: " + allreduce.get("skipped", allreduce.get("error", "?"))[-300:] + "\n")
  text = "\n".join(sections)
  os.makedirs(os.path.dirname(DOC), exist_ok=True)
  with open(DOC, "w") as f:
    f.write(text)
  if args.out:
    with open(os.path.join(args.out, "bench.json"), "w") as f:
      json.dump(results, f, indent=1)
  print(text)


if __name__ == "__main__":
  main()
