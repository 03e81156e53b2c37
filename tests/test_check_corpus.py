"""The kernel corpus passes jmf.check: every kernel of benchmarks/kernels/ against its fallback or a jax.numpy
reference, on fresh random inputs (outputs poisoned by the runtime first, conftest.py): the CUDA C++ tiled matmul
and Hopper GEMM, a C++ template in three dtypes, the Triton softmax, grouped matmul, flash attention, layer norm
(forward and backward, with jmf.differentiable) and add_one, the Gluon tutorials' wgmma + TMA GEMMs and add_one,
the CuTe DSL axpy, add_one, RMSNorm and Hopper GEMM, FlashAttention-4's forward and backward and quack's softmax
(both through jmf.cute_call, their gradients by jmf.differentiable, against autodiff of jax.numpy).

Shapes: derived edges where the kernel takes any size, named shapes where it documents what it takes (a kernel
that reads past a ragged edge it does not support would fault, not mismatch). On the CPU the calls that have
fallbacks are checked through them (the fallbacks match the kernels' outputs and the machinery runs); the kernels
themselves need the GPU (`gpu`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

import benchmarks_package
import kernel_libraries
import kernel_sources

gpu = pytest.mark.gpu
F32, F16, BF16 = jnp.float32, jnp.float16, jnp.bfloat16
i32 = np.int32


def passes(report, kernels=()):
  """Nothing differed, and on a GPU the report passed, having compared each named kernel with its own fallback
  (elsewhere the fallbacks stood in for the kernels: "not checked")."""
  assert not report.failures, report
  assert report.status == ("passed" if jax.devices()[0].platform == "gpu" else "not checked"), report
  if jax.devices()[0].platform == "gpu" and kernels:
    compared = {r.kernel.split(" at ")[0] for r in report.rows if r.what.startswith("kernel vs fallback") and r.kernel}
    assert {f"mosaic_kernel '{k}'" for k in kernels} <= compared, report
  return report


# ------------------------------------------------------------------ CUDA C++

def tiled_matmul():
  return benchmarks_package.kernels("tiled_matmul").call(dict(BM=64, BN=64, BK=16, TM=4, TN=4))


# Each element is held to atol + rtol * |its own value| (numerics.py). A kernel that accumulates rounds differently
# from its reference by about its sum's rounding, which an element that cancels to nearly zero does not scale
# down, so each such check states its atol, from a simulation on the CPU of the two summation orders (or of the
# kernel's own roundings) on these shapes and random normal inputs, with a margin. float32 sums of ~160 (K, or 256
# rows) products (the tiled matmul, the layer norm's dW and dB): a sequential FMA loop against BLAS's order needs
# up to 9e-6 beyond rtol 1e-5: atol 1e-4.
SUMS_F32 = {F32: (1e-5, 1e-4)}
# The GEMMs' float16 and bfloat16 outputs are float32 sums rounded once to the output's type: an element that
# cancels to nearly zero keeps the sum's rounding, finer there than the output's own. Simulated on the CPU on each
# GEMM's shapes (a sequential FMA loop, k16 steps rounded to nearest and toward zero, BLAS; each rounded to the
# output's type; 20 seeds): up to 1.0e-5 beyond rtol for the Gluon GEMM's K = 192, 6e-6 for the CuTe GEMM's,
# 3e-6 for the Triton matmul's K = 96, 7e-7 for the Hopper GEMM's K = 128, against the table's floor of 1e-5:
# atol 1e-4, as for the float32 sums. (rtol stays the table's: each output is rounded once.)
SUMS_F16, SUMS_BF16 = {F16: (2e-3, 1e-4)}, {BF16: (1.6e-2, 1e-4)}


def axpb():
  """The C++ template `ops::axpb<T>` (y = 2x + 1), one instantiation per dtype, picked by the input's."""
  names = {F32: "float", F16: "__half", BF16: "__nv_bfloat16"}
  calls = {jnp.dtype(d): jmf.mosaic_kernel(
      jmf.cuda_kernel(kernel_sources.AXPB, f"ops::axpb<{c}>"), lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256),
      block=256, scalars=lambda x: (np.int64(x.size),),
      fallback=lambda x: (x.astype(F32) * 2 + 1).astype(x.dtype)) for d, c in names.items()}
  return lambda x: calls[jnp.dtype(x.dtype)](x)


def test_the_cuda_corpus_checks_through_its_fallbacks_anywhere(isolated_disk_cache):
  passes(jmf.check(tiled_matmul(), jnp.zeros((96, 80)), jnp.zeros((80, 64)), shapes=None))
  passes(jmf.check(axpb(), jnp.zeros(1000), dtypes=[F32, F16, BF16], shapes=None))


@gpu
def test_the_tiled_matmul_passes_on_every_edge(isolated_disk_cache):
  report = passes(jmf.check(tiled_matmul(), jnp.zeros((192, 160)), jnp.zeros((160, 128)), tolerances=SUMS_F32),
                  ["tiled_matmul"])
  assert {r.case for r in report.rows if r.what == "outputs"} >= {"float32[191, 160], float32[160, 128]",
                                                                  "float32[192, 1], float32[1, 128]"}


@gpu
def test_a_cpp_template_passes_in_each_dtype(isolated_disk_cache):
  report = passes(jmf.check(axpb(), jnp.zeros(1000), dtypes=[F32, F16, BF16]), ["ops::axpb<float>",
                                                                                     "ops::axpb<__half>"])
  assert {r.dtype for r in report.rows if r.what == "outputs"} == {"float32", "float16", "bfloat16"}


@gpu
def test_the_hopper_gemm_passes_and_refuses_what_its_tiles_do_not_take(isolated_disk_cache):
  call = benchmarks_package.module("gemm").gemm(jmf, jax, jnp, np)
  report = passes(jmf.check(call, jnp.zeros((256, 128), BF16), jnp.zeros((256, 128), BF16), tolerances=SUMS_BF16),
                  ["hopper_gemm"])
  assert any(r.skipped and "refuses these inputs" in r.skipped for r in report.rows)   # M % 128, N % 256, K % 64


# ------------------------------------------------------------------ Triton

def triton_corpus():
  import triton_required
  triton_required.import_triton()
  return benchmarks_package.kernels("triton_user")


def triton_softmax(tu):
  return jmf.mosaic_kernel(jmf.triton_kernel(tu.softmax_kernel), lambda x: x, grid=lambda meta, x: x.shape[0],
                           param_order=("out0", "in0", "scalar0", "scalar1", "scalar2", "scalar3"),
                           scalars=lambda meta, x: (i32(x.shape[1]), i32(x.shape[1]), i32(x.shape[0]),
                                                    i32(x.shape[1])),
                           fallback=lambda x: jax.nn.softmax(x.astype(F32), axis=-1).astype(x.dtype))


def triton_matmul(tu):
  kernel = jmf.triton_kernel(tu.grouped_matmul, constexprs=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8))
  return jmf.mosaic_kernel(
      kernel, lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
      grid=lambda meta, a, b: jmf.cdiv(a.shape[0], 64) * jmf.cdiv(b.shape[1], 64),
      scalars=lambda meta, a, b: tuple(i32(v) for v in (a.shape[0], b.shape[1], a.shape[1],   # M, N, K, then the
                                                        a.shape[1], 1, b.shape[1], 1, b.shape[1], 1)),  # strides
      fallback=lambda a, b: jnp.matmul(a.astype(F32), b.astype(F32)).astype(a.dtype))


def triton_add_one(tu):
  return jmf.mosaic_kernel(jmf.triton_kernel(tu.add_one, constexprs={"BLOCK": 1024}), lambda x: x,
                           grid=lambda meta, x: jmf.cdiv(x.size, 1024), scalars=lambda meta, x: (i32(x.size),),
                           fallback=lambda x: x + 1)


def triton_attention(tu, causal: bool):
  """(out, log2-sum-exp) of (Z, H, S, D) fp16 attention; S a multiple of 128 (the kernel's blocks are unmasked)."""
  def strides(q):
    z, h, s, d = q.shape
    return [s * h * d, s * d, d, 1]

  def reference(q, k, v):
    scale = q.shape[-1] ** -0.5
    scores = jnp.einsum("zhsd,zhtd->zhst", q.astype(F32), k.astype(F32)) * scale
    if causal:
      s = scores.shape[-1]
      scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    lse = jax.nn.logsumexp(scores, axis=-1)
    out = jnp.einsum("zhst,zhtd->zhsd", jnp.exp(scores - lse[..., None]), v.astype(F32))
    return out.astype(q.dtype), (lse / np.log(2.0)).reshape(-1, q.shape[2])

  def call(head_dim: int):
    return jmf.mosaic_kernel(
        jmf.triton_kernel(tu.attention_fwd, constexprs={"HEAD_DIM": head_dim, "CAUSAL": causal}),
        lambda q, k, v: (jax.ShapeDtypeStruct(q.shape, q.dtype),
                         jax.ShapeDtypeStruct((q.shape[0] * q.shape[1], q.shape[2]), F32)),
        grid=lambda meta, q, k, v: (jmf.cdiv(q.shape[2], meta["BLOCK_M"]), q.shape[0] * q.shape[1], 1),
        param_order=("in0", "in1", "in2", "scalar0", "out1", "out0", *(f"scalar{k}" for k in range(1, 19))),
        scalars=lambda meta, q, k, v: (np.float32(q.shape[-1] ** -0.5), *(i32(x) for x in strides(q) * 4),
                                       i32(q.shape[1]), i32(q.shape[2])),
        fallback=reference)

  calls = {}
  return lambda q, k, v: calls.setdefault(q.shape[-1], call(q.shape[-1]))(q, k, v)


LN_PROGRAMS, LN_EPS = 64, 1e-5


def triton_layer_norm(tu):
  """layer_norm(x, w, b) over rows, differentiable: Triton's forward, and its backward's two kernels (DX with
  per-program partial sums of DW and DB, then their sum)."""
  def stats(x):
    return jax.ShapeDtypeStruct((x.shape[0],), F32)

  def forward_reference(x, w, b):
    x32 = x.astype(F32)
    mean = jnp.mean(x32, axis=1)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(x32 - mean[:, None]), axis=1) + LN_EPS)
    y = (x32 - mean[:, None]) * rstd[:, None] * w.astype(F32) + b.astype(F32)
    return y.astype(x.dtype), mean, rstd

  def partial_sums(v):  # row r adds into row r % LN_PROGRAMS, as program r % LN_PROGRAMS takes row r
    m, n = v.shape
    rows = -(-m // LN_PROGRAMS) * LN_PROGRAMS
    return jnp.pad(v, ((0, rows - m), (0, 0))).reshape(rows // LN_PROGRAMS, LN_PROGRAMS, n).sum(0)

  def dx_reference(dy, x, w, mean, rstd):
    x_hat = (x.astype(F32) - mean[:, None]) * rstd[:, None]
    w_dy = w.astype(F32) * dy.astype(F32)
    c1 = jnp.mean(x_hat * w_dy, axis=1, keepdims=True)
    c2 = jnp.mean(w_dy, axis=1, keepdims=True)
    dx = (w_dy - (x_hat * c1 + c2)) * rstd[:, None]
    return dx.astype(x.dtype), partial_sums(dy.astype(F32) * x_hat), partial_sums(dy.astype(F32))

  fwd = jmf.mosaic_kernel(
      jmf.triton_kernel(tu.layer_norm_fwd), lambda x, w, b: (jax.ShapeDtypeStruct(x.shape, x.dtype), stats(x),
                                                             stats(x)),
      grid=lambda meta, x, w, b: x.shape[0],
      param_order=("in0", "out0", "in1", "in2", "out1", "out2", "scalar0", "scalar1", "scalar2"),
      scalars=lambda meta, x, w, b: (i32(x.shape[1]), i32(x.shape[1]), np.float32(LN_EPS)),
      fallback=forward_reference)
  dx_kernel = jmf.mosaic_kernel(
      jmf.triton_kernel(tu.layer_norm_bwd_dx),
      lambda dy, x, w, mean, rstd: (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                    *(jax.ShapeDtypeStruct((LN_PROGRAMS, x.shape[1]), F32),) * 2),
      grid=LN_PROGRAMS,
      param_order=("out0", "in0", "in1", "in2", "in3", "in4", "out1", "out2", "scalar0", "scalar1", "scalar2"),
      scalars=lambda meta, dy, x, w, mean, rstd: (i32(x.shape[1]), i32(x.shape[0]), i32(x.shape[1])),
      fallback=dx_reference)
  def dwdb_kernel(dtype):  # DW and DB in the weights' dtype
    return jmf.mosaic_kernel(
        jmf.triton_kernel(tu.layer_norm_bwd_dwdb, constexprs={"BLOCK_G": 32, "BLOCK_N": 64}),
        lambda pw, pb: (jax.ShapeDtypeStruct((pw.shape[1],), dtype),) * 2,
        grid=lambda meta, pw, pb: jmf.cdiv(pw.shape[1], 64),
        param_order=("in0", "in1", "out0", "out1", "scalar0", "scalar1"),
        scalars=lambda meta, pw, pb: (i32(LN_PROGRAMS), i32(pw.shape[1])),
        fallback=lambda pw, pb: (pw.sum(0).astype(dtype), pb.sum(0).astype(dtype)))

  dwdb = {}

  def bwd(x, w, mean, rstd, dy, *_stat_cotangents):  # mean and rstd are not differentiated through
    dx, partial_dw, partial_db = dx_kernel(dy, x, w, mean, rstd)
    return (dx, *dwdb.setdefault(w.dtype, dwdb_kernel(w.dtype))(partial_dw, partial_db))

  norm = jmf.differentiable(fwd, bwd=bwd, residuals=("in0", "in1", "out1", "out2"))
  return lambda x, w, b: norm(x, w, b)[0]


def test_the_triton_corpus_checks_through_its_fallbacks_anywhere(isolated_disk_cache):
  tu = triton_corpus()
  passes(jmf.check(triton_softmax(tu), jnp.zeros((16, 100)), shapes=None))
  passes(jmf.check(triton_matmul(tu), jnp.zeros((32, 48), F16), jnp.zeros((48, 40), F16), shapes=None))
  passes(jmf.check(triton_add_one(tu), jnp.zeros(100), shapes=None))
  passes(jmf.check(triton_attention(tu, causal=True), *[jnp.zeros((1, 2, 128, 64), F16)] * 3, shapes=None,
                   grads=False))
  ln = passes(jmf.check(triton_layer_norm(tu), jnp.zeros((100, 48)), jnp.zeros(48), jnp.zeros(48), shapes=None))
  assert {r.output for r in ln.rows if r.what == "VJP"} == {"d in0", "d in1", "d in2"}


@gpu
def test_the_triton_softmax_matmul_and_add_one_pass_on_every_edge(isolated_disk_cache):
  tu = triton_corpus()
  passes(jmf.check(triton_softmax(tu), jnp.zeros((64, 1000))), ["softmax_kernel"])
  passes(jmf.check(triton_matmul(tu), jnp.zeros((128, 96), F16), jnp.zeros((96, 80), F16), tolerances=SUMS_F16),
         ["grouped_matmul"])
  passes(jmf.check(triton_add_one(tu), jnp.zeros(3000)), ["add_one"])


@gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_triton_attention_passes(isolated_disk_cache, causal):
  tu = triton_corpus()
  args = [jnp.zeros((2, 4, 256, 64), F16)] * 3
  # fp16 to rtol 1e-2, as benchmarks/triton_native.py holds it: the kernel rounds the softmax weights to fp16
  # before P @ V. Simulated (P rounded to fp16), an element near zero is off by up to 1.7e-4 beyond that: atol 2e-3.
  # The fp32 log2-sum-exp keeps the table's (1e-5, 1e-5): its sums are fp32 and it is about 8 (rtol gives 8e-5).
  passes(jmf.check(triton_attention(tu, causal), *args, shapes=[((2, 4, 256, 64),) * 3, ((1, 1, 128, 64),) * 3],
                   grads=False, tolerances={F16: (1e-2, 2e-3)}), ["attention_fwd"])


@gpu
def test_the_triton_layer_norm_and_its_backward_pass_in_two_dtypes(isolated_disk_cache):
  tu = triton_corpus()
  # dW and dB sum 256 rows (per program, then the programs' partial sums): SUMS_F32. In float16 the table's: the
  # kernel's order of those sums against numpy's, each rounded to float16, differ by up to 9e-7 beyond rtol
  # (simulated on these shapes and edges, 20 seeds), under the floor of 1e-5.
  report = passes(jmf.check(triton_layer_norm(tu), jnp.zeros((256, 384)), jnp.zeros(384), jnp.zeros(384),
                            dtypes=[F32, F16], tolerances=SUMS_F32),
                  ["layer_norm_fwd", "layer_norm_bwd_dx", "layer_norm_bwd_dwdb"])
  assert {r.dtype for r in report.rows if r.what == "VJP"} == {"float32", "float16"}


# ------------------------------------------------------------------ Gluon

def gluon_corpus():
  import triton_required
  triton_required.import_triton()
  return benchmarks_package.kernels("gluon_user")


def gluon_gemm(gu, ring: bool):
  """The tutorials' wgmma + TMA GEMM (05-wgmma's, or 07-persistence's ring with MMAImpl=WGMMA), 128x128x64 tiles,
  its output written through a descriptor of out0."""
  from triton.experimental.gluon import language as gl
  kernel, constexprs = ((gu.matmul_pipelined, {"MMAImpl": gu.WGMMA, "num_buffers": 4}) if ring else
                        (gu.blocked_matmul_pipelined, {}))
  TD = jmf.TensorDescriptor

  def descriptor(operand, block):
    return TD.from_tensor(operand, block, layout=gl.NVMMASharedLayout.get_default_for(block, gl.float16))
  return jmf.mosaic_kernel(
      jmf.gluon_kernel(kernel, constexprs=constexprs, num_warps=4),
      lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
      grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], 128), jmf.cdiv(b.shape[1], 128)),
      param_order=(descriptor("in0", [128, 64]), descriptor("in1", [64, 128]), descriptor("out0", [128, 128])),
      fallback=lambda a, b: jnp.matmul(a.astype(F32), b.astype(F32)).astype(a.dtype))


def gluon_add_one(gu):
  return jmf.mosaic_kernel(jmf.gluon_kernel(gu.add_one, constexprs={"BLOCK": 1024}), lambda x: x,
                           grid=lambda meta, x: jmf.cdiv(x.size, 1024), scalars=lambda meta, x: (i32(x.size),),
                           fallback=lambda x: x + 1)


# M any; N and K multiples of 8 (TMA's 16-byte rows); K past the ring's prologue or not (TMA reads zeros past it).
GEMM_SHAPES = [((256, 192), (192, 384)), ((200, 72), (72, 136)), ((1, 64), (64, 8))]


def test_the_gluon_corpus_checks_through_its_fallbacks_anywhere(isolated_disk_cache):
  gu = gluon_corpus()
  for ring in (False, True):
    passes(jmf.check(gluon_gemm(gu, ring), jnp.zeros((256, 192), F16), jnp.zeros((192, 384), F16), shapes=None,
                     grads=False))
  passes(jmf.check(gluon_add_one(gu), jnp.zeros(100), shapes=None))


@gpu
@pytest.mark.parametrize("ring", [False, True], ids=["double_buffered", "ring"])
def test_the_gluon_wgmma_gemms_pass_on_every_shape(isolated_disk_cache, ring):
  if not str(getattr(jax.devices()[0], "compute_capability", "0")).startswith("9"):
    pytest.skip("the tutorials' wgmma GEMMs are Hopper's (sm_90)")
  gu = gluon_corpus()
  name = "matmul_pipelined" if ring else "blocked_matmul_pipelined"
  passes(jmf.check(gluon_gemm(gu, ring), jnp.zeros((256, 192), F16), jnp.zeros((192, 384), F16),
                   shapes=GEMM_SHAPES, grads=False, tolerances=SUMS_F16), [name])


@gpu
def test_the_gluon_add_one_passes_on_every_edge(isolated_disk_cache):
  passes(jmf.check(gluon_add_one(gluon_corpus()), jnp.zeros(3000)), ["add_one"])


# ------------------------------------------------------------------ CuTe DSL

def cute_corpus(name):
  import cute_required  # noqa: F401  (skips where the CuTe DSL is not installed)
  return benchmarks_package.kernels(name)


@gpu
def test_the_cute_elementwise_kernels_pass(isolated_disk_cache):
  ew = cute_corpus("cute_elementwise")
  def axpy(x, y):
    return jmf.cute_call(ew.axpy, output_shape_dtype=jax.ShapeDtypeStruct(x.shape, x.dtype), alpha=0.5)(x, y)

  # N a multiple of the 16-byte vector (the launcher's rule), M any.
  passes(jmf.check(axpy, jnp.zeros((200, 256)), jnp.zeros((200, 256)), reference=lambda x, y: 0.5 * x + y,
                   shapes=[((200, 256),) * 2, ((1, 8),) * 2, ((37, 64),) * 2], dtypes=[F32, BF16], grads=False))
  one = lambda v: jmf.cute_call(ew.add_one, output_shape_dtype=jax.ShapeDtypeStruct(v.shape, v.dtype))(v)  # noqa: E731
  passes(jmf.check(one, jnp.zeros(3000), reference=lambda v: v + 1, grads=False))


@gpu
def test_the_cute_rmsnorm_passes(isolated_disk_cache):
  norm = cute_corpus("cute_rmsnorm")

  def rmsnorm(x, w):
    return jmf.cute_call(norm.rmsnorm, output_shape_dtype=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         use_static_tensors=True)(x, w)

  def reference(x, w):
    x32 = x.astype(F32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=1, keepdims=True) + 1e-6) * w.astype(F32)).astype(x.dtype)

  passes(jmf.check(rmsnorm, jnp.zeros((64, 1024)), jnp.zeros(1024), reference=reference,
                   shapes=[((64, 1024), (1024,)), ((1, 256), (256,)), ((33, 4096), (4096,))], dtypes=[F32, BF16],
                   grads=False))


@gpu
def test_the_cute_hopper_gemm_passes(isolated_disk_cache):
  gemm = cute_corpus("cute_gemm")

  def matmul(a, b):
    return jmf.cute_call(gemm.hopper_gemm, output_shape_dtype=jax.ShapeDtypeStruct((a.shape[0], b.shape[0]),
                                                                                  a.dtype), tile_n=128)(a, b)

  reference = lambda a, b: jnp.matmul(a.astype(F32), b.astype(F32).T).astype(a.dtype)  # noqa: E731
  # M any; N and K multiples of 8 (TMA's 16-byte rows, of C and of A and B).
  passes(jmf.check(matmul, jnp.zeros((512, 256), BF16), jnp.zeros((384, 256), BF16), reference=reference,
                   shapes=[((512, 256), (384, 256)), ((300, 72), (136, 72)), ((1, 64), (8, 64))], grads=False,
                   tolerances=SUMS_BF16))


# ------------------------------------------------------------------ FlashAttention-4 and quack, through cute_call

def attention_reference(causal: bool):
  """(out, natural log-sum-exp) of (batch, seqlen, heads, head_dim) attention in float32, K and V heads repeated
  for grouped queries: autodiff of it is the gradient FA4's backward kernels must give."""
  def reference(q, k, v):
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(t.astype(F32), groups, axis=2) for t in (k, v))
    scores = jnp.einsum("bshd,bthd->bhst", q.astype(F32), k) * q.shape[-1] ** -0.5
    if causal:
      s, t = scores.shape[-2:]
      scores = jnp.where(jnp.tril(jnp.ones((s, t), bool), k=t - s), scores, -jnp.inf)
    lse = jax.nn.logsumexp(scores, axis=-1)
    out = jnp.einsum("bhst,bthd->bshd", jnp.exp(scores - lse[..., None]), v)
    return out.astype(q.dtype), lse
  return reference


# rtol as tests/test_fa4_kernels.py and test_quack_kernels.py hold them: bf16 outputs and gradients to 3e-2, the
# fp32 log-sum-exp to 2e-3. atol, per element: FlashAttention rounds P and dS to bf16 before their matmuls; simulated
# so on these shapes (causal the worst), an element near zero is off by up to 5e-3 beyond rtol 3e-2: atol 2e-2
# (the values' RMS is 0.05 to 0.25). Quack's softmax is exact but for bf16 roundings of y (its backward reads the
# rounded y): its outputs need no atol, its gradient up to 5e-7 (values' RMS 5e-5 to 2e-3): atol 1e-5.
FA4_TOLERANCES = {BF16: (3e-2, 2e-2), F32: (2e-3, 2e-3)}
QUACK_TOLERANCES = {BF16: (3e-2, 1e-5)}


@gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attention_4_forward_and_backward_pass(isolated_disk_cache, causal):
  kernel_libraries.import_or_skip("flash_attn.cute.flash_fwd_sm90", "flash-attn-4")
  fa = cute_corpus("fa4_user")
  attention = lambda q, k, v: fa.flash_attention(q, k, v, causal=causal)  # noqa: E731
  mha, gqa_ragged = ((2, 256, 4, 128),) * 3, ((1, 1000, 8, 64), (1, 1000, 2, 64), (1, 1000, 2, 64))
  report = passes(jmf.check(attention, *[jnp.zeros(s, BF16) for s in mha], reference=attention_reference(causal),
                            shapes=[mha, gqa_ragged], tolerances=FA4_TOLERANCES))
  assert {r.output for r in report.rows if r.what == "VJP"} == {"d in0", "d in1", "d in2"}
  assert all("no forward-mode derivative" in r.skipped for r in report.rows if r.what == "JVP")


@gpu
def test_quack_softmax_and_its_gradient_pass(isolated_disk_cache):
  kernel_libraries.import_or_skip("quack.softmax", "quack-kernels")
  qk = cute_corpus("quack_user")
  reference = lambda x: jax.nn.softmax(x.astype(F32), axis=-1).astype(x.dtype)  # noqa: E731
  report = passes(jmf.check(qk.softmax, jnp.zeros((512, 4096), BF16), reference=reference,
                            shapes=[((512, 4096),), ((77, 1000),), ((64, 32768),)], tolerances=QUACK_TOLERANCES))
  assert [r.failed for r in report.rows if r.what == "VJP"] == [False] * 3


def test_each_check_keeps_the_tolerances_it_states_and_the_table_gives_the_rest():
  # What the GPU rows above are held to: a dtype a check names keeps its stated pair, whatever the table says; the
  # other dtypes get the table's (bfloat16's floor is 1e-5, no longer its rtol).
  pair = lambda x: (x, x.astype(F32))  # noqa: E731  (a bfloat16 and a float32 output)
  expected = [(None, [(1.6e-2, 1e-5), (1e-5, 1e-5)]), (FA4_TOLERANCES, [(3e-2, 2e-2), (2e-3, 2e-3)]),
              (QUACK_TOLERANCES, [(3e-2, 1e-5), (1e-5, 1e-5)]), (SUMS_BF16, [(1.6e-2, 1e-4), (1e-5, 1e-5)])]
  for stated, held in expected:
    report = jmf.check(pair, jnp.zeros(8, BF16), reference=pair, tolerances=stated, shapes=None, vmap=False,
                       eager=False, grads=False)
    assert [(r.rtol, r.atol) for r in report.rows] == held, (stated, report)
