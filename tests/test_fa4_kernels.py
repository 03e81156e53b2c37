"""FlashAttention-4's Hopper kernels (flash-attn-4's `FlashAttentionForwardSm90` and its backward's three kernels,
unchanged) through `jmf.cute_call`, as benchmarks/kernels/fa4_user.py calls them.

Runs where flash-attn-4 and its torch import (not in CI: torch is GBs; on the GPU machine the `quack` bundle,
which holds flash-attn-4 too, is carried: docs/compatibility.md). Any such machine: the attention compiles for
sm_90a and lowers to one of our custom calls; a fresh process with the disk cache neither compiles nor traces
it again; its gradient lowers to the forward and FA4's backward calls (preprocess, main, postprocess; two more
postprocess calls with grouped-query heads), each kernel compiled once. GPU: output and log-sum-exp match numpy
on fresh random inputs, outputs poisoned by the runtime first (conftest.py): causal and not, grouped-query
heads, head dimensions 64, 128 and 256, a ragged sequence length, under vmap, and exported then called in a
process that imports neither torch nor FA4; dq, dk and dv (through both outputs, and through the log-sum-exp
alone) match numpy's float64 gradient in the same cases, under jax.grad and jax.vjp, and under vmap.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cute_required  # noqa: F401  (skips the module without the CuTe DSL)
import kernel_libraries

kernel_libraries.import_or_skip("flash_attn.cute.flash_fwd_sm90", "flash-attn-4")

import jax_mosaic_ffi as jmf

import benchmarks_package
import fresh_process

fa = benchmarks_package.kernels("fa4_user")
gpu = pytest.mark.gpu

LOWER = """
import json, time, warnings
import jax, jax.numpy as jnp
import jax_mosaic_ffi as jmf
from hlo_inspect import custom_calls
import benchmarks_package
fa = benchmarks_package.kernels("fa4_user")
q = jax.ShapeDtypeStruct((2, 1024, 8, 128), jnp.bfloat16)
start = time.perf_counter()
with warnings.catch_warnings():
  warnings.simplefilter("ignore")  # no GPU here
  lowered = jax.jit(lambda q, k, v: fa.flash_attention(q, k, v, causal=True)).trace(q, q, q).lower(
      lowering_platforms=("cuda",))
seconds = time.perf_counter() - start
stats = jmf.kernel_cache_stats()
calls = [[c["target"], c["operands"], c["results"]] for c in custom_calls(lowered)]
print(json.dumps({"calls": calls, "compiles": stats.compiles["cute"], "disk_hits": stats.disk_hits, "s": seconds}))
"""


def test_attention_compiles_once_ever_and_lowers_to_one_call(tmp_path):
  env = {"CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_CACHE_DIR": str(tmp_path / "dsl"),
         "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "jmf")}
  cold = fresh_process.run(LOWER, env=env).result
  warm = fresh_process.run(LOWER, env=env).result
  (call,) = cold["calls"]
  assert call[0].startswith("jax_mosaic_ffi_cute") and call[1:] == [3, 2]
  assert cold["compiles"] == 1 and warm["compiles"] == 0 and warm["disk_hits"] == 1
  assert warm["calls"] == cold["calls"]
  # Keyed by the launcher's code, not a trace (which takes FA4 about a quarter of its compile).
  assert warm["s"] < cold["s"] / 4, (cold["s"], warm["s"])


GRAD = """
import json, time, warnings
import jax, jax.numpy as jnp
import jax_mosaic_ffi as jmf
from hlo_inspect import custom_calls
import benchmarks_package
fa = benchmarks_package.kernels("fa4_user")
q = jax.ShapeDtypeStruct((1, 1000, 8, HEAD_DIM), jnp.bfloat16)
kv = jax.ShapeDtypeStruct((1, 1000, KV_HEADS, HEAD_DIM), jnp.bfloat16)

def loss(q, k, v):
  o, lse = fa.flash_attention(q, k, v, causal=True)
  return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(lse)

start = time.perf_counter()
with warnings.catch_warnings():
  warnings.simplefilter("ignore")  # no GPU here
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(lowering_platforms=("cuda",))
seconds = time.perf_counter() - start
stats = jmf.kernel_cache_stats()
calls = [[c["target"], c["operands"], c["results"]] for c in custom_calls(lowered)]
print(json.dumps({"calls": calls, "compiles": stats.compiles["cute"], "disk_hits": stats.disk_hits, "s": seconds}))
"""

# [operands, results] of each call: the forward (q, k, v -> o, lse); the preprocess (o, do, lse, dlse -> dPsum,
# LSE in log2 units, the zeroed dQ accumulator); the main kernel (q, k, v, do, LSE log2, dPsum, the dQ accumulator
# (aliased), with grouped-query heads the zeroed dK and dV accumulators too -> the accumulators, dK, dV); the
# postprocess (accumulator -> dQ, then dK and dV with grouped-query heads).
MHA_CALLS = [[3, 2], [4, 3], [7, 3], [1, 1]]
GQA_CALLS = [[3, 2], [4, 3], [9, 3], [1, 1], [1, 1], [1, 1]]


def test_gradient_lowers_to_fa4_backward_calls_compiled_once_ever(tmp_path):
  env = {"CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_CACHE_DIR": str(tmp_path / "dsl"),
         "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "jmf")}
  script = GRAD.replace("HEAD_DIM", "128").replace("KV_HEADS", "8")
  cold = fresh_process.run(script, env=env).result
  warm = fresh_process.run(script, env=env).result
  assert all(c[0].startswith("jax_mosaic_ffi_cute") for c in cold["calls"]), cold["calls"]
  assert [c[1:] for c in cold["calls"]] == MHA_CALLS
  assert cold["compiles"] == 4 and warm["compiles"] == 0 and warm["disk_hits"] == 4
  assert warm["calls"] == cold["calls"]
  assert warm["s"] < cold["s"] / 4, (cold["s"], warm["s"])  # no launcher traced again (FA4's backward included)


def test_grouped_query_gradient_adds_the_dk_dv_postprocess(tmp_path):
  env = {"CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_CACHE_DIR": str(tmp_path / "dsl"),
         "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "jmf")}
  found = fresh_process.run(GRAD.replace("HEAD_DIM", "64").replace("KV_HEADS", "2"), env=env).result
  assert all(c[0].startswith("jax_mosaic_ffi_cute") for c in found["calls"]), found["calls"]
  assert [c[1:] for c in found["calls"]] == GQA_CALLS
  # dQ, dK and dV share the postprocess launcher; dK's and dV's differ from dQ's in tile and scale.
  assert found["compiles"] == 6


# ---------------------------------------------------------------- GPU

def inputs(rng, b, s, h, hk, d):
  q = rng.standard_normal((b, s, h, d), np.float32).astype(jnp.bfloat16)
  k, v = (rng.standard_normal((b, s, hk, d), np.float32).astype(jnp.bfloat16) for _ in "kv")
  return q, k, v


def check(got, want):
  (o, lse), (o_ref, lse_ref) = got, want
  o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
  assert np.max(np.abs(o - o_ref)) < 2e-2 * max(np.max(np.abs(o_ref)), 1.0)
  assert np.max(np.abs(lse - lse_ref)) < 2e-2


CASES = [(2, 1024, 8, 8, 128, True), (2, 1024, 8, 8, 128, False), (1, 1000, 8, 2, 64, True),
         (1, 512, 4, 4, 256, False), (3, 384, 16, 4, 128, False)]


@gpu
@pytest.mark.parametrize("case", CASES, ids=["causal", "full", "gqa-ragged-64", "d256", "gqa-128"])
def test_attention_matches_numpy(rng, case):
  b, s, h, hk, d, causal = case
  q, k, v = inputs(rng, b, s, h, hk, d)
  got = jax.jit(lambda q, k, v: fa.flash_attention(q, k, v, causal=causal))(q, k, v)
  check(got, fa.attention_reference(q, k, v, causal=causal))


@gpu
def test_attention_under_vmap_matches_numpy(rng):
  q, k, v = (np.stack(x) for x in zip(*(inputs(rng, 1, 256, 4, 4, 128) for _ in range(3))))
  o, lse = jax.jit(jax.vmap(lambda q, k, v: fa.flash_attention(q, k, v, causal=True)))(q, k, v)
  for i in range(3):
    check((o[i], lse[i]), fa.attention_reference(q[i], k[i], v[i], causal=True))


@gpu
def test_exported_attention_runs_without_torch_or_fa4(rng, tmp_path):
  q, k, v = inputs(rng, 1, 512, 4, 4, 128)
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, k, v)]
  exported = jax.export.export(jax.jit(lambda q, k, v: fa.flash_attention(q, k, v)), platforms=["cuda"],
                               disabled_checks=jmf.export_disabled_checks())(*avals)
  (tmp_path / "attention.jax").write_bytes(exported.serialize())
  for name, a in zip("qkv", (q, k, v)):
    np.save(tmp_path / f"{name}.npy", a.astype(np.float32))
  found = fresh_process.run(f"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
import jax_mosaic_ffi
folder = {str(tmp_path)!r}
exported = jax.export.deserialize(bytearray(open(folder + "/attention.jax", "rb").read()))
args = [jnp.asarray(np.load(f"{{folder}}/{{n}}.npy")).astype(jnp.bfloat16) for n in "qkv"]
o, lse = exported.call(*args)
np.save(folder + "/o.npy", np.asarray(o, np.float32)); np.save(folder + "/lse.npy", np.asarray(lse))
print(json.dumps({{"imported": sorted(m for m in ("torch", "flash_attn", "cutlass") if m in sys.modules)}}))
""", env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "jmf")}).result
  assert found["imported"] == []
  check((np.load(tmp_path / "o.npy"), np.load(tmp_path / "lse.npy")), fa.attention_reference(q, k, v))


def check_gradient(got, want):
  # The largest error against the largest value, and the typical (root-mean-square) one against the typical
  # value: causal gradients peak in the first rows, which would otherwise hide errors in the others. (<=: dV is
  # exactly 0 through the log-sum-exp alone.)
  rms = lambda x: np.sqrt(np.mean(np.square(x)))
  for name, g, w in zip(("dq", "dk", "dv"), got, want):
    error = np.asarray(g, np.float64) - w
    assert np.max(np.abs(error)) <= 3e-2 * np.max(np.abs(w)), (name, np.max(np.abs(error)), np.max(np.abs(w)))
    assert rms(error) <= 2e-2 * rms(w), (name, rms(error), rms(w))


GRAD_CASES = [(2, 1024, 8, 8, 128, True), (2, 1024, 8, 8, 128, False), (1, 1000, 8, 8, 64, True),
              (1, 1000, 8, 2, 64, True), (3, 384, 16, 4, 128, False), (1, 512, 4, 4, 256, False)]


@gpu
@pytest.mark.parametrize("case", GRAD_CASES,
                         ids=["causal", "full", "ragged-64", "gqa-ragged-64", "gqa-128", "d256"])
def test_gradient_matches_numpy(rng, case):
  b, s, h, hk, d, causal = case
  q, k, v = inputs(rng, b, s, h, hk, d)
  do = rng.standard_normal((b, s, h, d), np.float32).astype(jnp.bfloat16)
  dlse = rng.standard_normal((b, h, s), np.float32)

  @jax.jit
  def gradient(q, k, v, do, dlse):  # of <do, o> + <dlse, lse>
    _, vjp = jax.vjp(lambda q, k, v: fa.flash_attention(q, k, v, causal=causal), q, k, v)
    return vjp((do, dlse))

  got = gradient(q, k, v, do, dlse)
  assert [g.shape for g in got] == [q.shape, k.shape, v.shape] and all(g.dtype == q.dtype for g in got)
  check_gradient(got, fa.attention_reference_grad(q, k, v, do, dlse, causal=causal))


@gpu
def test_grad_of_a_loss_matches_numpy(rng):
  q, k, v = inputs(rng, 1, 512, 4, 4, 128)
  loss = lambda q, k, v: jnp.sum(fa.flash_attention(q, k, v, causal=True)[0].astype(jnp.float32) ** 2)
  got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  o, _ = fa.attention_reference(q, k, v, causal=True)
  check_gradient(got, fa.attention_reference_grad(q, k, v, 2 * o, causal=True))


@gpu
def test_gradient_through_the_log_sum_exp_alone_matches_numpy(rng):
  # dO = 0: dPsum is -dLSE alone, so a preprocess that dropped dLSE would give zeros.
  q, k, v = inputs(rng, 1, 768, 4, 4, 128)
  dlse = rng.standard_normal((1, 4, 768), np.float32)
  loss = lambda q, k, v: jnp.sum(fa.flash_attention(q, k, v)[1] * dlse)
  got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  want = fa.attention_reference_grad(q, k, v, np.zeros(q.shape), dlse)
  assert np.max(np.abs(want[0])) > 0.02 and np.max(np.abs(want[2])) == 0
  check_gradient(got, want)


@gpu
def test_gradient_under_vmap_matches_numpy(rng):
  q, k, v = (np.stack(x) for x in zip(*(inputs(rng, 1, 256, 4, 4, 128) for _ in range(3))))
  loss = lambda q, k, v: jnp.sum(fa.flash_attention(q, k, v, causal=True)[0].astype(jnp.float32) ** 2)
  got = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(q, k, v)
  for i in range(3):
    o, _ = fa.attention_reference(q[i], k[i], v[i], causal=True)
    check_gradient([g[i] for g in got], fa.attention_reference_grad(q[i], k[i], v[i], 2 * o, causal=True))
