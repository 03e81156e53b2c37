"""Triton kernels taking host-side tensor descriptors (jmf.TensorDescriptor).

CPU: the signature type is Triton's own, the lowered call carries the kernel's parameters exactly as
Triton's launcher expands them (a TMA descriptor encoded with the fields of Triton's metadata, then the
shape and strides; or the decomposed form for targets without TMA), and mistakes are named. GPU: results
against numpy with outputs poisoned (conftest), after the buffers move, with command buffers on and off.
"""

import os
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from triton_required import import_triton

triton = import_triton()

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.triton import tensor_descriptor

import fresh_process
import triton_descriptor_sources as tds
from hlo_inspect import custom_calls, lower

TMA = jmf.TensorDescriptor
TESTS = os.path.dirname(os.path.abspath(__file__))
MAP = 65536  # param_order code of tensor map 0 (docs/contract.md)


def config(fn, *avals):
  (call,) = custom_calls(lower(fn, *avals))
  return call["config"]


def scalars(cfg):
  """The call's scalars as Python ints (bool, i32, i64 by their sizes)."""
  data, out = cfg.get("scalar_data", b""), []
  for k, size in enumerate(cfg.get("scalar_sizes", [])):
    out.append(int.from_bytes(data[8 * k:8 * k + size], "little", signed=True))
  return out


def maps(cfg):
  flat = cfg["tensor_maps"]
  return [flat[i:i + 26] for i in range(0, len(flat), 26)]


def add_call(block=(64, 64), targets=("sm_90",), padding="zero", **constexprs):
  block_shape = lambda meta: [meta["BM"], meta["BN"]]  # noqa: E731  (from the config, as a pre_hook would)
  kernel = jmf.triton_kernel(tds.add, constexprs={"BM": block[0], "BN": block[1], **constexprs}, targets=targets)
  return jmf.mosaic_kernel(
      kernel, lambda x, y: x,
      grid=lambda meta, x, y: (jmf.cdiv(x.shape[0], meta["BM"]), jmf.cdiv(x.shape[1], meta["BN"])),
      param_order=(TMA.from_tensor("in0", block_shape, padding), TMA.from_tensor("in1", block_shape, padding),
                   TMA.from_tensor("out0", block_shape)))


def matmul_call(configs=None, targets=("sm_90",)):
  return jmf.mosaic_kernel(
      jmf.triton_kernel(tds.matmul, targets=targets),
      lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
      grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], meta["BM"]), jmf.cdiv(b.shape[1], meta["BN"])),
      scalars=lambda meta, a, b: (np.int32(a.shape[0]), np.int32(b.shape[1]), np.int32(a.shape[1])),
      param_order=(TMA.from_tensor("in0", lambda m: [m["BM"], m["BK"]]),
                   TMA.from_tensor("in1", lambda m: [m["BK"], m["BN"]]),
                   TMA.from_tensor("out0", lambda m: [m["BM"], m["BN"]]), "scalar0", "scalar1", "scalar2"),
      configs=configs or [dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=3)])


def persistent_call(programs=132):
  """Triton's persistent TMA matmul: C = A @ B.T, B given (N, K), at most `programs` programs."""
  return jmf.mosaic_kernel(
      jmf.triton_kernel(tds.matmul_persistent, constexprs={"NUM_PROGRAMS": programs}, targets=("sm_90",)),
      lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[0]), a.dtype),
      grid=lambda meta, a, b: min(meta["NUM_PROGRAMS"],
                                  jmf.cdiv(a.shape[0], meta["BM"]) * jmf.cdiv(b.shape[0], meta["BN"])),
      scalars=lambda meta, a, b: (np.int32(a.shape[0]), np.int32(b.shape[0]), np.int32(a.shape[1])),
      param_order=(TMA.from_tensor("in0", lambda m: [m["BM"], m["BK"]]),
                   TMA.from_tensor("in1", lambda m: [m["BN"], m["BK"]]),
                   TMA.from_tensor("out0", lambda m: [m["BM"], m["BN"]]), "scalar0", "scalar1", "scalar2"),
      configs=[dict(BM=128, BN=256, BK=64, num_warps=8, num_stages=3)])


def scale_rows_call(descriptor, targets=("sm_90",)):
  kernel = jmf.triton_kernel(tds.scale_rows, constexprs={"BM": 32, "BN": 64}, targets=targets)
  return jmf.mosaic_kernel(
      kernel, lambda x: jax.ShapeDtypeStruct((x.size // x.shape[-1], x.shape[-1]), x.dtype),
      grid=lambda meta, x: (jmf.cdiv(x.size // x.shape[-1], meta["BM"]), jmf.cdiv(x.shape[-1], meta["BN"])),
      scalars=lambda meta, x: (np.int32(x.size // x.shape[-1]), np.int32(x.shape[-1])),
      param_order=(descriptor, "out0", "scalar0", "scalar1"))


def f16(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.float16)


# ---------------------------------------------------------------- any machine

@pytest.mark.parametrize("dtype, block", [(np.float16, [64, 64]), (ml_dtypes.bfloat16, [128]),
                                          (np.float32, [2, 8, 16]), (np.int8, [32, 128])])
def test_the_signature_type_is_tritons_own(dtype, block):
  from triton._C.libtriton import native_specialize_impl
  from triton.backends.compiler import BaseBackend
  from triton.tools.tensor_descriptor import TensorDescriptor

  class Base:  # what Triton's specialization reads of a tensor: its dtype (and an aligned address)
    def __init__(self):
      self.dtype = np.dtype(dtype)

    def data_ptr(self):
      return 256

  shape = [256] * len(block)
  tritons = TensorDescriptor(Base(), shape, [256 ** (len(block) - 1 - k) for k in range(len(block))], block)
  expected = native_specialize_impl(BaseBackend, tritons, False, True, True)[0]
  bound = tensor_descriptor.bind(TMA.from_tensor("in0", block), lambda v, what: v,
                                 (jax.core.ShapedArray(shape, dtype),), (), "here")
  assert bound.signature_type == expected


def test_a_tma_kernel_gets_tritons_descriptor_then_shape_and_strides(isolated_disk_cache):
  x = f16(200, 136)
  cfg = config(add_call(), x, x)
  # Each descriptor: the CUtensorMap, then the shape (i32) and strides (i64) of the array, as Triton's launcher.
  assert cfg["param_order"] == [MAP, -1, -2, -3, -4, MAP + 1, -5, -6, -7, -8, MAP + 2, -9, -10, -11, -12,
                                -13, -14]
  assert cfg["scalar_sizes"] == [4, 4, 8, 8] * 3 + [8, 8]  # then Triton's two (null) scratch pointers
  assert scalars(cfg) == [200, 136, 136, 1] * 3 + [0, 0]
  for buffer, record in enumerate(maps(cfg)):
    # buffer, FLOAT16, rank 2, no interleave, swizzle 128B (Triton's metadata), L2 promotion 128B, OOB zeros;
    # dims and strides innermost first, box = Triton's block_size, unit element strides.
    assert record == [buffer, 6, 2, 0, 3, 2, 0, 136, 200, 1, 1, 1, 272, 0, 0, 0, 64, 64, 1, 1, 1,
                      1, 1, 1, 1, 1]
  assert cfg["grid"] == [4, 3, 1] and cfg["block"] == [128, 1, 1]


def test_vmap_is_one_call_whose_elements_get_descriptors_of_their_own(isolated_disk_cache):
  a, b = f16(4, 256, 64), f16(64, 128)
  cfg = config(jax.vmap(matmul_call(), in_axes=(0, None)), a, b)
  # Four launches: A's and C's descriptors move on by an element each time, B's is shared (stride 0).
  assert cfg["batch_size"] == 4 and cfg["batch_strides"] == [256 * 64 * 2, 0, 256 * 128 * 2]
  assert [record[7:9] for record in maps(cfg)] == [[64, 256], [128, 64], [128, 256]]  # an element's shapes


def test_the_box_is_tritons_block_size_not_the_block_shape(isolated_disk_cache):
  # B's block is 64 x 128 fp16, but a 128-byte swizzle spans 64 of them: Triton loads it as two 64 x 64 boxes.
  cfg = config(matmul_call(), f16(256, 512), f16(512, 384))
  a, b, c = maps(cfg)
  assert (a[16:18], b[16:18], c[16:18]) == ([64, 128], [64, 64], [64, 128])  # innermost first
  assert (a[7:9], b[7:9], c[7:9]) == ([512, 256], [384, 512], [384, 256])
  assert cfg["param_order"][:15] == [MAP, -4, -5, -6, -7, MAP + 1, -8, -9, -10, -11, MAP + 2, -12, -13, -14, -15]
  assert cfg["param_order"][15:18] == [-1, -2, -3]  # M, N, K
  assert scalars(cfg)[:3] == [256, 384, 512]
  assert cfg["block"] == [256, 1, 1] and cfg["grid"] == [2, 3, 1]


def test_the_persistent_matmul_lowers(isolated_disk_cache):
  cfg = config(persistent_call(), f16(1024, 512), f16(768, 512))
  assert cfg["grid"] == [24, 1, 1] and cfg["block"] == [256, 1, 1]
  assert [m[16:18] for m in maps(cfg)] == [[64, 128], [64, 256], [64, 128]]  # B's box: 256 rows of 64 (K)


def decorated_matmul_call():
  """The @triton.autotune'd descriptor matmul: each config's block shapes reach the descriptors."""
  return jmf.mosaic_kernel(
      jmf.triton_kernel(tds.matmul_autotuned, targets=("sm_90",)),
      lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
      grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], meta["BM"]), jmf.cdiv(b.shape[1], meta["BN"])),
      scalars=lambda meta, a, b: (np.int32(a.shape[0]), np.int32(b.shape[1]), np.int32(a.shape[1])),
      param_order=(TMA.from_tensor("in0", lambda m: [m["BM"], m["BK"]]),
                   TMA.from_tensor("in1", lambda m: [m["BK"], m["BN"]]),
                   TMA.from_tensor("out0", lambda m: [m["BM"], m["BN"]]), "scalar0", "scalar1", "scalar2"))


def test_a_decorated_descriptor_kernel_lowers_with_its_configs_block_shapes(isolated_disk_cache):
  cfg = config(decorated_matmul_call(), f16(256, 512), f16(512, 384))  # no GPU: the first config, untimed
  assert [m[16:18] for m in maps(cfg)] == [[64, 128], [64, 64], [64, 128]]
  assert cfg["block"] == [256, 1, 1] and cfg["grid"] == [2, 3, 1]


def test_nan_padding_and_the_autotuned_block_shape(isolated_disk_cache):
  x = f16(64, 256)
  cfg = config(add_call(padding="nan"), x, x)
  assert [m[6] for m in maps(cfg)] == [1, 1, 0]  # NaN fill for the inputs, zeros for the output
  tuned = matmul_call(configs=[dict(BM=64, BN=64, BK=32, num_warps=4, num_stages=2)])
  a, b, c = maps(config(tuned, f16(128, 64), f16(64, 128)))
  assert (a[16:18], b[16:18], c[16:18]) == ([32, 64], [64, 32], [64, 64])
  assert a[4] == 2  # 32 fp16 = 64 bytes: Triton's metadata asks for the 64-byte swizzle


def test_a_view_describes_part_of_the_buffer(isolated_disk_cache):
  x = f16(4, 64, 128)
  view = TMA("in0", (256, 128), (128, 1), (32, 64))  # the (4, 64, 128) array as 256 rows
  cfg = config(scale_rows_call(view), x)
  (record,) = maps(cfg)
  assert record[:9] == [0, 6, 2, 0, 3, 2, 0, 128, 256] and record[12] == 256 and record[16:18] == [64, 32]
  assert scalars(cfg)[:6] == [256, 128] + [256, 128, 128, 1]  # M, N, then the view's shape and strides


def test_metadata_we_cannot_encode_is_refused_by_name():
  # Entries as Triton's compile writes them, with what later releases or other lowerings may put there.
  from jax_mosaic_ffi.triton.compiler import tensordesc_abi
  entry = {"swizzle": 3, "elem_size": 2, "elem_type": 6, "block_size": [64, 64], "fp4_padded": False}
  assert tensordesc_abi.DescriptorMeta.from_triton(entry, 0).block_size == (64, 64)
  for change, message in [({"fp4_padded": True}, "descriptor 1: Triton lowered it as padded fp4"),
                          ({"is_im2col": True}, "descriptor 1: Triton lowered it as an im2col descriptor"),
                          ({"swizzle": 4}, "descriptor 1: Triton asks for swizzle mode 4; jax_mosaic_ffi encodes "
                                           "modes [0, 1, 2, 3]"),
                          ({"elem_type": 99}, "descriptor 1: Triton's element type 99 has no host TMA type")]:
    with pytest.raises(ValueError, match=re.escape(message)):
      tensordesc_abi.DescriptorMeta.from_triton({**entry, **change}, 1)
  with pytest.raises(ValueError, match="Triton's metadata describes 1 tensor descriptors, the signature has 3"):
    tensordesc_abi.metas([entry], ["tensordesc<fp16[64, 64]>"] * 3, "add")
  # Triton's element type must be the operand's: bf16 bits read as fp16 would be wrong numbers.
  bound = tensor_descriptor.bind(TMA.from_tensor("in0", [64, 64]), lambda v, what: v,
                                 (jax.core.ShapedArray((64, 64), jnp.float16),), (), "here")
  from jax_mosaic_ffi.triton.compiler.compile import TritonInfo
  bf16 = tensordesc_abi.DescriptorMeta(3, 2, 9, (64, 64))
  meta = TritonInfo(num_warps=4, num_ctas=1, shared=0, scratch=(), signature=("tensordesc<fp16[64, 64]>",),
                    dropped=(), aligned=(), meta=(), triton_version="3.6.0", tensordesc_meta=(bf16,))
  with pytest.raises(jmf.LaunchError, match=re.escape(
      "here: param_order entry TensorDescriptor('in0'): Triton encodes it as TMA element type 9 of 2 bytes, but "
      "in0 is float16 (type 6, 2 bytes)")):
    tensor_descriptor.expand([TMA.from_tensor("in0", [64, 64])], [], [bound], meta, "here")


def test_targets_without_tma_get_the_decomposed_form(isolated_disk_cache):
  from jax_mosaic_ffi.triton.compiler import tensordesc_abi
  x = f16(200, 136)
  cfg = config(add_call(targets=("sm_80",), padding="nan"), x, x)
  assert "tensor_maps" not in cfg
  flags = tensordesc_abi.decomposed_flags()
  per = [8] * 4 + [1] * flags + [4, 4, 8, 8]  # base pointer, then shape, strides (i64), flags, shape (i32), strides
  assert cfg["scalar_sizes"][:len(per)] == per
  assert scalars(cfg)[:len(per)] == [200, 136, 136, 1, 1] + [0] * (flags - 1) + [200, 136, 136, 1]
  n = 1 + len(per)
  assert [cfg["param_order"][k * n] for k in range(3)] == [0, 1, 2]  # each descriptor starts with its pointer


def test_targets_that_lower_descriptors_differently_are_refused(isolated_disk_cache):
  x = f16(64, 64)
  with pytest.raises(jmf.CompileError, match=r"lowers its tensor descriptors differently for sm_90 than for "
                                             r"sm_80 .*compile it for targets of one family"):
    lower(add_call(targets=("sm_80", "sm_90")), x, x)


def test_a_compiled_signature_with_descriptors_and_a_refused_form(isolated_disk_cache):
  sig = ["tensordesc<fp16[64, 64]>"] * 3
  kernel = jmf.triton_kernel(tds.add, signature=sig, constexprs={"BM": 64, "BN": 64}, targets=("sm_90",))
  assert kernel.info.signature == tuple(sig) and len(kernel.info.tensordesc_meta) == 3
  assert kernel.param_sizes == (128, 4, 4, 8, 8) * 3 + (8, 8)
  call = jmf.mosaic_kernel(kernel, lambda x, y: x, grid=(1, 1),
                           param_order=(TMA.from_tensor("in0", [64, 64]), TMA.from_tensor("in1", [64, 64]),
                                        TMA.from_tensor("out0", [64, 64])))
  lower(call, f16(64, 64), f16(64, 64))
  bf16 = jax.ShapeDtypeStruct((64, 64), jnp.bfloat16)
  with pytest.raises(jmf.LaunchError, match=r"passes parameters of Triton types \['tensordesc<bf16\[64, 64\]>'"):
    lower(call, bf16, bf16)
  # im2col descriptors are refused; a Gluon kernel's layout is taken only as a call of one name with literals
  # (Triton evaluates it): never an expression that reaches further.
  for refused in ("tensordesc_im2col<fp16[64, 64]>", "tensordesc<fp16[64, 64],NVMMASharedLayout(__import__('os'))>",
                  "tensordesc<fp16[64, 64],gl.NVMMASharedLayout()>"):
    with pytest.raises(ValueError, match=r"parameter type .* is not supported.*no im2col"):
      jmf.triton_kernel(tds.add, signature=[refused] * 3, constexprs={"BM": 64, "BN": 64})


def test_a_warm_disk_cache_keeps_tritons_descriptor_metadata(isolated_disk_cache):
  x = f16(200, 136)
  first = config(add_call(), x, x)
  jmf.clear_kernel_cache()  # memory only: the next trace reads the module and its metadata from disk
  before = jmf.kernel_cache_stats().compiles["triton"]
  assert config(add_call(), x, x) == first
  assert jmf.kernel_cache_stats().compiles["triton"] == before


def _raises(call, avals, message):
  with pytest.raises(jmf.LaunchError) as info:
    lower(call, *avals)
  assert message in str(info.value), str(info.value)
  assert "mosaic_kernel 'add'" in str(info.value) or "mosaic_kernel 'scale_rows'" in str(info.value)
  assert "test_triton_descriptors.py" in str(info.value)  # the call site


def _add(order, block=(64, 64)):
  kernel = jmf.triton_kernel(tds.add, constexprs={"BM": block[0], "BN": block[1]}, targets=("sm_90",))
  return jmf.mosaic_kernel(kernel, lambda x, y: x, grid=(1, 1), param_order=order)


def test_mistakes_are_named(isolated_disk_cache):
  x = f16(64, 64)
  d = TMA.from_tensor
  _raises(_add((d("in0", [48, 64]), d("in1", [48, 64]), d("out0", [48, 64])), (48, 64)), (x, x),
          "param_order entry TensorDescriptor('in0'): block_shape [48, 64]: Shape element 0 must be a power of 2")
  _raises(_add((d("in0", [2048, 1024]), d("in1", [64, 64]), d("out0", [64, 64]))), (x, x),
          "block_shape [2048, 1024]: numel (2097152) exceeds triton maximum tensor numel (1048576)")
  _raises(_add((d("in0", [64]), d("in1", [64, 64]), d("out0", [64, 64]))), (x, x),
          "param_order entry TensorDescriptor('in0'): block_shape [64] has rank 1, the in0 (float16[64, 64]) "
          "rank 2; give one size per axis (rank 1 to 5)")
  _raises(_add((d("in0", [64, 64]), d("in2", [64, 64]), d("out0", [64, 64]))), (x, x),
          "param_order entry TensorDescriptor('in2') describes 'in2', but the call has 2 input(s) and 1 output(s); "
          "name one of in0.., out0..")
  boolean = jax.ShapeDtypeStruct((64, 64), jnp.bool_)
  _raises(_add((d("in0", [64, 64]), d("in1", [64, 64]), d("out0", [64, 64]))), (boolean, boolean),
          "param_order entry TensorDescriptor('in0'): Triton has no tensor descriptor of bool; describe an array "
          "of another dtype")
  ints = jax.ShapeDtypeStruct((64, 64), jnp.int32)
  _raises(_add((d("in0", [64, 64], "nan"), d("in1", [64, 64]), d("out0", [64, 64]))), (ints, ints),
          "padding='nan' needs a floating-point array, not int32")
  _raises(_add((d("in0", [64, 4]), d("in1", [64, 4]), d("out0", [64, 4])), (64, 4)), (x, x),
          "param_order entry TensorDescriptor('in0'): TMA moves rows of a multiple of 16 bytes, but a row of the "
          "block is 4 x float16 = 8 bytes; make block_shape[-1] a multiple of 8")
  odd = f16(64, 100)
  _raises(_add((d("in0", [64, 64]), d("in1", [64, 64]), d("out0", [64, 64]))), (odd, odd),
          "param_order entry TensorDescriptor('in0'): in0 (float16[64, 100]) has strides [100, 1] elements; Triton's "
          "descriptors need every stride but the last to be a multiple of 16 bytes: pad the trailing axes")
  y = f16(4, 64, 100)
  _raises(scale_rows_call(TMA("in0", (256, 100), (100, 1), (32, 64))), (y,),
          "strides [100, 1] must end in 1 (contiguous rows), the others at least 1 and multiples of 16 bytes")
  for targets in (("sm_90",), ("sm_80",)):  # the pointer form has no tensor map whose bounds the runtime checks
    _raises(scale_rows_call(TMA("in0", (300, 96), (96, 1), (32, 64)), targets), (y,),
            "the view shape=[300, 96] strides=[96, 1] reaches 28800 elements, but in0 (float16[4, 64, 100]) holds "
            "25600")
  cuda = jmf.cuda_kernel('extern "C" __global__ void k(const float* x) {}', "k")
  with pytest.raises(jmf.LaunchError, match=r"mosaic_kernel 'k' at .*jmf.TensorDescriptor is a Triton kernel's "
                                            r"parameter; a CUDA kernel takes a TMA descriptor as jmf.TensorMap"):
    jmf.mosaic_kernel(cuda, x, grid=1, block=32, param_order=(d("in0", [64, 64]),))
  with pytest.raises(ValueError, match="give shape and strides together"):
    TMA("in0", (64, 64), None, (64, 64))
  with pytest.raises(ValueError, match="padding = 'inf'; use 'zero' or 'nan'"):
    TMA.from_tensor("in0", [64, 64], "inf")
  with pytest.raises(ValueError, match="operand must name an input or output"):
    TMA.from_tensor("x", [64, 64])


# ---------------------------------------------------------------- GPU

gpu = pytest.mark.gpu


def _rand(rng, shape, dtype):
  return rng.standard_normal(shape).astype(dtype)


@gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16])
def test_add_through_descriptors_matches_numpy(rng, isolated_disk_cache, dtype):
  call = jax.jit(add_call(block=(32, 64)))
  for shape in [(200, 136), (64, 64), (33, 40)]:  # edges: TMA zero-fills the loads and clips the stores
    x, y = _rand(rng, shape, dtype), _rand(rng, shape, dtype)
    expected = (x.astype(np.float32) + y.astype(np.float32)).astype(dtype).astype(np.float32)
    np.testing.assert_allclose(np.asarray(call(x, y)).astype(np.float32), expected, rtol=1e-2, atol=1e-2)


@gpu
def test_vmap_of_descriptor_kernels_matches_numpy(rng, isolated_disk_cache):
  add = jax.jit(jax.vmap(add_call(block=(32, 64))))
  x, y = _rand(rng, (3, 200, 136), np.float16), _rand(rng, (3, 200, 136), np.float16)
  expected = (x.astype(np.float32) + y.astype(np.float32)).astype(np.float16).astype(np.float32)
  np.testing.assert_allclose(np.asarray(add(x, y)).astype(np.float32), expected, rtol=1e-2, atol=1e-2)
  # A batched GEMM: every element's A and C, one B for all.
  matmul = jax.jit(jax.vmap(matmul_call(), in_axes=(0, None)))
  a, b = _rand(rng, (4, 256, 192), np.float16), _rand(rng, (192, 384), np.float16)
  expected = np.einsum("bmk,kn->bmn", a.astype(np.float32), b.astype(np.float32))
  np.testing.assert_allclose(np.asarray(matmul(a, b)).astype(np.float32), expected, rtol=2e-2, atol=0.25)


@gpu
def test_matmul_through_descriptors_matches_numpy(rng, isolated_disk_cache):
  call = jax.jit(matmul_call(configs=[dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=3),
                                      dict(BM=64, BN=64, BK=32, num_warps=4, num_stages=2)]))
  for m, n, k in [(256, 384, 512), (200, 136, 72)]:
    a, b = _rand(rng, (m, k), np.float16), _rand(rng, (k, n), np.float16)
    expected = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(np.asarray(call(a, b)).astype(np.float32), expected, rtol=2e-2, atol=0.25)


@gpu
def test_the_persistent_matmul_matches_numpy(rng, isolated_disk_cache):
  for programs in (132, 7):  # one tile a program, and several
    call = jax.jit(persistent_call(programs))
    for m, n, k in [(1024, 768, 512), (300, 520, 200)]:
      a, b = _rand(rng, (m, k), np.float16), _rand(rng, (n, k), np.float16)
      expected = a.astype(np.float32) @ b.astype(np.float32).T
      np.testing.assert_allclose(np.asarray(call(a, b)).astype(np.float32), expected, rtol=2e-2, atol=0.25)


@gpu
def test_a_decorated_descriptor_matmul_matches_numpy(rng, isolated_disk_cache):
  call = jax.jit(decorated_matmul_call())  # both configs timed, the winner runs
  for m, n, k in [(256, 384, 512), (200, 136, 72)]:
    a, b = _rand(rng, (m, k), np.float16), _rand(rng, (k, n), np.float16)
    expected = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(np.asarray(call(a, b)).astype(np.float32), expected, rtol=2e-2, atol=0.25)


@gpu
def test_the_decomposed_form_runs(rng, isolated_disk_cache):
  # Compiled for sm_80 (no TMA), the kernel takes pointer, shape, strides and flags; the H200 runs its PTX.
  call = jax.jit(add_call(block=(32, 64), targets=("sm_80",)))
  for shape in [(200, 136), (33, 40)]:
    x, y = _rand(rng, shape, np.float32), _rand(rng, shape, np.float32)
    np.testing.assert_allclose(np.asarray(call(x, y)), x + y, rtol=1e-6)


@gpu
def test_a_view_and_nan_padding_run(rng, isolated_disk_cache):
  x = _rand(rng, (4, 64, 128), np.float32)
  out = jax.jit(scale_rows_call(TMA("in0", (256, 128), (128, 1), (32, 64), "nan")))(x)
  rows = x.reshape(256, 128)
  np.testing.assert_allclose(np.asarray(out), rows * np.arange(1, 257, dtype=np.float32)[:, None], rtol=1e-6)


@gpu
def test_descriptors_follow_new_arrays(rng, isolated_disk_cache):
  call = jax.jit(add_call())
  xs = [jax.device_put(_rand(rng, (128, 192), np.float16)) for _ in range(3)]
  np.testing.assert_array_equal(np.asarray(call(xs[0], xs[1])), np.asarray(xs[0]) + np.asarray(xs[1]))
  before = jmf.kernel_cache_stats().tensor_map_encodes
  out = call(xs[0], xs[1])  # the same inputs; the output may land elsewhere
  np.testing.assert_array_equal(np.asarray(out), np.asarray(xs[0]) + np.asarray(xs[1]))
  for a, b in [(xs[1], xs[2]), (xs[2], xs[0])]:  # new arrays: the runtime encodes their descriptors anew
    np.testing.assert_array_equal(np.asarray(call(a, b)), np.asarray(a) + np.asarray(b))
  assert jmf.kernel_cache_stats().tensor_map_encodes >= before + 4


LOOP = '''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    sys.path.insert(0, sys.argv[3])
    import test_triton_descriptors as t
    add = t.add_call(block=(32, 64))
    # The add's tiles take a little dynamic shared memory (captured inside command buffers); the matmul's
    # three stages of 128 x 64 and 64 x 128 fp16 tiles take more than 48 KiB (recorded as kernel nodes).
    mm = t.matmul_call(configs=[dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=3)])
    def loop(x, w):
      for _ in range(6):
        x = add(x, x) * jnp.float16(0.25)
        x = mm(x, w)
      return x
    data = np.load(sys.argv[1])
    w = jnp.asarray(np.load(sys.argv[1] + ".w.npy"))
    f = jax.jit(loop)
    # Inputs alive at once sit at different addresses, and results kept alive move the outputs: the
    # recorded launches and their descriptors must follow.
    kept = [f(jax.device_put(data * np.float16(k)), w) for k in (1, 2, 3, 1)]
    np.save(sys.argv[2], np.stack([np.asarray(o) for o in kept]))
    stats = jmf.kernel_cache_stats()
    print(json.dumps({"records": stats.records_created, "encodes": stats.tensor_map_encodes,
                      "registration": jmf.registration.status()}))
'''


@gpu
@pytest.mark.parametrize("command_buffers", [True, False], ids=["cb_on", "cb_off"])
def test_descriptors_follow_moving_buffers_in_and_out_of_command_buffers(rng, tmp_path, command_buffers):
  data = _rand(rng, (128, 128), np.float16)
  w = (np.eye(128) + 0.01 * rng.standard_normal((128, 128))).astype(np.float16)
  paths = [tmp_path / "x.npy", tmp_path / "out.npy"]
  np.save(paths[0], data)
  np.save(str(paths[0]) + ".w.npy", w)
  result = fresh_process.run(LOOP, *paths, TESTS, cwd=tmp_path, env={
      "XLA_FLAGS": "" if command_buffers else "--xla_gpu_enable_command_buffer=",
      "JAX_MOSAIC_FFI_POISON_OUTPUTS": "1",
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  print(result)
  outs = np.load(paths[1]).astype(np.float32)
  for i, k in enumerate((1, 2, 3, 1)):
    x = data.astype(np.float32) * k
    for _ in range(6):
      x = (x + x).astype(np.float16).astype(np.float32) * 0.25
      x = (x.astype(np.float16).astype(np.float32) @ w.astype(np.float32)).astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(outs[i], x, rtol=3e-2, atol=3e-2)
  if command_buffers:
    assert result["registration"]["record"], result["registration"]
    assert result["records"] >= 6  # the matmuls are kernel nodes of the graph (the adds are captured)
  else:
    assert result["records"] == 0
  assert result["encodes"] >= 36  # each of the twelve calls' three maps at least once


def _docs_example(tmp_path, a, b, run: bool):
  """The descriptor example of docs/guides/triton_kernels.md (its block that defines matmul_call; the block before
  it makes the docs' own a and b), written to a file (Triton reads a kernel's source from its file)."""
  import re
  import runpy
  text = open(os.path.join(os.path.dirname(TESTS), "docs", "guides", "triton_kernels.md")).read()
  section = text.split("\n## Tensor descriptors\n")[1].split("\n## ")[0]
  (block,) = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "matmul_call = " in b]
  if not run:
    block = block.replace("c = jax.jit(matmul_call)(a, b)", "")
  path = tmp_path / "docs_descriptors.py"
  path.write_text("import jax, jax.numpy as jnp, numpy as np, triton, triton.language as tl\n"
                  "import jax_mosaic_ffi as jmf\n" + block)
  return runpy.run_path(str(path), init_globals={"a": a, "b": b})


def test_the_docs_example_lowers(isolated_disk_cache, tmp_path):
  namespace = _docs_example(tmp_path, None, None, run=False)
  cfg = config(namespace["matmul_call"], f16(256, 512), f16(512, 384))
  winner = jmf.autotune_report()[-1]["config"]  # the first config without a GPU; the faster one with
  assert len(maps(cfg)) == 3 and cfg["block"] == [32 * winner["num_warps"], 1, 1]


@gpu
def test_the_docs_example_runs(isolated_disk_cache, tmp_path, rng):
  a, b = _rand(rng, (300, 256), np.float16), _rand(rng, (256, 200), np.float16)
  c = _docs_example(tmp_path, a, b, run=True)["c"]
  np.testing.assert_allclose(np.asarray(c).astype(np.float32), a.astype(np.float32) @ b.astype(np.float32),
                             rtol=2e-2, atol=0.25)
