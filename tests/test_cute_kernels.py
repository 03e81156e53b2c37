"""The CuTe DSL kernels of the benchmark corpus (benchmarks/kernels/cute_*.py) themselves.

Any machine with the DSL: each launcher compiles for sm_90a (the DSL compiles without a GPU), with static and with
dynamic shapes where it takes them, and refuses what it cannot do with a message; the GEMM's tile order visits
every tile once; through `jmf.cute_call`, each lowers to one of our custom calls. GPU: each kernel runs through
`jmf.cute_call` inside `jax.jit` (outputs poisoned by the runtime first, conftest.py) and through the DSL's own
launcher (`cute.compile`'s function on torch tensors, outputs filled with NaN first), and matches numpy on fresh
random inputs: a wrong kernel fails both, a wrong front end only the first.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("cutlass.cute", reason="needs the CuTe DSL (pip install nvidia-cutlass-dsl)")
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack, make_fake_compact_tensor

import jax_mosaic_ffi as jmf

import benchmarks_package

ew = benchmarks_package.kernels("cute_elementwise")
gemm = benchmarks_package.kernels("cute_gemm")
norm = benchmarks_package.kernels("cute_rmsnorm")

gpu = pytest.mark.gpu
SM90 = "--gpu-arch sm_90a"
DTYPES = {"bf16": (cutlass.BFloat16, jnp.bfloat16), "f32": (cutlass.Float32, np.float32)}


def fake(dtype, shape):
  """A row-major tensor argument for cute.compile, without memory: ints are static extents, None dynamic ones."""
  dims = tuple(cute.sym_int32(divisibility=8) if d is None else d for d in shape)
  return make_fake_compact_tensor(dtype, dims, stride_order=tuple(reversed(range(len(dims)))), assumed_align=16)


def compile_sm90(fn, *args, **constexprs):
  return cute.compile(fn, cuda.CUstream(0), *args, **constexprs, options=SM90)


def rows(rng, shape, dtype, scale=1.0):
  return (scale * rng.standard_normal(shape, np.float32)).astype(dtype)


def relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


# ---------------------------------------------------------------- any machine with the DSL

@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("shape", [(4096, 4096), (1000, 776), (None, None)], ids=["4096", "ragged", "dynamic"])
def test_axpy_compiles_for_sm90a(dtype, shape):
  x = fake(DTYPES[dtype][0], shape)
  assert compile_sm90(ew.axpy, x, x, x, alpha=0.5) is not None


def test_add_one_compiles_for_sm90a():
  x = fake(cutlass.Float32, (None,))
  assert compile_sm90(ew.add_one, x, x) is not None


@pytest.mark.parametrize("shape,threads", [((16384, 8192), 256), ((77, 1000), 128)], ids=["8192", "ragged"])
def test_rmsnorm_compiles_for_sm90a(shape, threads):
  x, w = fake(cutlass.BFloat16, shape), fake(cutlass.BFloat16, shape[1:])
  assert compile_sm90(norm.rmsnorm, x, w, x, threads=threads) is not None


def test_rmsnorm_asks_for_static_shapes():
  x, w = fake(cutlass.BFloat16, (64, None)), fake(cutlass.BFloat16, (None,))
  with pytest.raises(Exception, match="use_static_tensors=True"):
    compile_sm90(norm.rmsnorm, x, w, x)


GEMM_CONFIGS = {"128x256": {}, "128x256_cluster2": {"cluster_m": 2}, "128x128": {"tile_n": 128}}


@pytest.mark.parametrize("config", GEMM_CONFIGS)
@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (None, None, None)], ids=["4096", "dynamic"])
def test_gemm_compiles_for_sm90a(config, shape):
  m, n, k = shape
  a, b, c = fake(cutlass.BFloat16, (m, k)), fake(cutlass.BFloat16, (n, k)), fake(cutlass.BFloat16, (m, n))
  start = time.perf_counter()
  assert compile_sm90(gemm.hopper_gemm, a, b, c, **GEMM_CONFIGS[config]) is not None
  print(f"hopper_gemm {config} {shape}: compiled in {time.perf_counter() - start:.2f} s")


@pytest.mark.parametrize("constexprs,message", [({"tile_n": 64}, "tile_n must be 128 or 256"),
                                                ({"cluster_m": 4}, "cluster_m must be 1 or 2")])
def test_gemm_refuses_configs_it_has_no_code_for(constexprs, message):
  a = fake(cutlass.BFloat16, (256, 256))
  with pytest.raises(Exception, match=message):
    compile_sm90(gemm.hopper_gemm, a, a, a, **constexprs)


def test_gemm_refuses_fp32_operands():
  a = fake(cutlass.Float32, (256, 256))
  with pytest.raises(Exception, match="bf16 or fp16"):
    compile_sm90(gemm.hopper_gemm, a, a, a)


@pytest.mark.parametrize("cluster_rows,tiles_n,group", [(32, 16, 8), (16, 16, 8), (5, 7, 8), (13, 3, 4), (1, 1, 8),
                                                         (9, 11, 1)])
def test_gemm_tile_order_visits_every_tile_once(cluster_rows, tiles_n, group):
  visited = [gemm.grouped_tile(t, cluster_rows, tiles_n, group, min) for t in range(cluster_rows * tiles_n)]
  assert sorted(visited) == [(r, c) for r in range(cluster_rows) for c in range(tiles_n)]
  # Grouped: within a full group, consecutive tiles walk down `group` rows before moving one column right.
  if cluster_rows >= group:
    assert visited[:group] == [(r, 0) for r in range(group)]


# In a process of its own: the DSL reads its target (CUTE_DSL_ARCH) once, when it is imported (with 4.8.1 on a
# machine without a GPU, compile_options="--gpu-arch sm_90a" compiles but the object dump then fails to link).
LOWER_EACH_KERNEL = """
import json, sys, warnings
import jax, jax.numpy as jnp
import jax_mosaic_ffi as jmf
from hlo_inspect import custom_calls
import benchmarks_package
ew, gemm, norm = (benchmarks_package.kernels(f"cute_{k}") for k in ("elementwise", "gemm", "rmsnorm"))
bf16 = jnp.bfloat16
a, b = jax.ShapeDtypeStruct((512, 256), bf16), jax.ShapeDtypeStruct((384, 256), bf16)
x, w = jax.ShapeDtypeStruct((64, 1024), bf16), jax.ShapeDtypeStruct((1024,), bf16)
cases = {
    "axpy": (jmf.cute_call(ew.axpy, output_shape_dtype=x, alpha=0.5), (x, x)),
    "rmsnorm": (jmf.cute_call(norm.rmsnorm, output_shape_dtype=x, use_static_tensors=True), (x, w)),
    "gemm": (jmf.cute_call(gemm.hopper_gemm, output_shape_dtype=jax.ShapeDtypeStruct((512, 384), bf16),
                           cluster_m=2), (a, b)),
}
found = {}
for name, (call, avals) in cases.items():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # no GPU here
    lowered = jax.jit(call).trace(*avals).lower(lowering_platforms=("cuda",))
  found[name] = [[c["target"], c["operands"], c["results"]] for c in custom_calls(lowered)]
print(json.dumps(found))
"""


def test_each_kernel_lowers_to_one_of_our_custom_calls(tmp_path):
  import fresh_process
  found = fresh_process.run(LOWER_EACH_KERNEL, env={
      "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_CACHE_DIR": str(tmp_path / "dsl"),
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "jmf")}).result
  for name, calls in found.items():
    assert len(calls) == 1 and calls[0][0].startswith("jax_mosaic_ffi") and calls[0][1:] == [2, 1], (name, calls)


# ---------------------------------------------------------------- GPU: through jmf.cute_call

@gpu
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("shape", [(1000, 776), (64, 8192)], ids=["ragged", "wide"])
def test_axpy_through_cute_call(rng, dtype, shape):
  x, y = (rows(rng, shape, DTYPES[dtype][1]) for _ in "xy")
  call = jmf.cute_call(ew.axpy, output_shape_dtype=jax.ShapeDtypeStruct(shape, x.dtype), alpha=0.5)
  got = np.asarray(jax.jit(call)(x, y))
  np.testing.assert_allclose(got.astype(np.float32), ew.axpy_reference(x, y, 0.5).astype(np.float32),
                             rtol=1e-2, atol=1e-2)


@gpu
def test_add_one_chain_through_cute_call(rng):
  x = rows(rng, (256,), np.float32)
  call = jmf.cute_call(ew.add_one, output_shape_dtype=jax.ShapeDtypeStruct(x.shape, x.dtype))

  def chain(v):
    for _ in range(20):
      v = call(v)
    return v
  want = x
  for _ in range(20):  # the same float32 additions, in the same order
    want = want + np.float32(1)
  np.testing.assert_array_equal(np.asarray(jax.jit(chain)(x)), want)


@gpu
@pytest.mark.parametrize("shape,threads", [((300, 4096), 256), ((77, 1000), 128)], ids=["4096", "ragged"])
def test_rmsnorm_through_cute_call(rng, shape, threads):
  x, w = rows(rng, shape, jnp.bfloat16), rows(rng, shape[1:], jnp.bfloat16)
  call = jmf.cute_call(norm.rmsnorm, output_shape_dtype=jax.ShapeDtypeStruct(shape, x.dtype), use_static_tensors=True,
                   threads=threads)
  got = np.asarray(jax.jit(call)(x, w))
  assert relative_error(got, norm.rmsnorm_reference(x, w)) < 2e-2


# (M, N, K, constexprs): tiles past the edges, one k-tile, more k-tiles than stages, many tiles per CTA (the ring's
# phases carried from tile to tile), clusters with an odd number of tile rows.
GEMM_CASES = [
    (512, 768, 320, {}),
    (200, 264, 136, {}),
    (256, 512, 64, {}),
    (4096, 4096, 256, {}),
    (512, 1024, 192, {"max_clusters": 2}),
    (384, 512, 512, {"cluster_m": 2}),
    (1024, 1024, 320, {"cluster_m": 2, "max_clusters": 3}),
    (200, 264, 136, {"cluster_m": 2}),
    (512, 640, 448, {"tile_n": 128, "raster_group": 2}),
]


def gemm_id(case):
  m, n, k, constexprs = case
  return f"{m}x{n}x{k}" + "".join(f"-{key}{value}" for key, value in constexprs.items())


@gpu
@pytest.mark.parametrize("case", GEMM_CASES, ids=[gemm_id(c) for c in GEMM_CASES])
def test_gemm_through_cute_call(rng, case):
  m, n, k, constexprs = case
  a, b = rows(rng, (m, k), jnp.bfloat16), rows(rng, (n, k), jnp.bfloat16, 1 / np.sqrt(k))
  call = jmf.cute_call(gemm.hopper_gemm, output_shape_dtype=jax.ShapeDtypeStruct((m, n), jnp.bfloat16), **constexprs)
  got = np.asarray(jax.jit(call)(a, b))
  assert relative_error(got, a.astype(np.float32) @ b.astype(np.float32).T) < 1e-2


# ---------------------------------------------------------------- GPU: through the DSL's own launcher (torch)

@pytest.fixture(scope="module")
def torch():
  torch = pytest.importorskip("torch")
  if not torch.cuda.is_available():
    pytest.skip("torch sees no GPU")
  return torch


def on_gpu(torch, array):
  return torch.from_numpy(np.asarray(array, np.float32)).cuda().to(torch.bfloat16 if array.dtype == jnp.bfloat16
                                                                   else torch.float32)


def run_native(torch, fn, inputs, outputs, **constexprs):
  """fn through cute.compile on torch tensors, as the DSL's users launch it; the outputs as numpy float32."""
  stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
  tensors = [from_dlpack(t, assumed_align=16) for t in (*inputs, *outputs)]
  compiled = cute.compile(fn, stream, *tensors, **constexprs)
  compiled(stream, *tensors)
  torch.cuda.synchronize()
  return [t.float().cpu().numpy() for t in outputs]


@gpu
def test_kernels_through_the_dsls_own_launcher(torch, rng):
  x, y = rows(rng, (1000, 776), jnp.bfloat16), rows(rng, (1000, 776), jnp.bfloat16)
  out = torch.full((1000, 776), float("nan"), device="cuda", dtype=torch.bfloat16)
  (got,) = run_native(torch, ew.axpy, [on_gpu(torch, x), on_gpu(torch, y)], [out], alpha=0.5)
  np.testing.assert_allclose(got, ew.axpy_reference(x, y, 0.5).astype(np.float32), rtol=1e-2, atol=1e-2)

  x, w = rows(rng, (300, 4096), jnp.bfloat16), rows(rng, (4096,), jnp.bfloat16)
  out = torch.full((300, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
  (got,) = run_native(torch, norm.rmsnorm, [on_gpu(torch, x), on_gpu(torch, w)], [out])
  assert relative_error(got, norm.rmsnorm_reference(x, w)) < 2e-2

  for m, n, k, constexprs in (GEMM_CASES[3], GEMM_CASES[6]):
    a, b = rows(rng, (m, k), jnp.bfloat16), rows(rng, (n, k), jnp.bfloat16, 1 / np.sqrt(k))
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    (got,) = run_native(torch, gemm.hopper_gemm, [on_gpu(torch, a), on_gpu(torch, b)], [out], **constexprs)
    assert relative_error(got, a.astype(np.float32) @ b.astype(np.float32).T) < 1e-2, constexprs
