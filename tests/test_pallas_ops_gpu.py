"""jax_mosaic_ffi.ops.gpu's kernels on a GPU: each op and each gradient against its reference on fresh random
inputs, in float32, float16 and bfloat16, causal and not, with segment ids, ragged lengths and pages (outputs
poisoned first: conftest sets JAX_MOSAIC_FFI_POISON_OUTPUTS); every autotuned config, not only the winner; and,
where the jax running here still ships them (0.11), against jax's own Pallas kernels on the same inputs."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from triton_required import import_triton

import_triton()

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.ops.gpu import attention, decode_attention, layer_norm, paged_attention, rms_norm, softmax

import pallas_ops_cases as cases

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", cases.DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_each_op_matches_its_reference(name, dtype, rng):
  case = cases.CASES[name]
  inputs = case.make(rng, dtype)
  got = jax.jit(case.op)(*inputs)
  assert got.dtype == inputs[0].dtype
  cases.assert_close(got, case.reference(*inputs), dtype, name)


@pytest.mark.parametrize("dtype", cases.DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", sorted(n for n, c in cases.CASES.items() if c.grads))
def test_each_gradient_matches_autodiff_of_the_reference(name, dtype, rng):
  case = cases.CASES[name]
  inputs = case.make(rng, dtype)
  got = jax.jit(jax.grad(cases.loss(case.op), argnums=case.grads))(*inputs)
  # The reference differentiated in float32, from the same (rounded) inputs.
  wide = [x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in inputs]
  want = jax.grad(cases.loss(case.reference), argnums=case.grads)(*wide)
  for i, g, w in zip(case.grads, got, want):
    assert g.dtype == inputs[i].dtype
    cases.assert_close(g, w, dtype, f"{name} d/d input {i}", scale=4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1, 16), (2, 129, 3, 128), (1, 384, 2, 80), (2, 1000, 1, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_mha_every_length_and_head_dim_and_the_residuals(shape, causal, rng):
  q, k, v = (cases._normal(rng, shape, jnp.bfloat16) for _ in range(3))
  out, lse = jax.jit(lambda q, k, v: attention.mha(q, k, v, None, sm_scale=0.3, causal=causal,
                                                   return_residuals=True))(q, k, v)
  want = attention.mha_reference(q, k, v, None, sm_scale=0.3, causal=causal)
  cases.assert_close(out, want, jnp.bfloat16, "out")
  logits = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32), k.astype(jnp.float32)) * 0.3
  if causal:
    logits = jnp.where(jnp.tril(jnp.ones(logits.shape[-2:], bool)), logits, -jnp.inf)
  cases.assert_close(lse, jax.nn.logsumexp(logits, -1) / np.log(2), jnp.float32, "lse", scale=20)


@pytest.mark.parametrize("dtype", cases.DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_mha_with_pallas_block_sizes_and_the_xla_backward(dtype, rng):
  q, k, v, seg = cases._attention_inputs(rng, dtype, t=256, segments=True)
  blocks = attention.BlockSizes(block_q=64, block_k=32, block_q_dkv=32, block_kv_dkv=64, block_q_dq=64,
                                block_kv_dq=32)
  for options in (dict(block_sizes=blocks, num_warps=4, num_stages=3), dict(backward_pass_impl="xla")):
    op = lambda q, k, v: attention.mha(q, k, v, seg, causal=True, **options)  # noqa: E731
    ref = lambda q, k, v: attention.mha_reference(q, k, v, seg, causal=True)  # noqa: E731
    cases.assert_close(jax.jit(op)(q, k, v), ref(q, k, v), dtype, str(options))
    got = jax.grad(cases.loss(op), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(cases.loss(ref), argnums=(0, 1, 2))(*(x.astype(jnp.float32) for x in (q, k, v)))
    for g, w in zip(got, want):
      cases.assert_close(g, w, dtype, f"grad {options}", scale=4)


@pytest.mark.parametrize("normalize", [True, False])
def test_decode_residuals_are_pallas_l_and_m(normalize, rng):
  q, k, v, start, length = cases._decode_inputs(rng, jnp.float16, mqa=False, lengths=True)
  o, (sums, maxes) = decode_attention.gqa(q, k, v, start, length, return_residuals=True, normalize_output=normalize)
  ro, (rl, rm) = decode_attention.gqa_reference(q, k, v, start, length, return_residuals=True,
                                                normalize_output=normalize)
  cases.assert_close(o, ro, jnp.float16, "o", scale=1 if normalize else 20)
  cases.assert_close(sums, rl, jnp.float32, "l", scale=50)
  cases.assert_close(maxes, rm, jnp.float32, "m", scale=50)


def test_every_tuned_config_is_right_not_only_the_winner(rng):
  """Each config the autotuner may pick, run on its own (a config that is wrong would be picked on some GPU)."""
  from jax_mosaic_ffi.ops.gpu import attention_calls  # noqa: PLC0415  (what the configs are is an internal)
  q, k, v = cases._attention_inputs(rng, jnp.float16, t=300)
  want = attention.mha_reference(q, k, v, None, causal=True)
  for config in attention_calls.forward_configs(jnp.float16, 64, 300, 300):
    blocks = attention.BlockSizes(config["BLOCK_Q"], config["BLOCK_K"], 32, 32, 32, 32)
    got = attention.mha(q, k, v, None, causal=True, block_sizes=blocks, num_warps=config["num_warps"],
                        num_stages=config["num_stages"])
    cases.assert_close(got, want, jnp.float16, str(config))
  dkdv, dq = attention_calls.backward_configs(jnp.float16, 300, 300)
  ref_grads = jax.grad(cases.loss(lambda *a: attention.mha_reference(*a, None, causal=True)), argnums=(0, 1, 2))(
      *(x.astype(jnp.float32) for x in (q, k, v)))
  for a, b in zip(dkdv, dq):
    blocks = attention.BlockSizes(128, 64, a["BLOCK_Q"], a["BLOCK_K"], b["BLOCK_Q"], b["BLOCK_K"])
    op = lambda *x: attention.mha(*x, None, causal=True, block_sizes=blocks, num_warps=a["num_warps"])  # noqa: E731
    for g, w in zip(jax.grad(cases.loss(op), argnums=(0, 1, 2))(q, k, v), ref_grads):
      cases.assert_close(g, w, jnp.float16, f"{a} {b}", scale=4)


@pytest.mark.parametrize("name", ["mha-causal-segments", "gqa", "layer_norm", "softmax"])
def test_jmf_check_passes_on_the_gpu(name, rng):
  case = cases.CASES[name]
  report = jmf.check(case.op, *case.make(rng, jnp.float32), reference=case.reference, shapes=None, vmap=False)
  assert report.status == "passed", report


def _pallas(module: str):
  try:
    return importlib.import_module(f"jax.experimental.pallas.ops.gpu.{module}")
  except ImportError:
    pytest.skip(f"jax {jax.__version__} ships no jax.experimental.pallas.ops.gpu.{module} (removed in 0.12)")


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_where_jax_still_ships_pallas_ops_ours_give_their_results(dtype, rng):
  """One import changed, the same call: ours and jax 0.11's Pallas kernels agree on the same inputs."""
  theirs = _pallas("attention")
  q, k, v = cases._attention_inputs(rng, dtype, b=2, t=256, h=2, d=64)
  for ours_mod, their_mod in ((attention, theirs),):
    for causal in (False, True):
      cases.assert_close(ours_mod.mha(q, k, v, None, causal=causal), their_mod.mha(q, k, v, None, causal=causal),
                         dtype, f"mha causal={causal}")
  q, k, v = cases._decode_inputs(rng, dtype, mqa=False, lengths=False)
  pad = lambda x: jnp.pad(x[:, :1000], ((0, 0), (0, 24), (0, 0), (0, 0)))  # noqa: E731  (Pallas: 16 | 1024)
  length = jnp.full((q.shape[0],), 1000, jnp.int32)
  cases.assert_close(decode_attention.gqa(q, pad(k), pad(v), kv_seq_len=length),
                     _pallas("decode_attention").gqa(q, pad(k), pad(v), kv_seq_len=length), dtype, "gqa")
  x, w, b = cases._norm_inputs(rng, dtype, n=1024)
  for ours_fn, their_fn in ((layer_norm.layer_norm, _pallas("layer_norm").layer_norm),
                            (rms_norm.rms_norm, _pallas("rms_norm").rms_norm)):
    cases.assert_close(ours_fn(x, w, b), their_fn(x, w, b), dtype, ours_fn.__name__)
  cases.assert_close(softmax.softmax(x), _pallas("softmax").softmax(x), dtype, "softmax")
  q, k_pages, v_pages, tables, lengths = cases._paged_inputs(rng, dtype)
  tables = tables[:, :12]
  cases.assert_close(paged_attention.paged_attention(q, k_pages, v_pages, tables, lengths, k_splits=4),
                     _pallas("paged_attention").paged_attention(q, k_pages, v_pages, tables, lengths, k_splits=4),
                     dtype, "paged_attention")


def test_every_tuned_decoding_config_is_right(rng):
  """Each config the autotuner may pick for mqa / gqa and paged_attention, run on its own."""
  q, k, v, start, length = cases._decode_inputs(rng, jnp.bfloat16, mqa=False, lengths=True)
  want = decode_attention.gqa_reference(q, k, v, start, length)
  for config in decode_attention._MORE:
    got = decode_attention.gqa(q, k, v, start, length, block_h=config["BLOCK_H"], block_k=config["BLOCK_K"],
                               num_warps=config["num_warps"], num_stages=config["num_stages"])
    cases.assert_close(got, want, jnp.bfloat16, str(config))
  q, k_pages, v_pages, tables, lengths = cases._paged_inputs(rng, jnp.bfloat16)
  want = cases._paged_reference(q, k_pages, v_pages, tables, lengths)
  for pages, warps, stages, block_h in paged_attention._MORE:
    got = paged_attention.paged_attention(q, k_pages, v_pages, tables, lengths, k_splits=4, block_h=block_h,
                                          pages_per_compute_block=pages, num_warps=warps, num_stages=stages)
    cases.assert_close(got, want, jnp.bfloat16, f"paged {pages, warps, stages, block_h}")


@pytest.mark.parametrize("rows", [1, 7, 512, 3 * 4096], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_gradients_for_every_grouping_of_rows(op, rows, rng):
  """The backward's two-stage sums (norms.backward_groups: one group, many groups of one row, many of many)."""
  case = cases.CASES[op]
  x = cases._normal(rng, (rows, 768), jnp.bfloat16, 2.0)
  w, b = cases._normal(rng, (768,), jnp.bfloat16), cases._normal(rng, (768,), jnp.bfloat16)
  got = jax.jit(jax.grad(cases.loss(case.op), argnums=(0, 1, 2)))(x, w, b)
  reference = lambda x, w, b: case.reference(x[None], w, b)[0]  # noqa: E731  (the references take (B, T, N))
  want = jax.grad(cases.loss(reference), argnums=(0, 1, 2))(*(a.astype(jnp.float32) for a in (x, w, b)))
  for i, g, r in zip("xwb", got, want):
    # dw and db sum every row's terms, each off by its 16-bit cotangent's rounding: errors grow as sqrt(rows).
    spread = 1.0 if i == "x" else float(np.sqrt(rows))
    cases.assert_close(g.astype(jnp.float32) / spread, r / spread, jnp.bfloat16, f"{op} d/d{i} rows={rows}", scale=4)
