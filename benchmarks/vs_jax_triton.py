"""The same `triton_call` code through jax-triton and through jax_mosaic_ffi (`jax_mosaic_ffi.jax_triton`).

One function per kernel, written once against a module `jt` (`jt.triton_call(...)`, as a jax-triton user writes
it), is given `jax_triton` and then `jax_mosaic_ffi.jax_triton`: the switch is the import line. The kernels are
kernels/triton_user.py's grouped matmul (@triton.autotune, 6 configs, strides as arguments) and fused softmax
(@triton.heuristics), and a one-line add for the host cost.

- `lowering` (no GPU needed; compute_capability=90 on both sides): per side, a first process with empty
  caches (ours and Triton's) and a second with the first one's disk cache. Each lowers every kernel for CUDA
  twice (a new function the second time, so jax traces again and only the libraries' own caches can hit),
  then exports it: the lowering times (which include every compile, and on a GPU our autotuning), the
  StableHLO's size, the serialized `jax.export` artifact's size, and what the custom call carries.
- `gpu`: in one process, both sides' results checked against numpy, then GPU time per call (the GPU clock
  around a jitted chain of calls, medians of interleaved rounds) and host cost per call (wall time of a jitted
  chain of 200 small adds); then, checked only, the tutorial's softmax, whose output parameter comes before its
  input (jax-triton binds a kernel's pointers as all inputs, then the outputs).

jax-triton 0.4.1 needs Triton >= 3.7 and jax < 0.12 (it cannot lower under jit with 0.12); where it does not
import, its columns are n/a. By hand, one side at a time, printing JSON:

    python -m benchmarks.vs_jax_triton lowering jax_triton|jmf matmul|matmul_one|softmax
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
import zlib

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, sig, table
from benchmarks.suite import Run, json_child

NAME = "vs_jax_triton"
TITLE = "jax-triton's triton_call, through jax-triton and through jax_mosaic_ffi"
ORDER = 58
RUNS = (Run("lowering", kwargs={"which": "lowering"}, timeout_s=600.0, optional=True),
        Run("gpu", kwargs={"which": "gpu"}, timeout_s=300.0, optional=True))

LOWERED = ("matmul", "matmul_one", "softmax")
SIDES = ("jax_triton", "jmf")
MATMUL = 4096                # M = N = K, fp16
ROWS, COLS = 4096, 1024      # softmax, fp32
ADD = 1024                   # floats per add, for the host cost
CHAIN = 200                  # adds per jitted chain
CASES = {"matmul": f"grouped matmul {MATMUL}^3 fp16, @triton.autotune (6 configs)",
         "matmul_one": "the same matmul at its first config (constexprs given, no autotune)",
         "softmax": f"fused softmax {ROWS}x{COLS} fp32, @triton.heuristics",
         "softmax_output_first": "the same softmax with the output parameter first (the tutorial's order), the "
                                 "input by keyword",
         "add": f"add one, {ADD} floats"}


def _kernels():
  from benchmarks.kernels import triton_user
  return triton_user


def jt_module(side: str):
  """The module a user's code calls `triton_call` on: jax-triton's, or ours under the same names."""
  if side == "jax_triton":
    import jax_triton
    return jax_triton
  import jax_mosaic_ffi.jax_triton
  return jax_mosaic_ffi.jax_triton


def call(name: str, jt):
  """(function, avals) of one case, written once for either `jt`: a jax-triton user's code."""
  import jax
  import jax.numpy as jnp
  import triton
  K = _kernels()
  if name == "matmul":
    n = MATMUL
    aval = jax.ShapeDtypeStruct((n, n), jnp.float16)

    def matmul(a, b):  # c_ptr, the third parameter, is left without an argument: the output
      return jt.triton_call(a, b, kernel=K.matmul_kernel, out_type=aval, compute_capability=90,
                            grid=lambda meta: (triton.cdiv(n, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),),
                            M=n, N=n, K=n, stride_am=n, stride_ak=1, stride_bk=n, stride_bn=1, stride_cm=n,
                            stride_cn=1)
    return matmul, (aval, aval)
  if name == "matmul_one":  # the undecorated function at MATMUL_CONFIGS[0], for a lowering of one config each
    n, config = MATMUL, K.MATMUL_CONFIGS[0]
    aval = jax.ShapeDtypeStruct((n, n), jnp.float16)

    def matmul_one(a, b):
      return jt.triton_call(a, b, kernel=K.matmul_kernel.fn, out_type=aval, compute_capability=90,
                            grid=lambda meta: (triton.cdiv(n, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),),
                            num_warps=config.num_warps, num_stages=config.num_stages, M=n, N=n, K=n, stride_am=n,
                            stride_ak=1, stride_bk=n, stride_bn=1, stride_cm=n, stride_cn=1, **config.kwargs)
    return matmul_one, (aval, aval)
  if name == "softmax":
    rows = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)

    def softmax(x):  # output_ptr, after input_ptr, is left without an argument
      return jt.triton_call(x, input_row_stride=COLS, output_row_stride=COLS, n_rows=ROWS, n_cols=COLS,
                            kernel=K.softmax_kernel_output_last, out_type=rows, compute_capability=90, grid=(ROWS,),
                            num_warps=8)
    return softmax, (rows,)
  if name == "softmax_output_first":  # the tutorial's order: the output parameter before the input
    rows = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)

    def softmax_output_first(x):  # output_ptr, the first parameter, is left without an argument
      return jt.triton_call(input_ptr=x, input_row_stride=COLS, output_row_stride=COLS, n_rows=ROWS, n_cols=COLS,
                            kernel=K.softmax_kernel, out_type=rows, compute_capability=90, grid=(ROWS,), num_warps=8)
    return softmax_output_first, (rows,)
  if name == "add":
    vec = jax.ShapeDtypeStruct((ADD,), jnp.float32)

    def add_one(x):
      return jt.triton_call(x, n=ADD, kernel=K.add_one, out_type=vec, compute_capability=90, grid=(1,), BLOCK=ADD)
    return add_one, (vec,)
  raise ValueError(f"no case {name!r}")


# ------------------------------------------------------------------ what reaches XLA

def describe(lowered) -> dict:
  """The custom call: its target, the bytes of its attributes, and the kernel code it carries."""
  from benchmarks.hlo_inspect import custom_calls
  (call_,) = custom_calls(lowered)
  sizes = {name: len(value) for name, value in call_["config"].items() if isinstance(value, bytes)}
  out = {"target": call_["target"], "attribute_bytes": sum(sizes.values())}
  if "opaque" in call_["config"]:  # jax-triton: a zlib-compressed proto
    data = zlib.decompress(call_["config"]["opaque"])
    out["inflated_bytes"] = len(data)
    out["ptx_images"] = data.count(b"Generated by LLVM NVPTX")
    out["cubin_images"] = data.count(b"\x7fELF")
  else:  # ours: the module (cubins and PTX, each zlib-compressed) in our container format
    from jax_mosaic_ffi.base import module_format
    images = module_format.parse(call_["config"]["module"]).images
    out["inflated_bytes"] = sum(len(image.data) for image in images)
    out["ptx_images"] = sum(image.kind == module_format.ImageKind.PTX for image in images)
    out["cubin_images"] = sum(image.kind == module_format.ImageKind.CUBIN for image in images)
  return out


def lower_side(side: str, name: str) -> dict:
  """In this process, one case lowered twice and exported through `side` (the lowering run's child)."""
  import jax
  jt = jt_module(side)
  if side == "jax_triton":
    disabled = [jax.export.DisabledSafetyCheck.custom_call(jt.CUSTOM_CALL_TARGET_NAME)]
  else:
    import jax_mosaic_ffi as jmf
    disabled = jmf.export_disabled_checks()
  seconds = []
  for _ in range(2):  # a new function each time: jax traces again, only the libraries' caches can hit
    fn, avals = call(name, jt)
    start = time.perf_counter()
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # without a GPU our autotuner takes the first config, saying so
      lowered = jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",))
    seconds.append(time.perf_counter() - start)
  exported = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=disabled)(*avals)
  out = {"lower_s": seconds, "stablehlo_bytes": len(lowered.as_text().encode()),
         "export_bytes": len(exported.serialize()), **describe(lowered)}
  if side == "jmf":
    import jax_mosaic_ffi as jmf
    stats = jmf.kernel_cache_stats()
    out["stats"] = {"triton_compiles": stats.compiles["triton"], "disk_hits": stats.disk_hits}
  return out


def _child(args, env) -> dict:
  return json_child("import sys; from benchmarks import vs_jax_triton as b; sys.exit(b.main(sys.argv[1:]))", args,
                    env, 280)


def _lowering() -> dict:
  result = {}
  for side in SIDES:
    result[side] = {}
    for name in LOWERED:
      # Per case, a first process with empty caches (ours, and Triton's: our compile goes through triton.compile),
      # then a second one with the first one's.
      with tempfile.TemporaryDirectory(prefix="jmf-vs-jt-") as ours, \
           tempfile.TemporaryDirectory(prefix="jmf-vs-jt-triton-") as tritons:
        env = {"JAX_MOSAIC_FFI_CACHE_DIR": ours, "TRITON_CACHE_DIR": tritons, "JAX_PLATFORMS": "cpu"}
        try:
          result[side][name] = {"first": _child(["lowering", side, name], env),
                                "second": _child(["lowering", side, name], env)}
          continue
        except Exception as e:  # a side that cannot run here is its columns' n/a
          error = last_line(str(e)) + (jax_triton_versions() if side == "jax_triton" else "")
      result[side] = {"error": error}
      break
  return result


def jax_triton_versions() -> str:
  """What jax-triton asks of jax and Triton, and what is installed: the usual reason it cannot run."""
  from importlib import metadata
  try:
    wanted = [r.split(";")[0].strip() for r in metadata.requires("jax-triton") or () if r.startswith(("triton", "jax"))]
    return (f" (jax-triton {metadata.version('jax-triton')} requires {', '.join(wanted)}; jax "
            f"{metadata.version('jax')}, triton {metadata.version('triton')} are installed)")
  except metadata.PackageNotFoundError as e:
    return f" ({e.name} is not installed)"


# ------------------------------------------------------------------ GPU time and host cost

def _ptxas_release(path: str | None) -> tuple[int, int] | None:
  import re
  import subprocess
  try:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout if path else ""
  except OSError:
    return None
  m = re.search(r"release (\d+)\.(\d+)", out)
  return (int(m.group(1)), int(m.group(2))) if m else None


def ptxas_for_jax_triton() -> str:
  """Puts the ptxas Triton writes its PTX for first on PATH where XLA's would be older; says which one runs.

  jax-triton hands Triton's PTX to XLA, and XLA assembles it with the first ptxas on PATH. Triton writes the
  newest PTX ISA its own ptxas takes (for sm_90, Triton 3.9's `ptxas-blackwell`, CUDA 13.4: ISA 9.4), which an
  older CUDA's ptxas refuses ("Unsupported .version"). A jax-triton user must do the same; both sides then
  assemble the same PTX with the same ptxas.
  """
  import shutil
  import tempfile

  from triton.backends.nvidia.compiler import get_ptxas
  triton_ptxas = get_ptxas(90).path
  found = shutil.which("ptxas")
  theirs, ours = _ptxas_release(found), _ptxas_release(triton_ptxas)
  show = lambda r: "%d.%d" % r if r else "none"
  if ours and (theirs is None or theirs < ours):
    folder = tempfile.mkdtemp(prefix="jmf-ptxas-")  # XLA looks for the name `ptxas`
    os.symlink(triton_ptxas, os.path.join(folder, "ptxas"))
    os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
    return f"{show(ours)} (Triton's own, put first on PATH for jax-triton; PATH's was {show(theirs)})"
  return f"{show(theirs)} (from PATH; Triton's own: {show(ours)})"


def _gpu() -> dict:
  ptxas = ptxas_for_jax_triton()  # before XLA looks for it
  import jax
  import numpy as np

  from jax_mosaic_ffi.transforms import gpu_clock
  if jax.default_backend() != "gpu":
    return {"skipped": "needs a GPU"}
  sides = {}
  errors = {}
  for side in SIDES:
    try:
      sides[side] = jt_module(side)
    except Exception as e:
      errors[side] = f"{type(e).__name__}: {e}" + (jax_triton_versions() if side == "jax_triton" else "")
  rng = np.random.default_rng()
  inputs = {"matmul": [rng.standard_normal((MATMUL, MATMUL), np.float32).astype(np.float16),
                       (rng.standard_normal((MATMUL, MATMUL), np.float32) / np.sqrt(MATMUL)).astype(np.float16)],
            "softmax": [rng.standard_normal((ROWS, COLS), np.float32)],
            "add": [rng.standard_normal(ADD).astype(np.float32)]}
  references = {"matmul": lambda a, b: a[:256].astype(np.float32) @ b.astype(np.float32),
                "softmax": lambda x: np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(
                    1, keepdims=True),
                "add": lambda x: x + 1}
  from importlib import metadata
  versions = {"jax": jax.__version__, "triton": metadata.version("triton")}
  if "jax_triton" in sides:
    versions["jax-triton"] = metadata.version("jax-triton")
    versions["ptxas"] = ptxas
  result = {"cases": {}, "errors": errors, "versions": versions}
  for name in ("matmul", "softmax", "add"):
    want = references[name](*inputs[name])
    timed, checked = {}, {}
    for side, jt in sides.items():
      arrays = [jax.device_put(a) for a in inputs[name]]  # each side its own: a kernel that writes an input
      try:                                                # must not change the other side's
        fn, _ = call(name, jt)
        got = np.asarray(jax.jit(fn)(*arrays), np.float32)[:want.shape[0]]  # compiles (and autotunes) first
        checked[side] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        if not checked[side] <= 2e-2:
          raise AssertionError(f"{name} through {side} is off by {checked[side]:.1e}")
        calls = 20 if name == "matmul" else 50
        timed[side] = timing.stamped_sampler(jax.jit(gpu_clock.timed(gpu_clock.repeated(fn, calls))), arrays,
                                             calls)
      except Exception as e:
        errors[f"{name}/{side}"] = f"{type(e).__name__}: {str(e)[:1500]}"
    seconds = timing.interleaved_samples(timed, 15)
    result["cases"][name] = {"us": {side: s * 1e6 for side, s in seconds.items()}, "max_error": checked}
  result["output_first"] = _output_first(sides, inputs["softmax"][0], references["softmax"], errors)
  result["host"] = _host_cost(sides, errors)
  return result


def _output_first(sides, x, reference, errors) -> dict:
  """Each side's result for a kernel whose output parameter comes before its input, and whether it wrote the input."""
  import jax
  import numpy as np

  want = reference(x)
  outcome = {}
  for side, jt in sides.items():
    fn, _ = call("softmax_output_first", jt)
    try:
      buffer = jax.device_put(x)
      got = np.asarray(jax.jit(fn)(buffer))
      outcome[side] = {"max_error": float(np.abs(got - want).max() / np.abs(want).max()),
                       "input_written": not np.array_equal(np.asarray(buffer), x)}
    except Exception as e:
      errors[f"softmax_output_first/{side}"] = f"{type(e).__name__}: {str(e)[:1500]}"
  return outcome


def _host_cost(sides, errors) -> dict:
  """Wall time per call of a jitted chain of CHAIN adds, both sides interleaved."""
  import jax
  import jax.numpy as jnp

  chains = {}
  for side, jt in sides.items():
    fn, _ = call("add", jt)
    program = jax.jit(timing.chained(fn, CHAIN))
    x = jnp.zeros((ADD,), jnp.float32)
    try:
      if float(program(x)[0]) != CHAIN:
        raise AssertionError(f"a chain of {CHAIN} adds through {side} did not add up")
      chains[side] = lambda program=program, x=x: program(x).block_until_ready()
    except Exception as e:
      errors[f"host/{side}"] = f"{type(e).__name__}: {str(e)[:1500]}"
  return timing.host_us_per_call(chains, CHAIN)


def run(which: str) -> dict:
  return _lowering() if which == "lowering" else _gpu()


# ------------------------------------------------------------------ the report (no jax)

def _na(side: dict) -> str | None:
  return side.get("error") if isinstance(side, dict) and "error" in side else None


def tables(results: dict) -> list[str]:
  blocks = []
  low = results.get("lowering")
  why = failure(low)
  if why:
    blocks.append(f"Lowering: n/a: {why}")
  else:
    rows = []
    for name in LOWERED:
      for side, label in (("jax_triton", "jax-triton"), ("jmf", "jax_mosaic_ffi")):
        s = low.get(side, {})
        if _na(s):
          rows.append([CASES[name], label, "n/a", "n/a", "n/a", "n/a", "n/a", last_line(_na(s))[:100]])
          continue
        first, second = s[name]["first"], s[name]["second"]
        rows.append([CASES[name], label, f"{fmt(first['lower_s'][0])} / {fmt(first['lower_s'][1])}",
                     fmt(second["lower_s"][0]), f"{first['stablehlo_bytes'] / 1e3:.0f} kB",
                     f"{first['export_bytes'] / 1e3:.0f} kB",
                     f"{first['ptx_images']} PTX, {first['cubin_images']} cubin",
                     f"`{first['target']}`: attributes {first['attribute_bytes'] / 1e3:.0f} kB" +
                     (f", code {first['inflated_bytes'] / 1e3:.0f} kB inflated" if "inflated_bytes" in first
                      else "")])  # results recorded before the inflated size was
    blocks.append(
        "The same user code (`jt.triton_call(...)`, `jt` either `jax_triton` or `jax_mosaic_ffi.jax_triton`) lowered "
        "for CUDA with `compute_capability=90`: seconds to lower in a first process with empty caches (first "
        "lowering / again in the same process, a new function), then in a second process with the first one's "
        "disk cache; the StableHLO's size and the serialized `jax.export` artifact's; the kernel code the custom "
        "call carries. The processes see no GPU (as on a CI or export machine): our autotuner then takes the first "
        "config untimed (with a GPU it compiles and times all 6 before lowering, and lowers the winner alone), "
        "while jax-triton compiles all 6 to PTX at lowering and times them when the program first runs; the one-"
        "config matmul compares one compile with one.\n\n" +
        table(["kernel", "side", "lower s (cold / again)", "lower s, 2nd process", "StableHLO", "export",
               "code carried", "custom call"], rows, "llrrrrll"))
  gpu_ = results.get("gpu")
  why = failure(gpu_)
  if why:
    blocks.append(f"GPU time and host cost: n/a: {why}")
  else:
    rows = []
    for name, c in gpu_.get("cases", {}).items():
      us = c.get("us", {})
      ours, theirs = us.get("jmf"), us.get("jax_triton")
      rows.append([CASES[name], sig(theirs) if theirs else "n/a", sig(ours) if ours else "n/a",
                   f"**{fmt(theirs / ours)}x**" if ours and theirs else "n/a"])
    host = gpu_.get("host", {}).get("us_per_call", {})
    ours, theirs = host.get("jmf"), host.get("jax_triton")
    rows.append([f"host cost per call, jitted chain of {CHAIN} adds (wall us)", sig(theirs) if theirs else "n/a",
                 sig(ours) if ours else "n/a", f"**{fmt(theirs / ours)}x**" if ours and theirs else "n/a"])
    notes = "".join(f"\n- {k}: n/a: {last_line(v)[:200]}" for k, v in gpu_.get("errors", {}).items())
    for side, label in (("jax_triton", "jax-triton"), ("jmf", "jax_mosaic_ffi")):
      o = gpu_.get("output_first", {}).get(side)
      if o:
        verdict = "right" if o["max_error"] <= 2e-2 else "**wrong**"
        wrote = ", and it wrote its input" if o["input_written"] else ""
        notes += (f"\n- {CASES['softmax_output_first']}, through {label}: {verdict} (largest error "
                  f"{o['max_error']:.1e} of the largest element){wrote}")
    versions = ", ".join(f"{k} {v}" for k, v in gpu_.get("versions", {}).items())
    blocks.append(
        "GPU microseconds per call of the same `triton_call` code through each (the GPU clock around a jitted chain "
        "of calls, median of 15 interleaved rounds, after both sides' results were checked against numpy), and the "
        f"host's wall time per call of a jitted chain of small adds ({versions or 'versions not recorded'}). Ratio "
        "above 1: ours is faster.\n\n" +
        table(["kernel", "jax-triton us", "jax_mosaic_ffi us", "jax-triton / ours"], rows, "lrrr") + notes)
  return blocks


def main(argv=None) -> int:
  """A child of the lowering run, or by hand: ``lowering jax_triton|jmf CASE`` prints its JSON."""
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 3 or argv[0] != "lowering" or argv[1] not in SIDES or argv[2] not in LOWERED:
    print(__doc__)
    return 2
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  print("CHILD " + json.dumps(lower_side(argv[1], argv[2])))
  return 0


if __name__ == "__main__":
  sys.exit(main())
