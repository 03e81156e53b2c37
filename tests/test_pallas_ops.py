"""jax_mosaic_ffi.ops.gpu, the GPU ops jax 0.11's Pallas shipped, on any machine: their signatures are Pallas's,
their fallbacks match the references (outputs and gradients) in every dtype, and every op lowers and exports for
CUDA with its kernels inside, runs under jit, vmap and sharding, passes jmf.check, and records into a pack.
(The kernels against the references on a GPU: tests/test_pallas_ops_gpu.py.)"""

import dataclasses
import doctest
import importlib
import inspect
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from triton_required import import_triton

import_triton()

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.ops import gpu as ops_gpu
from jax_mosaic_ffi.ops.gpu import attention, decode_attention, layer_norm, paged_attention, rms_norm, softmax

import fresh_process
import pallas_ops_cases as cases
from hlo_inspect import UNTUNED_OK, custom_calls, lower

pytestmark = UNTUNED_OK
TESTS = os.path.dirname(os.path.abspath(__file__))
CPU_CASES = [name for name in cases.CASES if not name.endswith("-long")]

# jax 0.11.2's signatures (jax/experimental/pallas/ops/gpu/*.py), parameter by parameter: (name, default); a
# default of ... is a value this table does not spell out (BlockSizes.get_default(), a mask value).
REQUIRED = inspect.Parameter.empty
PALLAS = {
    "attention.mha": [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED), ("segment_ids", REQUIRED),
                      ("sm_scale", 1.0), ("causal", False), ("block_sizes", ...), ("backward_pass_impl", "triton"),
                      ("num_warps", None), ("num_stages", 2), ("grid", None), ("interpret", False),
                      ("debug", False), ("return_residuals", False)],
    "decode_attention.mqa": [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED), ("start_idx", None),
                             ("kv_seq_len", None), ("sm_scale", None), ("block_h", 16), ("block_k", 256),
                             ("k_splits", 16), ("num_warps", None), ("num_stages", 2), ("grid", None),
                             ("interpret", False), ("debug", False), ("return_residuals", False),
                             ("normalize_output", True)],
    "paged_attention.paged_attention": [
        ("q", REQUIRED), ("k_pages", REQUIRED), ("v_pages", REQUIRED), ("block_tables", REQUIRED),
        ("lengths", REQUIRED), ("k_scales_pages", None), ("v_scales_pages", None), ("block_h", 16),
        ("pages_per_compute_block", 8), ("k_splits", 16), ("num_warps", 8), ("num_stages", 2), ("interpret", False),
        ("debug", False), ("mask_value", ...), ("attn_logits_soft_cap", None)],
    "layer_norm.layer_norm": [("x", REQUIRED), ("weight", REQUIRED), ("bias", REQUIRED), ("num_warps", None),
                              ("num_stages", 3), ("eps", 1e-5), ("backward_pass_impl", "triton"),
                              ("interpret", False)],
    "softmax.softmax": [("x", REQUIRED), ("axis", -1), ("num_warps", 4), ("interpret", False), ("debug", False)],
}
PALLAS["decode_attention.gqa"] = [(n, 128 if n == "block_k" else d) for n, d in PALLAS["decode_attention.mqa"]]
PALLAS["rms_norm.rms_norm"] = PALLAS["layer_norm.layer_norm"]
KEYWORD_ONLY = {"paged_attention.paged_attention": "block_h", "softmax.softmax": "axis"}


def _ours(path: str):
  module, name = path.split(".")
  return getattr(getattr(ops_gpu, module), name)


@pytest.mark.parametrize("path", sorted(PALLAS))
def test_each_signature_is_pallas_parameter_by_parameter(path):
  params = list(inspect.signature(_ours(path)).parameters.values())
  assert [(p.name, p.default if default is not ... else ...) for p, (_, default) in zip(params, PALLAS[path])] == \
      PALLAS[path]
  first_keyword = KEYWORD_ONLY.get(path)
  for p in params:
    if p.name == first_keyword:
      first_keyword = None
    assert (p.kind is inspect.Parameter.KEYWORD_ONLY) == (first_keyword is None and path in KEYWORD_ONLY), p
  assert attention.BlockSizes.get_default() == attention.BlockSizes(128, 128, 32, 32, 32, 32)
  assert _ours("paged_attention.DEFAULT_MASK_VALUE") == -0.7 * float(np.finfo(np.float32).max)


def test_where_this_jax_still_has_pallas_ops_our_signatures_are_theirs():
  try:
    theirs = importlib.import_module("jax.experimental.pallas.ops.gpu.attention")
  except ImportError:
    pytest.skip(f"jax {jax.__version__} has no jax.experimental.pallas.ops.gpu.attention (removed in 0.12)")
  del theirs
  for path in PALLAS:
    module, name = path.split(".")
    fn = getattr(importlib.import_module(f"jax.experimental.pallas.ops.gpu.{module}"), name)
    fn = getattr(fn, "fun", fn)  # mha: the custom_vjp's function
    values = lambda f: [(p.name, _plain(p.default), p.kind) for p in inspect.signature(f).parameters.values()]  # noqa: E731
    assert values(_ours(path)) == values(fn), path
  # Their BlockSizes (a program that switched one import and not the other) means what ours does.
  q = jnp.ones((1, 64, 1, 16), jnp.float32)
  mixed = attention.mha(q, q, q, None, block_sizes=theirs_module().BlockSizes(32, 16, 16, 16, 16, 16))
  np.testing.assert_allclose(mixed, attention.mha(q, q, q, None, block_sizes=attention.BlockSizes(32, 16)))


def theirs_module():
  return importlib.import_module("jax.experimental.pallas.ops.gpu.attention")


def _plain(default):
  """A dataclass default (BlockSizes) as its fields' values, whichever module's class it is."""
  return dataclasses.astuple(default) if dataclasses.is_dataclass(default) else default


def test_importing_the_package_imports_no_triton():
  done = fresh_process.run("import sys, json, jax_mosaic_ffi as jmf; jmf.ops.gpu.attention.mha; "
                           "print(json.dumps('triton' in sys.modules))")
  assert done.result is False


@pytest.mark.parametrize("dtype", cases.DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", CPU_CASES)
def test_off_the_gpu_each_op_is_its_reference(name, dtype, rng):
  case = cases.CASES[name]
  inputs = case.make(rng, dtype)
  got = jax.jit(case.op)(*inputs)
  assert got.dtype == inputs[0].dtype and got.shape == case.reference(*inputs).shape
  cases.assert_close(got, case.reference(*inputs), dtype, name)


@pytest.mark.parametrize("name", [n for n in CPU_CASES if cases.CASES[n].grads])
def test_off_the_gpu_gradients_are_the_references(name, rng):
  case = cases.CASES[name]
  inputs = case.make(rng, jnp.float32)
  got = jax.grad(cases.loss(case.op), argnums=case.grads)(*inputs)
  want = jax.grad(cases.loss(case.reference), argnums=case.grads)(*inputs)
  for i, g, w in zip(case.grads, got, want):
    cases.assert_close(g, w, jnp.float32, f"{name} d/d input {i}", scale=5)


def test_mha_backward_pass_impl_xla_and_the_residuals_gradient(rng):
  q, k, v = cases._attention_inputs(rng, jnp.float32, t=64)
  triton_grads = jax.grad(cases.loss(lambda *a: attention.mha(*a, None, causal=True)), argnums=(0, 1, 2))(q, k, v)
  xla = lambda *a: attention.mha(*a, None, causal=True, backward_pass_impl="xla")  # noqa: E731
  for g, w in zip(triton_grads, jax.grad(cases.loss(xla), argnums=(0, 1, 2))(q, k, v)):
    cases.assert_close(g, w, jnp.float32, "xla backward", scale=5)
  # The log-sum-exp (base 2, as Pallas's) has a gradient too.
  lse_loss = lambda q: jnp.sum(attention.mha(q, k, v, None, return_residuals=True)[1] ** 2)  # noqa: E731
  want = jax.grad(lambda q: jnp.sum((jax.nn.logsumexp(jnp.einsum("bthd,bshd->bhts", q, k), -1) / np.log(2)) ** 2))
  cases.assert_close(jax.grad(lse_loss)(q), want(q), jnp.float32, "lse gradient", scale=5)


def _avals(inputs):
  return [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]


# The kernels each op lowers to: forward, and with grads the backward's.
KERNELS = {"mha": ["mha_forward_plain"], "mha-causal": ["mha_forward_plain"],
           "mha-segments": ["mha_forward_segments"], "mha-causal-segments": ["mha_forward_segments"],
           "mqa": ["decode_split", "decode_combine"], "gqa": ["decode_split", "decode_combine"],
           "paged": ["paged_split", "decode_combine"], "layer_norm": ["norm_forward"],
           "rms_norm": ["norm_forward"], "softmax": ["softmax_forward"], "layer_norm-long": ["norm_forward_long"],
           "softmax-long": ["softmax_forward_long"]}
BACKWARD = {"mha": ["mha_delta", "mha_dkdv_plain", "mha_dq_plain"], "layer_norm": ["norm_backward"]}


def _kernel_names(lowered) -> list[str]:
  return [c["config"]["kernel_name"].decode() for c in custom_calls(lowered) if c["target"].startswith("jax_mosaic")]


@pytest.mark.parametrize("dtype", cases.DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_op_lowers_for_cuda_to_its_kernels(name, dtype, rng):
  case = cases.CASES[name]
  names = _kernel_names(lower(case.op, *_avals(case.make(rng, dtype))))
  assert sorted(names) == sorted(KERNELS[name]), names


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", sorted(BACKWARD))
def test_gradients_lower_for_cuda_to_the_backward_kernels(name, dtype, rng):
  case = cases.CASES[name]
  names = _kernel_names(lower(jax.grad(cases.loss(case.op), argnums=case.grads), *_avals(case.make(rng, dtype))))
  assert sorted(names) == sorted(KERNELS[name] + BACKWARD[name]), names


def test_pallas_block_sizes_are_used_as_given_and_the_default_is_tuned(rng):
  q, k, v = cases._attention_inputs(rng, jnp.float16, t=256)
  given = attention.BlockSizes(block_q=64, block_k=32, block_q_dkv=16, block_kv_dkv=64, block_q_dq=64,
                               block_kv_dq=16)
  fixed = lambda q, k, v: attention.mha(q, k, v, None, block_sizes=given, num_warps=2, num_stages=3)  # noqa: E731
  (call,) = custom_calls(lower(fixed, *_avals((q, k, v))))
  assert call["config"]["grid"] == [4, 2, 2] and call["config"]["block"] == [64, 1, 1]
  with pytest.raises(ValueError, match="block_q must be a power of two"):
    attention.mha(q, k, v, None, block_sizes=attention.BlockSizes(block_q=48, block_k=32))
  no_backward = lambda q: attention.mha(q, q, q, None, block_sizes=attention.BlockSizes(64, 64)).sum()  # noqa: E731
  with pytest.raises(ValueError, match="Backward block sizes must all be set"):
    jax.grad(no_backward)(q.astype(jnp.float32))
  with pytest.raises(ValueError, match="one dtype"):
    attention.mha(q.astype(jnp.float32), k, v, None)
  with pytest.raises(ValueError, match="Invalid backward pass implementation"):
    attention.mha(q, k, v, None, backward_pass_impl="cuda")
  with pytest.raises(NotImplementedError, match="non-trailing"):
    softmax.softmax(q, axis=1)
  with pytest.raises(NotImplementedError, match="residuals must be returned"):
    decode_attention.gqa(q[:, 0], k[:, :, :1], v[:, :, :1], normalize_output=False)
  with pytest.raises(ValueError, match="block_h must divisible by 16"):
    paged_attention.paged_attention(*cases._paged_inputs(rng, jnp.float16), block_h=24)


@pytest.mark.parametrize("name", ["mha-causal-segments", "gqa-lengths", "paged-int8", "layer_norm", "softmax"])
def test_each_op_exports_for_cuda_with_its_kernels_inside(name, rng):
  case = cases.CASES[name]
  inputs = case.make(rng, jnp.bfloat16)
  exported = jax.export.export(jax.jit(case.op), platforms=["cuda"])(*_avals(inputs))
  text = exported.mlir_module()
  assert text.count("jax_mosaic_ffi_launch") >= 1
  again = jax.export.deserialize(exported.serialize())
  assert [o.shape for o in again.out_avals] == [case.reference(*inputs).shape]


@pytest.mark.parametrize("name", ["mha-causal", "gqa-lengths", "paged", "rms_norm", "softmax"])
def test_vmap_of_each_op_is_each_element_alone(name, rng):
  case = cases.CASES[name]
  batches = [case.make(rng, jnp.float32) for _ in range(2)]
  stacked = [jnp.stack(xs) for xs in zip(*batches)]
  got = jax.jit(jax.vmap(case.op))(*stacked)
  for i, inputs in enumerate(batches):
    cases.assert_close(got[i], case.op(*inputs), jnp.float32, f"{name} element {i}")


def _mesh():
  return jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Auto,))


@pytest.mark.parametrize("name", ["mha-causal-segments", "gqa-lengths", "paged", "layer_norm", "softmax"])
def test_under_jit_batch_sharded_inputs_stay_sharded(name, rng):
  case = cases.CASES[name]
  inputs = list(case.make(rng, jnp.float32))
  mesh = _mesh()
  batch = 8
  # Every batched input made (8, ...) and split on its first dimension; pages and weights replicated.
  if name == "paged":
    q, k_pages, v_pages, tables, lengths = inputs
    inputs = [jnp.tile(q, (3, 1, 1))[:batch], k_pages, v_pages, jnp.tile(tables, (3, 1))[:batch],
              jnp.tile(lengths, 3)[:batch]]
    split = [True, False, False, True, True]
  elif name.startswith("layer_norm"):
    inputs = [jnp.tile(inputs[0], (3, 1, 1))[:batch], *inputs[1:]]
    split = [True, False, False]
  else:
    inputs = [jnp.concatenate([x] * (-(-batch // x.shape[0])))[:batch] for x in inputs]
    split = [True] * len(inputs)
  placed = [jax.device_put(x, NamedSharding(mesh, P("x") if s else P())) for x, s in zip(inputs, split)]
  got = jax.jit(case.op)(*placed)
  assert got.sharding.spec[0] == "x", got.sharding
  cases.assert_close(got, case.reference(*inputs), jnp.float32, name)


@pytest.mark.parametrize("name", ["mha-causal", "gqa-lengths", "paged", "layer_norm", "softmax"])
def test_jmf_check_against_the_reference_finds_nothing_wrong(name, rng):
  case = cases.CASES[name]
  inputs = case.make(rng, jnp.float32)
  kwargs = {}
  if name in ("gqa-lengths", "paged"):  # lengths and block tables in range, drawn by the case itself
    kwargs.update(inputs=lambda rng, *avals: case.make(rng, jnp.float32), vmap=False)
  report = jmf.check(case.op, *inputs, reference=case.reference, shapes=None, **kwargs)
  assert not report.failures, report
  assert report.status == ("passed" if jax.default_backend() == "gpu" else "not checked"), report


PACK_PROGRAM = '''
import jax, jax.numpy as jnp
from jax_mosaic_ffi.ops.gpu import attention, layer_norm
q = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.float16)
blocks = attention.BlockSizes(64, 64, 32, 32, 32, 32)
mha = lambda q, k, v: attention.mha(q, k, v, None, causal=True, block_sizes=blocks, num_warps=4)
jax.jit(mha).trace(q, q, q).lower(lowering_platforms=("cuda",))
x, w = jax.ShapeDtypeStruct((4, 256), jnp.bfloat16), jax.ShapeDtypeStruct((256,), jnp.bfloat16)
jax.jit(lambda x, w: layer_norm.layer_norm(x, w, w, num_warps=4)).trace(x, w).lower(lowering_platforms=("cuda",))
'''


def test_a_pack_recorded_on_the_cpu_holds_the_ops_kernels(tmp_path):
  program = tmp_path / "program.py"
  program.write_text(PACK_PROGRAM)
  pack = str(tmp_path / "ops.jmfpack")
  env = {**os.environ, "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}
  run = lambda *args: subprocess.run([sys.executable, "-m", "jax_mosaic_ffi.pack", *args], env=env,  # noqa: E731
                                     capture_output=True, text=True, timeout=fresh_process.HANG_GUARD_S,
                                     cwd=str(tmp_path))
  done = run("record", pack, "--arch", "sm_90a", "--", sys.executable, str(program))
  assert done.returncode == 0, done.stderr[-4000:]
  listing = json.loads(run("list", pack, "--json").stdout)
  text = json.dumps(listing)
  for kernel in ("mha_forward_plain", "norm_forward"):
    assert kernel in text, listing


@pytest.mark.parametrize("module", ["attention", "decode_attention", "paged_attention", "layer_norm", "rms_norm",
                                    "softmax"])
def test_the_docstring_examples_run(module):
  found = doctest.DocTestFinder().find(getattr(ops_gpu, module), globs={"jax": jax, "jnp": jnp, "np": np})
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  for test in found:
    runner.run(test)
  failed, attempted = runner.summarize(verbose=False)
  assert failed == 0 and attempted >= 2, (failed, attempted)


def _interpreted(module: str):
  try:
    return importlib.import_module(f"jax.experimental.pallas.ops.gpu.{module}")
  except ImportError:
    pytest.skip(f"jax {jax.__version__} has no jax.experimental.pallas.ops.gpu.{module} (removed in 0.12)")


def test_where_this_jax_has_pallas_ops_ours_give_what_their_kernels_give_interpreted(rng):
  """jax 0.11's Pallas kernels run by Pallas's interpreter on the CPU, against our ops (their fallbacks) on the
  same inputs and arguments: masks, residuals, eps and defaults mean the same on both sides."""
  theirs = _interpreted("attention")
  q, k, v, seg = cases._attention_inputs(rng, jnp.float32, b=1, t=128, h=1, d=32, segments=True)
  for causal in (False, True):
    cases.assert_close(attention.mha(q, k, v, seg, sm_scale=0.3, causal=causal),
                       theirs.mha(q, k, v, seg, sm_scale=0.3, causal=causal, interpret=True), jnp.float32, "mha")
  out, lse = attention.mha(q, k, v, None, causal=True, return_residuals=True)
  their_out, their_lse = theirs.mha(q, k, v, None, causal=True, return_residuals=True, interpret=True)
  cases.assert_close(lse, their_lse, jnp.float32, "mha lse")
  decode = _interpreted("decode_attention")
  q, k, v = (cases._normal(rng, shape, jnp.float32) for shape in ((2, 16, 32), (2, 256, 2, 32), (2, 256, 2, 32)))
  start, length = jnp.array([3, 40], jnp.int32), jnp.array([200, 41], jnp.int32)
  for normalize in (True, False):
    ours = decode_attention.gqa(q, k, v, start, length, k_splits=4, return_residuals=True,
                                normalize_output=normalize)
    their = decode.gqa(q, k, v, start, length, k_splits=4, block_k=16, return_residuals=True,
                       normalize_output=normalize, interpret=True)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(their)):
      cases.assert_close(a, b, jnp.float32, f"gqa normalize={normalize}")
  ours = decode_attention.mqa(q, k[:, :, 0], v[:, :, 0], None, length, sm_scale=0.5, k_splits=4)
  their = decode.mqa(q, k[:, :, 0], v[:, :, 0], None, length, sm_scale=0.5, k_splits=4, block_k=16,
                     interpret=True)
  cases.assert_close(ours, their, jnp.float32, "mqa")
  paged = _interpreted("paged_attention")
  q, k_pages, v_pages, tables, lengths = cases._paged_inputs(rng, jnp.float32)
  tables = tables[:, :12]
  for cap in (None, 10.0):
    cases.assert_close(
        paged_attention.paged_attention(q, k_pages, v_pages, tables, lengths, k_splits=4, attn_logits_soft_cap=cap),
        paged.paged_attention(q, k_pages, v_pages, tables, lengths, k_splits=4, attn_logits_soft_cap=cap,
                              interpret=True), jnp.float32, f"paged cap={cap}")
  x, w, b = cases._norm_inputs(rng, jnp.float32, n=256)
  x = x[:, :4]
  for ours_module, name in ((layer_norm, "layer_norm"), (rms_norm, "rms_norm")):
    ours_fn, their_fn = getattr(ours_module, name), getattr(_interpreted(name), name)
    cases.assert_close(ours_fn(x, w, b), their_fn(x, w, b, interpret=True), jnp.float32, name)
    ours_grads = jax.grad(cases.loss(ours_fn), argnums=(0, 1, 2))(x, w, b)
    their_grads = jax.grad(cases.loss(lambda *a: their_fn(*a, interpret=True)), argnums=(0, 1, 2))(x, w, b)
    for g, h in zip(ours_grads, their_grads):
      cases.assert_close(g, h, jnp.float32, f"{name} grad", scale=5)
  cases.assert_close(softmax.softmax(x), _interpreted("softmax").softmax(x, interpret=True), jnp.float32,
                     "softmax")
