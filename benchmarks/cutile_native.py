"""cuTile kernels as cuTile's users write them: through our runtime and through cuTile's own JAX launcher
(``cuda.tile.jax.cutile_call``), in one process.

The kernels (kernels/cutile_samples.py) are cuTile's samples: vector add, row softmax, matmul (fp16 on the tensor
cores) and layer norm, ``@ct.kernel`` functions with ``ct.Constant`` tile sizes. Each runs, on the same inputs,
through ``cuda.tile.jax.cutile_call`` and through ``jax_mosaic_ffi.cutile_jax.cutile_call`` (the same call, the
import changed), both inside ``jax.jit``, both checked against a float64 numpy reference first. GPU time per call:
a chain of calls, each fed by the previous one's output, between two GPU clock stamps inside the jitted program
(jax_mosaic_ffi.transforms.gpu_clock), medians of interleaved rounds.

The launch runs measure the host cost per call: a jitted chain of 200 vector adds of 1024 floats, wall time per
call, both launchers, command buffers on and off. The compile run (no GPU needed) measures a cold compile of each
sample for sm_90: ``export_kernel`` alone (cuTile's own cache off) against ours (``compile_plan``, and
``mosaic_kernel``'s whole lowering) with an empty cache (the key, the forked compile bounded by
JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S, the cache entry), ours as in a process where export_kernel never ran (what cuTile
looks up once per process, forgotten before each of our rounds), and a forked compile that does nothing: the floor
of ours above export_kernel (``python -m benchmarks --only cutile_native/compile --splice``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, launch_failure, sig, table
from benchmarks.suite import Run

NAME = "cutile_native"
TITLE = "cuTile kernels as cuTile's users write them: our runtime against cuda.tile.jax"
ORDER = 58
RUNS = (Run("samples", kwargs={"cases": ("vector_add", "softmax", "matmul", "layer_norm")}, timeout_s=300),
        Run("launch", kwargs={"launch": True}, timeout_s=150),
        Run("launch_cb_off", kwargs={"launch": True}, xla_flags="--xla_gpu_enable_command_buffer=", timeout_s=150),
        Run("compile", kwargs={"compile_only": True}, timeout_s=300))

ROUNDS = 15
COMPILE_ROUNDS = 9
CHAIN = 20
LAUNCH_CHAIN = 200
LAUNCH_N = 1024
CASES = {
    "vector_add": "vector add, 2^26 float32, 1024-element tiles",
    "softmax": "row softmax, 16384x4096 float32, a row per block",
    "matmul": "matmul 4096^3 float16 (float32 accumulation), 128x128x64 tiles",
    "layer_norm": "layer norm, 16384x4096 float32, runtime eps, a row per block",
}


def environment() -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  import cuda.tile as ct
  import cuda.tile.jax as theirs
  import jax_mosaic_ffi as jmf
  import jax_mosaic_ffi.cutile_jax as ours
  from benchmarks.kernels import cutile_samples as K
  return {"np": np, "jax": jax, "jnp": jnp, "ct": ct, "jmf": jmf, "theirs": theirs, "ours": ours, "K": K}


def make_case(name: str, env: dict):
  """(inputs, call(api, *arrays) -> output, carry(inputs, output) -> next inputs, reference(inputs))."""
  np, K, ct = env["np"], env["K"], env["ct"]
  rng = np.random.default_rng(0)
  if name == "vector_add":
    n, tile = 1 << 26, 1024
    inputs = [rng.standard_normal(n).astype(np.float32) * 0.01 for _ in range(2)]
    call = lambda api, a, b: api.cutile_call((ct.cdiv(n, tile),), K.vector_add,  # noqa: E731
                                             (a, b, api.OutputPlaceholder(a.shape, a.dtype), tile))
    return inputs, call, lambda ins, out: [out, ins[1]], lambda ins: ins[0].astype(np.float64) + ins[1]
  if name in ("softmax", "layer_norm"):
    m, n = 16384, 4096
    x = rng.standard_normal((m, n)).astype(np.float32)
    if name == "softmax":
      call = lambda api, v: api.cutile_call((m,), K.softmax, (v, api.OutputPlaceholder(v.shape, v.dtype), n))  # noqa: E731

      def reference(ins):
        v = ins[0].astype(np.float64)
        e = np.exp(v - v.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
      return [x], call, lambda ins, out: [out * n], reference
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    call = lambda api, v, w, b: api.cutile_call((m,), K.layer_norm,  # noqa: E731
                                                (v, w, b, api.OutputPlaceholder(v.shape, v.dtype), 1e-5, n))

    def reference(ins):
      v = ins[0].astype(np.float64)
      mean = v.mean(axis=1, keepdims=True)
      return (v - mean) / np.sqrt(((v - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5) * ins[1] + ins[2]
    return [x, w, b], call, lambda ins, out: [out, ins[1], ins[2]], reference
  if name == "matmul":
    n, t = 4096, (128, 128, 64)
    a = rng.standard_normal((n, n)).astype(np.float16)
    b = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float16)
    call = lambda api, x, y: api.cutile_call((n // t[0], n // t[1]), K.matmul,  # noqa: E731
                                             (x, y, api.OutputPlaceholder((n, n), x.dtype), *t))
    return [a, b], call, lambda ins, out: [out, ins[1]], \
        lambda ins: ins[0].astype(np.float32) @ ins[1].astype(np.float32)
  raise KeyError(name)


def _measure_case(name: str, env: dict, rounds: int) -> dict:
  from jax_mosaic_ffi.transforms import gpu_clock
  np, jax = env["np"], env["jax"]
  inputs, call, carry, reference = make_case(name, env)
  arrays = [jax.device_put(a) for a in inputs]
  errors, samplers = {}, {}
  want = reference(inputs)
  for path in ("theirs", "ours"):
    api = env[path]
    one = jax.jit(lambda *xs, api=api: call(api, *xs))
    got = np.asarray(one(*arrays)).astype(np.float64)
    errors[path] = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))

    def chain(*xs, api=api):
      out = None
      for _ in range(CHAIN):
        out = call(api, *xs)
        xs = carry(xs, out)
      return out
    samplers[path] = timing.stamped_sampler(jax.jit(gpu_clock.timed(chain)), arrays, CHAIN)
  seconds = timing.interleaved_samples(samplers, rounds)
  return {"us": {p: s * 1e6 for p, s in seconds.items()}, "speed": seconds["theirs"] / seconds["ours"],
          "max_error": errors}


def _measure_launch(env: dict) -> dict:
  np, jax, jnp, ct, K = (env[k] for k in ("np", "jax", "jnp", "ct", "K"))
  chains = {}
  x = jnp.zeros((LAUNCH_N,), jnp.float32)
  one = jnp.ones((LAUNCH_N,), jnp.float32)
  for path in ("theirs", "ours"):
    api = env[path]

    def chain(v, w, api=api):
      for _ in range(LAUNCH_CHAIN):
        v = api.cutile_call((1,), K.vector_add, (v, w, api.OutputPlaceholder(v.shape, v.dtype), LAUNCH_N))
      return v
    jitted = jax.jit(chain)
    if not np.all(np.asarray(jitted(x, one)) == LAUNCH_CHAIN):
      raise AssertionError(f"launch chain ({path}) did not add up")
    chains[path] = lambda jitted=jitted: jitted(x, one).block_until_ready()
  return timing.host_us_per_call(chains, LAUNCH_CHAIN)


def _measure_compile(env: dict, rounds: int = COMPILE_ROUNDS) -> dict:
  """Cold compiles for sm_90, no GPU needed: export_kernel alone against ours (compile_plan, and mosaic_kernel's
  whole lowering), each with an empty cache of its own made before its timing, interleaved, medians; and a forked
  compile that does nothing (the floor of ours: toolchain/forked_compile.py's fork, wait and clean-up)."""
  import io
  jax, jnp, jmf, K, np = (env[k] for k in ("jax", "jnp", "jmf", "K", "np"))
  from cuda.tile import _cext
  from cuda.tile import _compile as cutile_compile
  from cuda.tile.compilation import export_kernel
  from jax_mosaic_ffi.cutile.compiler import keys, plan as P, signature
  from jax_mosaic_ffi.base.module_format import Arch
  from jax_mosaic_ffi.cutile.compiler.compile import _itemsize, compile_plan  # noqa: PLC2701  (what it measures)
  from jax_mosaic_ffi.base import compile_timeout
  from jax_mosaic_ffi.toolchain import forked_compile
  if os.environ.get(compile_timeout.ENV, "").strip():
    raise RuntimeError(f"{compile_timeout.ENV} is set: the compile run measures ours with its default bound")
  _cext.default_tile_context.config.cache_dir = None
  probe = cutile_compile._get_max_supported_bytecode_version  # cuTile's per-process lookup (see `forget`)
  f32, f16 = jnp.float32, jnp.float16
  cases = {
      "vector_add": (K.vector_add, [((1 << 20,), f32)] * 3, {"TILE": 1024}),
      "softmax": (K.softmax, [((4096, 1024), f32)] * 2, {"TILE_N": 1024}),
      "matmul": (K.matmul, [((4096, 4096), f16)] * 3, {"TM": 128, "TN": 128, "TK": 64}),
      "layer_norm": (K.layer_norm, [((4096, 1024), f32), ((1024,), f32), ((1024,), f32), ((4096, 1024), f32)],
                     {"TILE_N": 1024}),
  }
  result = {}
  for name, (kernel, shapes, constants) in cases.items():
    arrays = [P.ArrayArg(b, jnp.dtype(d).name, s) for b, (s, d) in enumerate(shapes)]
    consts = [P.ConstantArg(v, keys.exact_key(v).hex()) for v in constants.values()]
    plan_args = arrays + ([P.ScalarArg(0, "float32")] if name == "layer_norm" else []) + consts
    plan = P.Plan(tuple(plan_args))
    sig_ = signature.kernel_signature(plan, kernel._annotated_function.pyfunc.__name__, _itemsize)

    def theirs(kernel=kernel, sig_=sig_):
      export_kernel(kernel, [sig_], io.BytesIO(), gpu_code="sm_90", output_format="cubin")

    def ours(kernel=kernel, plan=plan, name=name):
      compile_plan(kernel, plan, name=name, targets=(Arch(90),))

    def lowering(kernel=kernel, shapes=shapes, constants=constants, name=name):
      n_in = len(shapes) - 1
      f = jmf.mosaic_kernel(jmf.cutile_kernel(kernel, targets=["sm_90"], **constants),
                            jax.ShapeDtypeStruct(*shapes[-1]), grid=1,
                            scalars=(np.float32(1e-5),) if name == "layer_norm" else ())
      jax.jit(f).trace(*(jax.ShapeDtypeStruct(*s) for s in shapes[:n_in])).lower(lowering_platforms=("cuda",))

    def unbounded(kernel=kernel, plan=plan, name=name):
      os.environ[compile_timeout.ENV] = "0"  # no bound: the compile in this process, no fork
      try:
        compile_plan(kernel, plan, name=name, targets=(Arch(90),))
      finally:
        os.environ.pop(compile_timeout.ENV)

    def fork():
      forked_compile.run(lambda: b"", 60.0)
    paths = (("export_kernel", theirs), ("ours", ours), ("unbounded", unbounded), ("lowering", lowering),
             ("fork", fork))
    samples = {p: [] for p, _ in paths}
    with tempfile.TemporaryDirectory() as scratch:
      for r in range(rounds + 1):  # the first round warms up (imports, tileiras's lookups): not counted
        for path, fn in paths:
          os.environ["JAX_MOSAIC_FFI_CACHE_DIR"] = tempfile.mkdtemp(dir=scratch)  # empty, made outside the timing
          jmf.clear_kernel_cache()
          if path != "export_kernel":
            # Ours as in a process that never called export_kernel: cuTile's own lookups, which that call left
            # warm, forgotten (a forked child that needed them would redo them each compile), restored after.
            probe.cache_clear()
          start = time.perf_counter()
          fn()
          seconds = time.perf_counter() - start
          probe(_cext.default_tile_context.config.temp_dir, allow_dev=_cext.dev_features_enabled())
          if r:
            samples[path].append(seconds)
    s = {p: statistics.median(v) for p, v in samples.items()}
    result[name] = {"s": s, "ratio": s["ours"] / s["export_kernel"]}
  return result


def run(cases=(), rounds: int = ROUNDS, launch: bool = False, compile_only: bool = False) -> dict:
  try:
    env = environment()
  except ImportError as e:
    return {"skipped": f"needs cuda-tile (the cutile extra) beside jax ({e})"}
  if compile_only:
    return {"compile": _measure_compile(env), "measured": True}
  if env["jax"].default_backend() != "gpu":
    return {"skipped": "needs a GPU (cuda.tile.jax compiles for device 0 at lowering)"}
  result = {"cases": {}, "speed": {}, "errors": {}, "measured": False,
            "versions": {"jax": env["jax"].__version__, "cuda-tile": env["ct"].__version__}}
  if launch:
    try:
      result.update(_measure_launch(env), measured=True)
    except Exception as e:
      result["errors"]["ours"] = f"{type(e).__name__}: {e}"
    return result
  for name in cases:
    try:
      result["cases"][name] = _measure_case(name, env, rounds)
      result["speed"][name] = result["cases"][name]["speed"]
      result["measured"] = True
    except Exception as e:  # one case's failure is its row
      result["errors"][name] = f"{type(e).__name__}: {str(e)[:2000]}"
  return result


# ------------------------------------------------------------------ the report (no jax)

def tables(results: dict) -> list[str]:
  blocks, rows, notes = [], [], []
  r = results.get("samples")
  why = failure(r)
  if why:
    notes.append(f"- samples: n/a: {why}")
  else:
    for name, error in r.get("errors", {}).items():
      rows.append([CASES.get(name, name), "n/a", "n/a", "n/a", last_line(error)[:120]])
    for name, c in r["cases"].items():
      rows.append([CASES.get(name, name), sig(c["us"]["theirs"]), sig(c["us"]["ours"]), f"**{fmt(c['speed'])}x**",
                   f"{c['max_error']['theirs']:.1e} / {c['max_error']['ours']:.1e}"])
  blocks.append(
      "cuTile's samples (`benchmarks/kernels/cutile_samples.py`) through `cuda.tile.jax.cutile_call` and through "
      "`jax_mosaic_ffi.cutile_jax.cutile_call` (the same call, the import changed), both inside `jax.jit`, same "
      f"inputs, both checked against numpy first. GPU time per call in microseconds: a chain of {CHAIN} calls, each "
      "fed by the last, between two GPU clock stamps inside the jitted program; medians of interleaved rounds. "
      "Ratio above 1: ours is faster.\n\n"
      + table(["kernel", "cuda.tile.jax us", "ours us", "ours / cuda.tile.jax", "max error (theirs / ours)"], rows,
              "lrrrl") + ("\n\n" + "\n".join(notes) if notes else ""))
  launch_rows = []
  for run_name, label in (("launch", "command buffers on"), ("launch_cb_off", "command buffers off")):
    launch = results.get(run_name)
    unavailable = launch_failure(launch)
    if unavailable:
      launch_rows.append([label, "n/a", "n/a", unavailable[:120]])
      continue
    us = launch["us_per_call"]
    launch_rows.append([label, sig(us["theirs"]), sig(us["ours"]), f"**{fmt(us['ours'] / us['theirs'])}x**"])
  blocks.append(f"Host cost per call: a jitted chain of {LAUNCH_CHAIN} vector adds of {LAUNCH_N} floats, wall time "
                "per call, both launchers.\n\n"
                + table(["XLA", "cuda.tile.jax us", "ours us", "ours / theirs (below 1: ours costs less)"],
                        launch_rows, "lrrr"))
  c = results.get("compile")
  why = failure(c)
  if not why:
    compile_rows = [[name, sig(v["s"]["export_kernel"]), sig(v["s"]["ours"]), f"**{fmt(v['ratio'])}x**",
                     sig(v["s"]["fork"] * 1e3) if "fork" in v["s"] else "n/a",
                     f"{fmt(v['s']['unbounded'] / v['s']['export_kernel'])}x" if "unbounded" in v["s"] else "n/a",
                     sig(v["s"]["lowering"])]
                    for name, v in c["compile"].items()]
    blocks.append("A cold compile for sm_90 (no GPU needed): `export_kernel` alone (cuTile's cache off) against "
                  "our compile with an empty cache (the key, the compile in a forked child bounded by "
                  "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S, the cache entry), and the whole `jax.jit` lowering of a call "
                  "around it; ours timed as in a process that never called `export_kernel` (cuTile's own "
                  "per-process lookups forgotten before each of our rounds). A forked compile that does nothing "
                  "(the fork, the wait, the clean-up) is the floor of ours above `export_kernel`: the price of the "
                  "bound, which ours without it (JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=0: the compile in the calling "
                  f"process) does not pay. Seconds, medians of {COMPILE_ROUNDS} interleaved rounds after one to warm "
                  "up.\n\n"
                  + table(["kernel", "export_kernel s", "ours s", "ours / export_kernel", "a fork alone ms",
                           "ours unbounded / export_kernel", "jit lowering, cold s"], compile_rows, "lrrrrrr"))
  return blocks
