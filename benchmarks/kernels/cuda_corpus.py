"""Real-world CUDA C++ kernels as users bring them: corpus/*.cu, each with its launch recipe, inputs and reference.

Each corpus file is one kernel written in the style of a real codebase
(llm.c, Apex, FasterTransformer, PyTorch, vLLM, CUTLASS examples, CUDA
tutorials), with the idioms that trip NVRTC: assert, INFINITY, uint, CUB,
__launch_bounds__, __restrict__, __ldg, cooperative groups, templates,
fp16/bf16/fp8 types, >48 KiB of dynamic shared memory, in-place updates.
They are our own code (each file's header says what it mirrors).

CASES below is the table: file, kernel name, launch recipe, inputs and a
numpy reference (float64 where precision matters) with its tolerances.
tests/test_real_kernels.py compiles, lowers and runs each; the corpus benchmark
(benchmarks/corpus.py) times each against XLA at larger sizes, set through the
module's size constants (GELU_SHAPE, SG_M, ...), which the recipes and input
makers read when called. Only the tests and the benchmark's child process
import this module (it imports jax).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jax_mosaic_ffi as jmf

CORPUS = pathlib.Path(__file__).parent / "corpus"
f32, f16, bf16 = np.float32, np.float16, ml_dtypes.bfloat16


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def spec(shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype)


def f64(x):
  return np.asarray(x).astype(np.float64)


@dataclasses.dataclass(frozen=True)
class Case:
  file: str                   # corpus/<file>, compiled as it is
  name: str                   # the kernel, as jmf.cuda_kernel names it
  call: Callable              # kernel -> the function of the inputs to jit: the launch recipe
  inputs: Callable            # rng -> tuple of numpy arrays
  reference: Callable         # *inputs -> tuple of expected outputs
  tolerance: tuple            # per output: (rtol, atol), None for exact equality, or "by check"
  check: Callable | None = None  # (inputs, outputs) -> None: invariants beyond the reference
  in_place: bool = False      # passes an aliased pair once through param_order

  @property
  def id(self) -> str:
    return f"{self.file}:{self.name}"


# --- gelu_bf16.cu: elementwise bf16, packed __nv_bfloat162 (llm.c style) ------------

GELU_SHAPE = (257, 1030)  # 264710 elements, not a multiple of 8: the scalar tail runs too


def gelu_call(kernel):
  n = math.prod(GELU_SHAPE)
  # 8 elements per thread; the kernel takes (out, inp, N)
  return jmf.mosaic_kernel(kernel, spec(GELU_SHAPE, bf16), grid=cdiv(n, 8 * 256), block=256,
                           scalars=(np.int32(n),), param_order=("out0", "in0", "scalar0"))


def gelu_reference(x):
  x = f64(x)
  return (0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),)


GELU = Case("gelu_bf16.cu", "gelu_forward_bf16", gelu_call,
            lambda rng: ((rng.standard_normal(GELU_SHAPE) * 3).astype(bf16),), gelu_reference,
            tolerance=((1e-2, 1e-3),))  # one bf16 rounding: 2^-9 relative


# --- layernorm_forward.cu: three outputs, a warp per row, cg::reduce (llm.c style) -----

LN_ROWS, LN_C = 1003, 768  # the last block of 8 warps has 3 rows


def layernorm_call(kernel):
  return jmf.mosaic_kernel(
      kernel, (spec((LN_ROWS, LN_C), f32), spec((LN_ROWS,), f32), spec((LN_ROWS,), f32)),
      grid=cdiv(LN_ROWS, 8), block=256, scalars=(np.int32(LN_ROWS), np.int32(LN_C)),
      param_order=("out0", "out1", "out2", "in0", "in1", "in2", "scalar0", "scalar1"))


def layernorm_inputs(rng):
  return ((rng.standard_normal((LN_ROWS, LN_C)) * 2 + 0.5).astype(f32),
          rng.standard_normal(LN_C).astype(f32), rng.standard_normal(LN_C).astype(f32))


def layernorm_reference(x, weight, bias):
  x = f64(x)
  mean = x.mean(axis=1)
  rstd = 1 / np.sqrt(((x - mean[:, None]) ** 2).mean(axis=1) + 1e-5)
  return (x - mean[:, None]) * rstd[:, None] * f64(weight) + f64(bias), mean, rstd


LAYERNORM = Case("layernorm_forward.cu", "layernorm_forward", layernorm_call, layernorm_inputs,
                 layernorm_reference, tolerance=((1e-4, 1e-4), (1e-5, 1e-5), (1e-5, 1e-6)))


# --- softmax_online.cu: online softmax, warp shuffles, -INFINITY, no includes ----------

SM_ROWS, SM_C = 777, 1000


def softmax_call(kernel):
  return jmf.mosaic_kernel(kernel, spec((SM_ROWS, SM_C), f32), grid=cdiv(SM_ROWS, 4), block=128,
                           scalars=(np.int32(SM_ROWS), np.int32(SM_C)),
                           param_order=("out0", "in0", "scalar0", "scalar1"))


def softmax_reference(x):
  e = np.exp(f64(x) - f64(x).max(axis=1, keepdims=True))
  return (e / e.sum(axis=1, keepdims=True),)


SOFTMAX = Case("softmax_online.cu", "softmax_forward_online", softmax_call,
               lambda rng: ((rng.standard_normal((SM_ROWS, SM_C)) * 4).astype(f32),),  # wide: the max moves
               softmax_reference, tolerance=((1e-4, 1e-9),),
               check=lambda inputs, outs: np.testing.assert_allclose(f64(outs[0]).sum(axis=1), 1, rtol=1e-5))


# --- sgemm_smem.cu: tiled FP32 GEMM, 64 KiB of dynamic shared memory --------------------

SG_M, SG_N, SG_K = 512, 384, 320  # multiples of the 128x128x64 tiles
SG_SMEM = (128 * 64 + 64 * 128) * 4  # the A and B tiles: 65536 bytes, over the 48 KiB default
SG_ALPHA = np.float32(1.5)


def sgemm_call(kernel):
  return jmf.mosaic_kernel(kernel, spec((SG_M, SG_N), f32), grid=(SG_N // 128, SG_M // 128), block=256,
                           smem_bytes=SG_SMEM,
                           scalars=(np.int32(SG_M), np.int32(SG_N), np.int32(SG_K), SG_ALPHA))


SGEMM = Case("sgemm_smem.cu", "sgemm_smem<128, 128, 64, 8, 8>", sgemm_call,
             lambda rng: (rng.standard_normal((SG_M, SG_K)).astype(f32),
                          rng.standard_normal((SG_K, SG_N)).astype(f32)),
             lambda a, b: (f64(SG_ALPHA) * (f64(a) @ f64(b)),),
             tolerance=((1e-4, 1e-3),))  # sums of 320 products of size ~1, in fp32


# --- wmma_gemm.cu: tensor cores, fp16 in, fp32 accumulate, + bias -----------------------

WM_M, WM_N, WM_K = 256, 192, 320  # multiples of the 32x32 block tile and of k = 16


def wmma_call(kernel):
  return jmf.mosaic_kernel(kernel, spec((WM_M, WM_N), f32), grid=(WM_N // 32, WM_M // 32), block=128,
                           scalars=(np.int32(WM_M), np.int32(WM_N), np.int32(WM_K)))


WMMA = Case("wmma_gemm.cu", "wmma_gemm_bias", wmma_call,
            lambda rng: (rng.standard_normal((WM_M, WM_K)).astype(f16),
                         rng.standard_normal((WM_K, WM_N)).astype(f16),
                         rng.standard_normal(WM_N).astype(f32)),
            lambda a, b, bias: (f64(a) @ f64(b) + f64(bias),),
            tolerance=((1e-3, 1e-2),))  # fp16 products are exact in fp32; tensor-core accumulation


# --- adamw.cu: in place, params/m/v through one pointer each ----------------------------

AW_N = 1_000_003
AW_LR, AW_BETA1, AW_BETA2, AW_EPS, AW_WD, AW_STEP = (np.float32(1e-3), np.float32(0.9), np.float32(0.999),
                                                     np.float32(1e-8), np.float32(0.01), 3)
AW_C1 = np.float32(1 - float(AW_BETA1) ** AW_STEP)  # bias corrections, as the caller computes them
AW_C2 = np.float32(1 - float(AW_BETA2) ** AW_STEP)


def adamw_call(kernel):
  p = spec((AW_N,), f32)
  # Inputs (p, m, v, g); outputs (p, m, v) alias inputs 0-2, and the kernel
  # gets each of those buffers once: the in-place form of param_order.
  return jmf.mosaic_kernel(
      kernel, (p, p, p), grid=cdiv(AW_N, 256), block=256,
      scalars=(AW_LR, AW_BETA1, AW_BETA2, AW_C1, AW_C2, AW_EPS, AW_WD, np.int64(AW_N)),
      input_output_aliases={0: 0, 1: 1, 2: 2},
      param_order=("in0", "in1", "in2", "in3") + tuple(f"scalar{k}" for k in range(8)))


def adamw_inputs(rng):
  return (rng.standard_normal(AW_N).astype(f32), (rng.standard_normal(AW_N) * 0.01).astype(f32),
          (rng.random(AW_N) * 1e-4).astype(f32), (rng.standard_normal(AW_N) * 0.1).astype(f32))


def adamw_reference(p, m, v, g):
  p, m, v, g = f64(p), f64(m), f64(v), f64(g)
  b1, b2 = f64(AW_BETA1), f64(AW_BETA2)
  m = b1 * m + (1 - b1) * g
  v = b2 * v + (1 - b2) * g * g
  step = (m / f64(AW_C1)) / (np.sqrt(v / f64(AW_C2)) + f64(AW_EPS)) + f64(AW_WD) * p
  return p - f64(AW_LR) * step, m, v


ADAMW = Case("adamw.cu", "adamw_step", adamw_call, adamw_inputs, adamw_reference,
             tolerance=((1e-5, 1e-6), (1e-5, 1e-8), (1e-5, 1e-12)), in_place=True)  # m: 0.9 m + 0.1 g cancels


# --- attention_forward.cu: flash-style attention, head dim 64, causal --------------------

AT_B, AT_H, AT_T, AT_D = 2, 4, 200, 64  # T not a multiple of the 8-query blocks or 32-key tiles
AT_SCALE = np.float32(1 / math.sqrt(AT_D))


def attention_call(kernel):
  return jmf.mosaic_kernel(kernel, spec((AT_B, AT_H, AT_T, AT_D), f32), grid=(cdiv(AT_T, 8), AT_B * AT_H),
                           block=8 * 32, scalars=(np.int32(AT_T), AT_SCALE, np.int32(1)))


def attention_reference(q, k, v):
  scores = np.einsum("bhqd,bhkd->bhqk", f64(q), f64(k)) * f64(AT_SCALE)
  scores = np.where(np.tril(np.ones((AT_T, AT_T), bool)), scores, -np.inf)
  p = np.exp(scores - scores.max(axis=-1, keepdims=True))
  return (np.einsum("bhqk,bhkd->bhqd", p / p.sum(axis=-1, keepdims=True), f64(v)),)


ATTENTION = Case("attention_forward.cu", "attention_forward<64, 8, 32>", attention_call,
                 lambda rng: tuple(rng.standard_normal((AT_B, AT_H, AT_T, AT_D)).astype(f32) for _ in range(3)),
                 attention_reference, tolerance=((2e-4, 2e-5),))


# --- row_stats_cub.cu: cub::BlockReduce (sum and a custom max) -------------------------

RS_ROWS, RS_C = 300, 5000


def row_stats_call(kernel):
  return jmf.mosaic_kernel(kernel, (spec((RS_ROWS,), f32), spec((RS_ROWS,), f32)), grid=RS_ROWS, block=256,
                           scalars=(np.int32(RS_C),))


ROW_STATS = Case("row_stats_cub.cu", "row_sumsq_amax<256>", row_stats_call,
                 lambda rng: (rng.standard_normal((RS_ROWS, RS_C)).astype(f32),),
                 lambda x: ((f64(x) ** 2).sum(axis=1), np.abs(x).max(axis=1)),
                 tolerance=((2e-5, 0), None))  # the maximum is exact


# --- scale_vec.cu: a template kernel named by its C++ name ------------------------------

SC_N = 1_000_003  # not a multiple of the vector width: the tail runs too
SC_ALPHA = np.float32(-1.75)


def scale_case(ctype: str, dtype, vec: int) -> Case:
  def call(kernel):
    return jmf.mosaic_kernel(kernel, spec((SC_N,), dtype), grid=cdiv(SC_N, vec * 256), block=256,
                             scalars=(SC_ALPHA, np.int64(SC_N)), param_order=("out0", "in0", "scalar0", "scalar1"))

  return Case("scale_vec.cu", f"kernels::scale<{ctype}, {vec}>", call,
              lambda rng: (rng.standard_normal(SC_N).astype(dtype),),
              lambda x: ((x.astype(f32) * SC_ALPHA).astype(dtype),),  # one product, one rounding: exact
              tolerance=(None,))


# --- transpose_tiled.cu: padded shared-memory tile, uint indices ------------------------

TR_ROWS, TR_COLS = 1000, 777


def transpose_call(kernel):
  return jmf.mosaic_kernel(kernel, spec((TR_COLS, TR_ROWS), f32), grid=(cdiv(TR_COLS, 32), cdiv(TR_ROWS, 32)),
                           block=(32, 8), scalars=(np.uint32(TR_ROWS), np.uint32(TR_COLS)),
                           param_order=("out0", "in0", "scalar0", "scalar1"))


TRANSPOSE = Case("transpose_tiled.cu", "transpose_tiled", transpose_call,
                 lambda rng: (rng.standard_normal((TR_ROWS, TR_COLS)).astype(f32),),
                 lambda x: (x.T,), tolerance=(None,))


# --- histogram_smem.cu: shared atomics, per-block partials summed in JAX -----------------

HI_N, HI_BLOCKS = 1_000_003, 120


def histogram_call(kernel):
  partial = jmf.mosaic_kernel(kernel, spec((HI_BLOCKS, 256), np.uint32), grid=HI_BLOCKS, block=256,
                              scalars=(np.int32(HI_N),))
  return lambda data: partial(data).sum(axis=0, dtype=jnp.uint32)


HISTOGRAM = Case("histogram_smem.cu", "histogram256_partial", histogram_call,
                 lambda rng: ((rng.standard_normal(HI_N) * 40 + 128).clip(0, 255).astype(np.uint8),),
                 lambda data: (np.bincount(data, minlength=256).astype(np.uint32),), tolerance=(None,))


# --- rmsnorm_half2.cu: fp16 through __half2, block reduce (FasterTransformer style) -------

RN_ROWS, RN_HIDDEN, RN_EPS = 64, 4096, np.float32(1e-6)


def rmsnorm_call(kernel):
  return jmf.mosaic_kernel(kernel, spec((RN_ROWS, RN_HIDDEN), f16), grid=RN_ROWS, block=256,
                           scalars=(RN_EPS, np.int32(RN_HIDDEN)),
                           param_order=("out0", "in0", "in1", "scalar0", "scalar1"))


def rmsnorm_reference(x, weight):
  x = f64(x)
  return (x / np.sqrt((x**2).mean(axis=1, keepdims=True) + f64(RN_EPS)) * f64(weight),)


RMSNORM = Case("rmsnorm_half2.cu", "rmsnorm_half2", rmsnorm_call,
               lambda rng: ((rng.standard_normal((RN_ROWS, RN_HIDDEN)) * 2).astype(f16),
                            (1 + 0.1 * rng.standard_normal(RN_HIDDEN)).astype(f16)),
               rmsnorm_reference, tolerance=((2e-3, 1e-3),))  # one fp16 rounding: 2^-11 relative


# --- fp8_quant_per_row.cu: dynamic per-token FP8 (E4M3) quantization ---------------------

FQ_ROWS, FQ_COLS, FP8_MAX = 96, 3000, 448.0


def fp8_call(kernel):
  return jmf.mosaic_kernel(kernel, (spec((FQ_ROWS, FQ_COLS), jnp.float8_e4m3fn), spec((FQ_ROWS,), f32)),
                           grid=FQ_ROWS, block=256, scalars=(np.int32(FQ_COLS),),
                           param_order=("out0", "out1", "in0", "scalar0"))


def fp8_inputs(rng):
  # rows of very different magnitudes, as activations have
  row_scale = np.exp(rng.uniform(np.log(1e-2), np.log(1e2), (FQ_ROWS, 1)))
  return ((rng.standard_normal((FQ_ROWS, FQ_COLS)) * row_scale).astype(bf16),)


def fp8_reference(x):
  x = x.astype(f32)
  # the kernel's float32 steps, in the same order: each is one IEEE rounding
  scale = np.maximum(np.abs(x).max(axis=1) / f32(FP8_MAX), f32(1.0) / f32(FP8_MAX * 512))
  return x, scale  # the quantized values, dequantized, give x back to within E4M3's precision


def fp8_check(inputs, outs):
  q, scale = f64(outs[0]), f64(outs[1])[:, None]
  x = f64(inputs[0])
  # E4M3 keeps 3 mantissa bits: round to nearest is within 2^-4 of each value
  # (relative), or half the subnormal step 2^-9 (in units of the row's scale)
  error = np.abs(q * scale - x)
  bound = (2**-4 + 1e-6) * np.abs(x) + 2**-10 * scale
  assert np.all(error <= bound), f"{np.sum(error > bound)} elements off by more than E4M3 rounding"
  # the largest element of each row lands on the format's maximum
  np.testing.assert_array_equal(np.abs(q).max(axis=1), FP8_MAX)


FP8_QUANT = Case("fp8_quant_per_row.cu", "quantize_fp8_per_row<256>", fp8_call, fp8_inputs, fp8_reference,
                 tolerance=("by check", (1e-6, 0)), check=fp8_check)


CASES = [GELU, LAYERNORM, SOFTMAX, SGEMM, WMMA, ADAMW, ATTENTION, ROW_STATS, scale_case("float", f32, 4),
         scale_case("__nv_bfloat16", bf16, 8), TRANSPOSE, HISTOGRAM, RMSNORM, FP8_QUANT]


def source_of(case: Case) -> str:
  return (CORPUS / case.file).read_text()


def compile_case(case: Case, **kwargs) -> jmf.Kernel:
  return jmf.cuda_kernel(source_of(case), case.name, **kwargs)
