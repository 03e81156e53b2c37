"""FlashAttention-4 in JAX: its Hopper kernels through jax_mosaic_ffi, against its own launcher and cuDNN.

FlashAttention-4 (flash-attn-4, CuTe DSL) has no JAX binding: its users call `flash_attn.cute.flash_attn_func` on
torch tensors. kernels/fa4_user.py is a JAX user's route to the same kernels: `FlashAttentionForwardSm90` and
the backward's preprocess, `FlashAttentionBackwardSm90` and postprocess in `@cute.jit` launchers, called by
`jmf.cute_call`, with FA4's own tile choices, differentiable by `jmf.differentiable`. Each case runs, on the same
inputs, the forward and then forward + backward (`grad`):

- `fa4`: FA4's own launcher on torch tensors (the backward: torch autograd through `flash_attn_func`,
  `torch.autograd.grad`), GPU time between two CUDA events on torch's stream behind a sleep kernel (so that the
  host's launch speed does not count);
- `ours`: `fa4_user.flash_attention` inside `jax.jit` (the backward: `jax.vjp`); and `cudnn`: what JAX users call
  today, `jax.nn.dot_product_attention(..., implementation="cudnn")` (and its `jax.vjp`): GPU time between two GPU
  clock stamps inside the jitted program (jax_mosaic_ffi.transforms.gpu_clock).

Each side is a chain of calls on the same inputs, checked against a float64 numpy reference first (the output,
and dQ for `grad`, of the first rows); medians of interleaved rounds. By hand:
`python -m benchmarks --only fa4_attention`.
"""

from __future__ import annotations

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, sig, table
from benchmarks.suite import Run

NAME = "fa4_attention"
TITLE = "FlashAttention-4 in JAX: its Hopper kernel through jax_mosaic_ffi, its own launcher, and cuDNN"
ORDER = 59
RUNS = (Run("gpu", timeout_s=560.0, optional=True),)

# (batch, seqlen, heads, kv heads, head dim, causal)
CASES = {"causal_d128": (4, 4096, 16, 16, 128, True), "full_d128": (4, 4096, 16, 16, 128, False),
         "causal_d64": (8, 2048, 16, 16, 64, True), "gqa_causal_d128": (4, 4096, 32, 8, 128, True)}
SIDES = ("fa4", "ours", "cudnn")
MODES = ("forward", "grad")  # the forward alone; forward and backward
LABELS = {"fa4": "FA4's own launcher (torch)", "ours": "jax_mosaic_ffi", "cudnn": "cuDNN (jax.nn)"}
CHAIN = 10
ROUNDS = 15
SLEEP_CYCLES = 20_000_000  # ~10 ms at the H200's clock: longer than the host takes to enqueue a chain
CHECKED_ROWS = 256  # the reference (float64 numpy) is computed for the first rows of the first batch element


def _describe(case) -> str:
  b, s, h, hk, d, causal = case
  heads = f"{h} heads" if h == hk else f"{h} query / {hk} kv heads"
  return f"{'causal' if causal else 'full'}, batch {b}, seqlen {s}, {heads}, head dim {d}, bf16"


def _flops(case, mode: str = "forward") -> float:
  """The matmuls' FLOPs; the backward's are 2.5 times the forward's (five matmuls to two)."""
  b, s, h, _, d, causal = case
  return 4.0 * b * h * s * s * d / (2 if causal else 1) * (3.5 if mode == "grad" else 1.0)


def _versions() -> dict:
  from importlib import metadata
  out = {}
  for name in ("jax", "nvidia-cutlass-dsl", "flash-attn-4", "torch"):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = "not installed"
  return out


def _reference(q, k, v, do, causal):
  """The output and dQ (the gradient of <do, output>) of the first CHECKED_ROWS query rows of batch element 0,
  float64 (the full reference would take minutes)."""
  import numpy as np
  q0, k0, v0, do0 = (np.asarray(a[:1], np.float64) for a in (q, k, v, do))
  q0, do0 = q0[:, :CHECKED_ROWS], do0[:, :CHECKED_ROWS]
  scale = q.shape[-1] ** -0.5
  groups = q.shape[2] // k.shape[2]
  k0, v0 = np.repeat(k0, groups, axis=2), np.repeat(v0, groups, axis=2)
  scores = np.einsum("bshd,bthd->bhst", q0, k0) * scale
  if causal:
    rows, cols = np.arange(CHECKED_ROWS)[:, None], np.arange(k0.shape[1])[None, :]
    scores = np.where(cols <= rows, scores, -np.inf)
  peak = scores.max(-1, keepdims=True)
  weights = np.exp(scores - peak)
  p = weights / weights.sum(-1, keepdims=True)
  out = np.einsum("bhst,bthd->bshd", p, v0)
  dp = np.einsum("bshd,bthd->bhst", do0, v0)
  ds = p * (dp - np.einsum("bshd,bshd->bhs", do0, out)[..., None]) * scale
  return {"forward": out[0], "grad": np.einsum("bhst,bthd->bshd", ds, k0)[0]}


def _error(got, want) -> float:
  import numpy as np
  got = np.asarray(got, np.float64)[0, :CHECKED_ROWS]
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


class TorchChain:
  """FA4's own launcher: `flash_attn_func` on torch tensors (and torch autograd's backward through it for
  `grad`), CHAIN calls between CUDA events."""

  def __init__(self, q, k, v, do, causal, mode):
    import numpy as np
    import torch
    from flash_attn.cute import flash_attn_func
    self.torch, self.causal = torch, causal
    cuda = lambda a: torch.from_numpy(np.asarray(a, np.float32)).cuda().to(torch.bfloat16)
    self.args = [cuda(a).requires_grad_(mode == "grad") for a in (q, k, v)]
    self.do = cuda(do)

    def forward():
      out = flash_attn_func(*self.args, causal=self.causal)
      return out[0] if isinstance(out, tuple) else out
    self.fn = forward if mode == "forward" else lambda: torch.autograd.grad(forward(), self.args, self.do)[0]

  def once(self):
    out = self.fn()
    self.torch.cuda.synchronize()
    return out.float().cpu().numpy()

  def sample(self) -> float:
    torch = self.torch
    start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    if hasattr(torch.cuda, "_sleep"):
      torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    for _ in range(CHAIN):
      self.fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / CHAIN


def _jax_sides(causal, mode):
  """Functions of (q, k, v, do): the output, or for `grad` dQ, dK and dV (the gradient of <do, output>)."""
  import jax

  from benchmarks.kernels import fa4_user
  forward = {"ours": lambda q, k, v: fa4_user.flash_attention(q, k, v, causal=causal)[0],
             "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")}
  if mode == "forward":
    return {side: lambda q, k, v, do, fn=fn: fn(q, k, v) for side, fn in forward.items()}
  return {side: lambda q, k, v, do, fn=fn: jax.vjp(fn, q, k, v)[1](do) for side, fn in forward.items()}


def _measure(name: str, mode: str, errors: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from jax_mosaic_ffi.transforms import gpu_clock
  case = CASES[name]
  b, s, h, hk, d, causal = case
  rng = np.random.default_rng()
  q, do = (rng.standard_normal((b, s, h, d), np.float32).astype(jnp.bfloat16) for _ in "qo")
  k, v = (rng.standard_normal((b, s, hk, d), np.float32).astype(jnp.bfloat16) for _ in "kv")
  want = _reference(q, k, v, do, causal)[mode]
  arrays = [jax.device_put(a) for a in (q, k, v, do)]
  first = lambda out: out[0] if isinstance(out, (tuple, list)) else out  # the output, or dQ
  key = name if mode == "forward" else f"{name}/{mode}"
  samplers, checked = {}, {}
  try:
    native = TorchChain(q, k, v, do, causal, mode)
    checked["fa4"] = _error(native.once(), want)
    samplers["fa4"] = native.sample
  except Exception as e:
    errors[f"{key}/fa4"] = f"{type(e).__name__}: {str(e)[:1500]}"
  for side, fn in _jax_sides(causal, mode).items():
    try:
      checked[side] = _error(first(jax.jit(fn)(*arrays)), want)
      samplers[side] = timing.stamped_sampler(jax.jit(gpu_clock.timed(gpu_clock.repeated(fn, CHAIN))), arrays,
                                              CHAIN)
    except Exception as e:
      errors[f"{key}/{side}"] = f"{type(e).__name__}: {str(e)[:1500]}"
  for side, error in list(checked.items()):
    if not error <= (2e-2 if mode == "forward" else 3e-2):
      what = "output" if mode == "forward" else "dQ"
      errors[f"{key}/{side}"] = f"AssertionError: the {what} is off by {error:.1e} of its largest element"
      samplers.pop(side, None)
  us = {side: s * 1e6 for side, s in timing.interleaved_samples(samplers, ROUNDS).items()}
  return {"us": us, "tflops": {side: _flops(case, mode) / (t / 1e6) / 1e12 for side, t in us.items()},
          "max_error": checked}


def run() -> dict:
  import jax
  if jax.default_backend() != "gpu":
    return {"skipped": "needs a GPU"}
  errors = {}
  cases = {}
  for name in CASES:
    try:
      cases[name] = _measure(name, "forward", errors)
      cases[name]["grad"] = _measure(name, "grad", errors)
    except Exception as e:
      errors[name] = f"{type(e).__name__}: {str(e)[:1500]}"
  return {"cases": cases, "errors": errors, "versions": _versions(), "chain": CHAIN, "rounds": ROUNDS}


# ------------------------------------------------------------------ the report (no jax)

def tables(results: dict) -> list[str]:
  gpu_ = results.get("gpu")
  why = failure(gpu_)
  if why:
    return [f"n/a: {why}"]
  by_mode = {mode: [] for mode in MODES}
  for name, c in gpu_.get("cases", {}).items():
    for mode, m in (("forward", c), ("grad", c.get("grad"))):
      if m is None:
        continue
      us, tf = m.get("us", {}), m.get("tflops", {})
      cells = [f"{sig(us[s])} us, {tf[s]:.0f} TFLOP/s" if s in us else "n/a" for s in SIDES]
      ours = us.get("ours")
      ratios = [f"**{fmt(us[s] / ours)}x**" if ours and s in us else "n/a" for s in ("fa4", "cudnn")]
      by_mode[mode].append([_describe(CASES[name]), *cells, *ratios])
  notes = "".join(f"\n- {k}: n/a: {last_line(v)[:200]}" for k, v in gpu_.get("errors", {}).items())
  versions = ", ".join(f"{k} {v}" for k, v in gpu_.get("versions", {}).items())
  header = ["case", *(LABELS[s] for s in SIDES), "FA4's launcher / ours", "cuDNN / ours"]
  grad = ("\n\nForward and backward (`grad`: the output, then dQ, dK and dV of <dO, output>; FA4's backward through "
          "torch autograd, ours and cuDNN's through `jax.vjp`), TFLOP/s counting the backward as 2.5 forwards:\n\n" +
          table(header, by_mode["grad"], "lrrrrr")) if by_mode["grad"] else ""
  return [
      "GPU time per call of FlashAttention-4's Hopper forward kernel through its own launcher (torch) and through "
      "jax_mosaic_ffi inside `jax.jit`, and of cuDNN's attention through `jax.nn.dot_product_attention`: medians of "
      f"{gpu_.get('rounds', ROUNDS)} interleaved rounds of a chain of {gpu_.get('chain', CHAIN)} calls, every side "
      f"checked against numpy first ({versions or 'versions not recorded'}). Ratios above 1: ours is faster.\n\n" +
      table(header, by_mode["forward"], "lrrrrr") + grad + notes]

