"""Gluon kernels through triton_call, as jax-triton 0.4 runs them (its tests/gluon_test.py: scalars, copies with
constexprs by keyword and by position, a Ref updated in place, descriptors made in the kernel and host descriptors
with a Gluon layout), and what jax-triton lacks: a `num_warps` parameter bound to the option, a GEMM writing its
output through a descriptor, our own errors for a layout that does not fit. Up to the launch, on any machine;
tests/test_gluon_gpu.py runs them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from triton_required import import_triton

triton = import_triton()

from triton.experimental.gluon import language as gl  # noqa: E402

import jax_mosaic_ffi as jmf  # noqa: E402
import jax_mosaic_ffi.jax_triton as jt  # noqa: E402

import benchmarks_package  # noqa: E402
import gluon_sources as gs  # noqa: E402
from hlo_inspect import UNTUNED_OK, lower, only_call  # noqa: E402

pytestmark = UNTUNED_OK

G = benchmarks_package.kernels("gluon_user")
F16 = gl.NVMMASharedLayout.get_default_for


def tile_copy(x, layout, block=None, **kwargs):
  """gluon_test.py's host-descriptor copy (its output through plain stores here): the first block of x."""
  m, n = block or x.shape
  desc = jt.TensorDescriptor.from_array(x, block_shape=[m, n], layout=layout)
  return jt.triton_call(desc, kernel=gs.tile_copy, out_type=jax.ShapeDtypeStruct((m, n), x.dtype), grid=1, M=m, N=n,
                        **kwargs)


def gemm(a, b, how: str = "aliased", block=(128, 128, 64)):
  """05-wgmma's GEMM through triton_call, C written by TMA through a descriptor of an output jax-triton's way: an
  array aliased to the output, or a Ref."""
  bm, bn, bk = block
  da = jt.TensorDescriptor.from_array(a, [bm, bk], layout=F16([bm, bk], gl.float16))
  db = jt.TensorDescriptor.from_array(b, [bk, bn], layout=F16([bk, bn], gl.float16))
  grid = (jmf.cdiv(a.shape[0], bm), jmf.cdiv(b.shape[1], bn))
  shape = (a.shape[0], b.shape[1])
  if how == "aliased":
    dc = jt.TensorDescriptor.from_array(jnp.zeros(shape, a.dtype), [bm, bn], layout=F16([bm, bn], gl.float16))
    return jt.triton_call(da, db, dc, kernel=G.blocked_matmul_pipelined, out_type=jax.ShapeDtypeStruct(shape, a.dtype),
                          grid=grid, input_output_aliases={2: 0}, num_warps=4)
  c = jax.new_ref(jnp.zeros(shape, a.dtype))
  dc = jt.TensorDescriptor.from_array(c, [bm, bn], layout=F16([bm, bn], gl.float16))
  jt.triton_call(da, db, dc, kernel=G.blocked_matmul_pipelined, out_type=(), grid=grid, num_warps=4)
  return c[...]


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32, jnp.float16, jnp.int64, jnp.int8, jnp.uint64])
def test_scalars_copy_in_each_dtype_of_gluon_test(isolated_disk_cache, dtype):
  with jax.enable_x64(True):  # gluon_test.py's module runs with x64 on
    x = jax.ShapeDtypeStruct((), dtype)
    cc = only_call(lambda v: jt.triton_call(v, kernel=gs.copy_scalar, out_type=jax.typeof(v), grid=1), x)
  assert cc["config"]["block"] == [128, 1, 1] and cc["operands"] == 1


def test_copies_bind_as_jax_triton_binds_them(isolated_disk_cache):
  v = jax.ShapeDtypeStruct((500,), jnp.float32)
  # The size by name after the output the call fills, the constexpr as a metaparameter; a tuple of outputs.
  by_name = only_call(lambda a: jt.triton_call(a, xnumel=500, kernel=gs.memcpy, out_type=jax.typeof(a), grid=(8,),
                                              num_warps=1, XBLOCK=64), v)
  as_tuple = only_call(lambda a: jt.triton_call(a, xnumel=500, kernel=gs.memcpy, out_type=(a,), grid=(8,),
                                               num_warps=1, XBLOCK=64)[0], v)
  del by_name["config"]["call_site"], as_tuple["config"]["call_site"]
  assert by_name["config"] == as_tuple["config"] and by_name["config"]["block"] == [32, 1, 1]


def test_a_ref_is_updated_in_place(isolated_disk_cache):
  def copy_into(x, y):
    y_ref = jax.new_ref(y)
    jt.triton_call(x, y_ref, 500, kernel=gs.memcpy, out_type=(), grid=(8,), num_warps=1, XBLOCK=64)
    return y_ref[...]
  cc = only_call(copy_into, jax.ShapeDtypeStruct((500,), jnp.float32), jax.ShapeDtypeStruct((500,), jnp.float32))
  assert "output_operand_aliases" in cc["attributes"]


@pytest.mark.parametrize("shape, swizzle", [((16, 32), 128), ((16, 16), 64), ((16, 8), 32)])
def test_a_host_descriptor_with_a_gluon_layout_lowers_to_a_tensor_map(isolated_disk_cache, shape, swizzle):
  layout = gl.NVMMASharedLayout(swizzle, element_bitwidth=32, rank=2)
  cc = only_call(lambda v: tile_copy(v, layout), jax.ShapeDtypeStruct(shape, jnp.float32))
  maps = cc["config"]["tensor_maps"]
  # One CUtensorMap: float32 (7), the box Triton's metadata gives (cut to the swizzle), swizzle mode log2(bytes/16).
  assert len(maps) == 26 and maps[1] == 7
  assert cc["config"]["smem_bytes"] >= shape[0] * shape[1] * 4


def test_descriptors_made_in_the_kernel_get_global_scratch(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((32, 32), jnp.float32)
  cc = only_call(lambda v: jt.triton_call(v, kernel=gs.tile_copy_device, out_type=jax.typeof(v), grid=1, M=32, N=32),
                x)
  assert cc["results"] == 2  # the output and Triton's global scratch (256 bytes: two descriptors)


@pytest.mark.parametrize("how", ["aliased", "ref"])
def test_a_gemm_writes_its_output_through_a_descriptor(isolated_disk_cache, how):
  a = jax.ShapeDtypeStruct((256, 512), jnp.float16)
  b = jax.ShapeDtypeStruct((512, 384), jnp.float16)
  cc = only_call(lambda x, y: gemm(x, y, how), a, b)
  assert (cc["operands"], cc["results"]) == (3, 1) and "output_operand_aliases" in cc["attributes"]
  assert cc["config"]["grid"] == [2, 3, 1] and cc["config"]["block"] == [128, 1, 1]  # num_warps=4, bound


def test_a_wrong_layout_gets_our_error_naming_the_call(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((16, 32), jnp.float32)
  with pytest.raises(jmf.LaunchError, match=r"triton_call 'tile_copy' at test_gluon_call.py:\d+ .*has "
                                            r"element_bitwidth=16, but the array is float32 \(32-bit elements\)"):
    lower(lambda v: tile_copy(v, gl.NVMMASharedLayout(128, element_bitwidth=16, rank=2)), x)
  with pytest.raises(jmf.LaunchError, match=r"a block row is 8 x float32 = 32 bytes, less than the layout's "
                                            r"swizzle_byte_width=128"):
    lower(lambda v: tile_copy(v, gl.NVMMASharedLayout(128, element_bitwidth=32, rank=2), block=(16, 8)),
          jax.ShapeDtypeStruct((16, 8), jnp.float32))
  with pytest.raises(jmf.LaunchError, match=r"a Gluon kernel's host descriptor needs the block's shared layout: pass "
                                            r"layout=gl.NVMMASharedLayout.get_default_for\(\[16, 32\], gl.float32\)"):
    lower(lambda v: tile_copy(v, None), x)


def test_a_fallback_runs_off_cuda(rng):
  x = rng.standard_normal(500).astype(np.float32)
  out = jax.jit(lambda a: jt.triton_call(a, xnumel=500, kernel=gs.memcpy, out_type=jax.typeof(a), grid=(8,),
                                         num_warps=1, XBLOCK=64, fallback=lambda a, n: a))(x)
  np.testing.assert_array_equal(np.asarray(out), x)
