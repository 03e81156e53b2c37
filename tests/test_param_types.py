"""Typed parameters: each kernel parameter's declared C++ type against the call's arrays and scalars, at
trace time (no GPU needed), with the exact message a user sees; and the honest messages of issue 26
(a misspelt kernel name, a second derivative, where the autotune warning points)."""

import sys
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.store import compile_cache
from jax_mosaic_ffi.toolchain import param_types
from jax_mosaic_ffi.cuda.nvrtc import program
from jax_mosaic_ffi.transforms import autotune as autotuning

import kernel_sources

AXPY = r'''
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
'''

# Every rule of call/param_types.py in one kernel: bf16, raw 16-bit, bytes, any, a vector type.
TYPED = r'''
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
extern "C" __global__ void typed(const __nv_bfloat16* __restrict__ b, const uint16_t* raw, const void* any,
                                 const char* bytes, float4* vec, double d, long long n) {}
'''

N = 64


def arrays(*dtypes):
  return [jax.ShapeDtypeStruct((N,), d) for d in dtypes]


def trace(kernel, inputs, out, scalars):
  call = jmf.mosaic_kernel(kernel, out, grid=1, block=N, scalars=scalars)
  return jax.jit(call).trace(*inputs)


def refused(kernel, inputs, out, scalars) -> str:
  with pytest.raises(jmf.LaunchError) as info:
    trace(kernel, inputs, out, scalars)
  return str(info.value)


# The call site the messages name: the line of `trace` that traces the call.
SITE = f"test_param_types.py:{trace.__code__.co_firstlineno + 2} (trace)"


@pytest.fixture
def axpy(isolated_disk_cache):
  return jmf.cuda_kernel(AXPY, "axpy")


def test_bf16_into_a_float_pointer(axpy):
  (x,), y = arrays(jnp.bfloat16), arrays(jnp.float32)[0]
  assert refused(axpy, [x], y, (np.float32(2), np.int32(N))) == (
      f"mosaic_kernel 'axpy' at {SITE}: the kernel's parameter 0 is 'const float*', but the call passes "
      "in0, a bfloat16[64] array; pass float32 data (x.astype(jnp.float32)), or declare the parameter "
      "'const __nv_bfloat16*' (or 'const void*' for any dtype)")


def test_int32_into_a_float_pointer_and_an_int32_output(axpy):
  (x,), (y,) = arrays(jnp.int32), arrays(jnp.float32)
  assert refused(axpy, [x], y, (np.float32(2), np.int32(N))) == (
      f"mosaic_kernel 'axpy' at {SITE}: the kernel's parameter 0 is 'const float*', but the call passes "
      "in0, an int32[64] array; pass float32 data (x.astype(jnp.float32)), or declare the parameter "
      "'const int*' (or 'const void*' for any dtype)")
  assert refused(axpy, [y], x, (np.float32(2), np.int32(N))) == (
      f"mosaic_kernel 'axpy' at {SITE}: the kernel's parameter 1 is 'float*', but the call passes "
      "out0, an int32[64] array; pass float32 data (set out0's dtype in out_shape), or declare the parameter "
      "'int*' (or 'void*' for any dtype)")


def test_int_and_float_scalars_of_one_width_swapped(axpy):
  (x,) = arrays(jnp.float32)
  assert refused(axpy, [x], x, (np.int32(N), np.float32(2))) == (
      f"mosaic_kernel 'axpy' at {SITE}: the kernel's parameter 2 is 'float', but the call passes "
      "scalars[0], an int32 value; pass np.float32(...) as scalars[0], or declare the parameter 'int'")


def test_a_correctly_typed_call_traces_and_signedness_does_not_matter(axpy):
  (x,) = arrays(jnp.float32)
  trace(axpy, [x], x, (np.float32(2), np.int32(N)))
  trace(axpy, [x], x, (np.float32(2), np.uint32(N)))


@pytest.fixture
def typed(isolated_disk_cache):
  return jmf.cuda_kernel(TYPED, "typed")


def typed_inputs(b=jnp.bfloat16, raw=jnp.float16, any_=jnp.int8, bytes_=jnp.float64):
  return arrays(b, raw, any_, bytes_)


def test_the_declared_types_are_the_compilers(typed):
  assert [t.text for t in typed.param_types] == [
      "const __nv_bfloat16*", "const unsigned short*", "const void*", "const char*", "float4*", "double",
      "long long"]


def test_bf16_pointers_uint16_void_and_char_pointers_and_vector_types(typed):
  scalars = (np.float64(1), np.int64(N))
  (vec,) = arrays(jnp.float32)
  trace(typed, typed_inputs(), vec, scalars)
  trace(typed, typed_inputs(raw=jnp.bfloat16, any_=jnp.float32, bytes_=jnp.bool_), vec, scalars)
  trace(typed, typed_inputs(raw=jnp.uint16), vec, scalars)
  assert refused(typed, typed_inputs(b=jnp.float16), vec, scalars) == (
      f"mosaic_kernel 'typed' at {SITE}: the kernel's parameter 0 is 'const __nv_bfloat16*', but the "
      "call passes in0, a float16[64] array; pass bfloat16 data (x.astype(jnp.bfloat16)), or declare the "
      "parameter 'const __half*' (or 'const void*' for any dtype)")
  assert refused(typed, typed_inputs(raw=jnp.float32), vec, scalars) == (
      f"mosaic_kernel 'typed' at {SITE}: the kernel's parameter 1 is 'const unsigned short*', but the "
      "call passes in1, a float32[64] array; pass 16-bit integer, float16 or bfloat16 data "
      "(x.astype(jnp.uint16)), or declare the parameter 'const float*' (or 'const void*' for any dtype)")
  (half,) = arrays(jnp.float16)
  assert refused(typed, typed_inputs(), half, scalars) == (
      f"mosaic_kernel 'typed' at {SITE}: the kernel's parameter 4 is 'float4*', but the call passes "
      "out0, a float16[64] array; pass float32 data (set out0's dtype in out_shape), or declare the "
      "parameter '__half*' (or 'void*' for any dtype)")
  assert refused(typed, typed_inputs(), vec, (np.int64(1), np.int64(N))) == (
      f"mosaic_kernel 'typed' at {SITE}: the kernel's parameter 5 is 'double', but the call passes "
      "scalars[0], an int64 value; pass np.float64(...) as scalars[0], or declare the parameter 'int64_t'")


def test_templates_are_typed_after_substitution(isolated_disk_cache):
  source = kernel_sources.AXPB
  as_float = jmf.cuda_kernel(source, "ops::axpb<float>")
  as_bf16 = jmf.cuda_kernel(source, "ops::axpb<__nv_bfloat16>")
  assert [t.text for t in as_bf16.param_types] == ["const __nv_bfloat16*", "__nv_bfloat16*", "long long"]
  x = arrays(jnp.bfloat16)
  trace(as_bf16, x, x[0], (np.int64(N),))
  assert refused(as_float, x, x[0], (np.int64(N),)) == (
      f"mosaic_kernel 'ops::axpb<float>' at {SITE}: the kernel's parameter 0 is 'const float*', but "
      "the call passes in0, a bfloat16[64] array; pass float32 data (x.astype(jnp.float32)), or declare the "
      "parameter 'const __nv_bfloat16*' (or 'const void*' for any dtype)")


def test_the_scratch_buffer_is_bytes_for_any_pointer(isolated_disk_cache):
  source = 'extern "C" __global__ void count(const float* x, float* y, unsigned int* counters, int n) {}'
  kernel = jmf.cuda_kernel(source, "count")
  (x,) = arrays(jnp.float32)
  call = jmf.mosaic_kernel(kernel, x, grid=1, block=N, scalars=(np.int32(N),), scratch_bytes=8, zero_scratch=True)
  jax.jit(call).trace(x)
  wrong = jmf.mosaic_kernel(kernel, x, grid=1, block=N, scalars=(np.int32(N),), scratch_bytes=8,
                            param_order=("in0", "out0", "scalar0", "scratch"))
  with pytest.raises(jmf.LaunchError, match=r"parameter 2 is 'unsigned int\*', but the call passes scalars\[0\]"):
    jax.jit(wrong).trace(x)


def test_the_types_live_in_the_cache_entry_and_nothing_is_compiled_twice(isolated_disk_cache):
  before = compile_cache.stats().compiles.get("nvrtc", 0)
  first = jmf.cuda_kernel(AXPY, "axpy", targets=("sm_90", "sm_100"))
  assert compile_cache.stats().compiles.get("nvrtc", 0) == before + 2  # one NVRTC call per target, probe included
  jmf.clear_kernel_cache()  # memory only: the next one is read from disk
  again = jmf.cuda_kernel(AXPY, "axpy", targets=("sm_90", "sm_100"))
  assert compile_cache.stats().compiles.get("nvrtc", 0) == before + 2
  assert again.compiled.param_types == first.compiled.param_types == ("float const*", "float*", "float", "int")


@pytest.mark.parametrize("types", [["int"] * 3, [1, 2, 3, 4], ["x" * 513] * 4, "int"])
def test_a_cache_entry_with_bad_types_is_refused(axpy, types):
  import dataclasses
  import json
  import struct
  entry = axpy.compiled.to_bytes()
  (length,) = struct.unpack_from("<I", entry)
  header = json.loads(entry[4:4 + length])
  assert header["param_types"] == ["float const*", "float*", "float", "int"]
  header["param_types"] = types
  text = json.dumps(header).encode()
  with pytest.raises(ValueError):
    type(axpy.compiled).from_bytes(struct.pack("<I", len(text)) + text + entry[4 + length:])
  assert dataclasses.replace(axpy.compiled).param_types == axpy.compiled.param_types


def test_a_source_the_probe_cannot_follow_still_compiles(isolated_disk_cache):
  # The probe's namespace made unusable: the kernel compiles without it, sizes checked only, or its
  # symbol's types for a C++ kernel.
  prefix = "#define jmf_probe 1\n"
  assert jmf.cuda_kernel(prefix + AXPY, "axpy").param_types is None
  templated = jmf.cuda_kernel(prefix + "template <class T> __global__ void k(const T* x, int n) {}", "k<float>")
  assert [t.text for t in templated.param_types] == ["const float*", "int"]


def test_a_probe_that_alone_fails_is_left_out_of_the_log():
  log = ('__nv_name_map(2): error: identifier "axpyy" is undefined\n  #pragma nv_mangled_name axpyy\n\n'
         '__nv_name_map(3): error: Name expression cannot form address of a non-__global__ function. Input '
         'name expression was: " jmf_probe :: signature < decltype ( & axpyy ) >"\n\n'
         '2 errors detected in the compilation of "k.cu".\n')
  assert program._without_probe_errors(log) == (
      '__nv_name_map(2): error: identifier "axpyy" is undefined\n  #pragma nv_mangled_name axpyy\n\n'
      '1 error detected in the compilation of "k.cu".\n')
  only_the_probe = log.split("\n\n", 1)[1]
  assert program._without_probe_errors(only_the_probe) is None


# ------------------------------------------------------------ PTX and cubin: signature=

def images_of(kernel, kind):
  return [i for i in kernel.images if i.kind == kind]


@pytest.fixture
def axpy_ptx(axpy):
  (image,) = images_of(axpy, ImageKind.PTX)
  return image.data


def test_ptx_signature_is_checked_like_cuda_cs(axpy_ptx):
  plain = jmf.ptx_kernel(axpy_ptx, "axpy")
  assert plain.param_types is None  # sizes only, as before
  (x,), (ints,) = arrays(jnp.float32), arrays(jnp.int32)
  trace(plain, [ints], ints, (np.float32(2), np.int32(N)))
  typed = jmf.ptx_kernel(axpy_ptx, "axpy", signature=["const float*", "float*", np.float32, "int32"])
  trace(typed, [x], x, (np.float32(2), np.int32(N)))
  assert refused(typed, [ints], x, (np.float32(2), np.int32(N))) == (
      f"mosaic_kernel 'axpy' at {SITE}: the kernel's parameter 0 is 'const float*', but the call passes "
      "in0, an int32[64] array; pass float32 data (x.astype(jnp.float32)), or declare the parameter "
      "'const int*' (or 'const void*' for any dtype)")
  by_dtype = jmf.ptx_kernel(axpy_ptx, "axpy", signature=["bfloat16*", "float32*", "float32", "int32"])
  assert [t.text for t in by_dtype.param_types] == ["__nv_bfloat16*", "float*", "float", "int"]


@pytest.mark.parametrize("signature, message", [
    (["const float*", "float*", "float"],
     "ptx_kernel 'axpy': signature= lists 3 parameters, but the PTX entry has 4 of [8, 8, 4, 4] bytes"),
    (["const float*", "float*", "double", "int"],
     "ptx_kernel 'axpy': signature[2] = 'double' is 8 bytes, but the PTX entry's parameter 2 is 4"),
    (["const float*", "float*", "float", "matrix"],
     "ptx_kernel: signature[3] = 'matrix' is not a type this check knows; write a C++ type ('const float*', "
     "'__nv_bfloat16*', 'int', 'unsigned long long', 'void*') or a numpy dtype name ('float32*', 'int32')"),
])
def test_a_ptx_signature_that_disagrees_with_the_ptx_is_refused(axpy_ptx, signature, message):
  with pytest.raises(ValueError) as info:
    jmf.ptx_kernel(axpy_ptx, "axpy", signature=signature)
  assert str(info.value) == message


def test_cubin_signature_and_mangled_symbols(isolated_disk_cache):
  axpb = jmf.cuda_kernel(kernel_sources.AXPB, "ops::axpb<float>")
  (cubin,) = images_of(axpb, ImageKind.CUBIN)
  (ptx,) = images_of(axpb, ImageKind.PTX)
  # A mangled symbol carries its types: no signature= needed.
  for kernel in (jmf.cubin_kernel({"sm_90": cubin.data}, axpb.symbol), jmf.ptx_kernel(ptx.data, axpb.symbol)):
    assert [t.text for t in kernel.param_types] == ["const float*", "float*", "long long"]
    x = arrays(jnp.float16)
    with pytest.raises(jmf.LaunchError, match="parameter 0 is 'const float[*]', but the call passes in0, a float16"):
      trace(kernel, x, x[0], (np.int64(N),))
  add = jmf.cuda_kernel(kernel_sources.ADD, "add")
  (cubin,) = images_of(add, ImageKind.CUBIN)
  typed = jmf.cubin_kernel(cubin.data, "add", signature=["const float*", "const float*", "float*", "int"])
  x = arrays(jnp.float32)
  trace(typed, x * 2, x[0], (np.int32(N),))
  assert refused(typed, x * 2, x[0], (np.float32(N),)) == (
      f"mosaic_kernel 'add' at {SITE}: the kernel's parameter 3 is 'int', but the call passes "
      "scalars[0], a float32 value; pass np.int32(...) as scalars[0], or declare the parameter 'float'")
  # A cubin has no PTX to count its parameters; its signature does.
  assert refused(typed, x, x[0], (np.int32(N),)) == (
      f"mosaic_kernel 'add' at {SITE}: the kernel takes 4 parameters ('const float*', 'const float*', "
      "'float*', 'int'), but the call passes 3: in0, a float32[64] array; out0, a float32[64] array; "
      "scalars[0], an int32 value; the order is inputs, outputs, then scalars")


def test_signature_spellings():
  assert param_types.of_signature(["const float *", "uint16_t*", "size_t", ml_dtypes.bfloat16, np.int8],
                                  "x") == ("const float*", "unsigned short*", "unsigned long", "__nv_bfloat16",
                                           "signed char")
  with pytest.raises(TypeError, match="signature must be a list"):
    param_types.of_signature("const float*", "x")


# ------------------------------------------------------------ honest messages

def test_a_misspelt_kernel_name_says_which_kernels_there_are(isolated_disk_cache):
  with pytest.raises(jmf.CompileError) as info:
    jmf.cuda_kernel(AXPY, "axpyy")
  line = test_a_misspelt_kernel_name_says_which_kernels_there_are.__code__.co_firstlineno + 2
  assert str(info.value) == (f"cuda_kernel at test_param_types.py:{line} "
                             "(test_a_misspelt_kernel_name_says_which_kernels_there_are): no kernel named 'axpyy'; "
                             "the source defines: axpy. Did you mean 'axpy'?")
  source = AXPY + "\n/* __global__ void commented(int) */ __global__ void __launch_bounds__(128) other(int* p) {}"
  with pytest.raises(jmf.CompileError, match=r"no kernel named 'zzz'; the source defines: axpy, other$"):
    jmf.cuda_kernel(source, "zzz")


def softmax_with_kernels():
  fwd = jmf.mosaic_kernel(
      jmf.cuda_kernel(kernel_sources.SOFTMAX, "softmax_fwd"), out_shape=lambda x: x,
      grid=lambda x: x.size // x.shape[-1], block=256, scalars=lambda x: (np.int32(x.shape[-1]),))
  bwd = jmf.mosaic_kernel(
      jmf.cuda_kernel(kernel_sources.SOFTMAX, "softmax_bwd"), out_shape=lambda y, d: y,
      grid=lambda y, d: y.size // y.shape[-1], block=256, scalars=lambda y, d: (np.int32(y.shape[-1]),))
  return jmf.differentiable(fwd, bwd=bwd, jvp=bwd, residuals=("out0",))


SECOND = ("second derivatives (jax.hessian, grad of grad, jvp of grad) are not supported: "
          "jmf.differentiable('softmax_fwd') gives first derivatives only, and JAX cannot see inside the "
          "kernels. For a second derivative, differentiate a jax.numpy version of the function, or a "
          "jax.custom_jvp of it whose jvp rule is itself differentiable")


def first_element(softmax):
  return lambda x: softmax(x)[0, 0]  # the line a second derivative's message names


@pytest.mark.parametrize("transform", [
    jax.hessian,
    lambda f: jax.grad(lambda x: jnp.sum(jax.grad(f)(x))),
    lambda f: jax.jit(jax.hessian(f)),
    lambda f: jax.grad(lambda x: jnp.sum(jax.jit(jax.grad(f))(x))),  # the first derivative staged first
])
def test_a_second_derivative_says_it_is_not_supported(isolated_disk_cache, transform):
  x = jax.ShapeDtypeStruct((2, 256), jnp.float32)
  with pytest.raises(NotImplementedError) as info:
    jax.make_jaxpr(transform(first_element(softmax_with_kernels())))(x)
  line = first_element.__code__.co_firstlineno + 1
  assert str(info.value) == f"mosaic_kernel 'softmax_fwd' at test_param_types.py:{line} (<lambda>): {SECOND}"
  jax.make_jaxpr(jax.grad(first_element(softmax_with_kernels())))(x)  # a first derivative is fine


def test_a_kernel_without_derivatives_still_says_attach_one(isolated_disk_cache):
  kernel = jmf.mosaic_kernel(jmf.cuda_kernel(kernel_sources.SOFTMAX, "softmax_fwd"), out_shape=lambda x: x,
                             grid=2, block=256, scalars=(np.int32(256),))
  with pytest.raises(TypeError, match="has no derivative: JAX cannot see inside a hand-written kernel. Attach one"):
    jax.make_jaxpr(jax.grad(lambda x: kernel(x)[0, 0]))(jax.ShapeDtypeStruct((2, 256), jnp.float32))


@pytest.mark.skipif(gpu_info.has_gpu(), reason="with a GPU the configs are timed, and nothing warns")
def test_the_autotune_warning_points_at_the_users_line(isolated_disk_cache, monkeypatch):
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  add = jmf.cuda_kernel(kernel_sources.ADD, "add")

  def factory(meta):
    return jmf.mosaic_kernel(add, lambda x, y: x, grid=lambda x, y: jmf.cdiv(x.size, meta["block"]),
                             block=meta["block"], scalars=lambda x, y: (np.int32(x.size),))

  tuned = jmf.autotune(factory, configs=[{"block": 128}, {"block": 256}], name="add")
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    line = sys._getframe().f_lineno + 1
    jax.jit(tuned).trace(x, x)
  (warning,) = [w for w in caught if w.category is autotuning.AutotuneSkipped]
  assert (warning.filename, warning.lineno) == (__file__, line)
  assert str(warning.message) == ("jax_mosaic_ffi.autotune 'add': no GPU here, so nothing is timed; using "
                                  "config 0 {'block': 128}")


# ------------------------------------------------------------ GPU: typed calls still run

@pytest.mark.gpu
def test_typed_calls_run_and_match_numpy(rng, isolated_disk_cache):
  source = r'''
  #include <cuda_bf16.h>
  #include <cstdint>
  extern "C" __global__ void scale_bf16(const __nv_bfloat16* x, const uint16_t* raw, __nv_bfloat16* y,
                                        uint16_t* copy, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] = __float2bfloat16(a * __bfloat162float(x[i])); copy[i] = raw[i]; }
  }
  '''
  kernel = jmf.cuda_kernel(source, "scale_bf16")
  n = 1000
  out = jax.ShapeDtypeStruct((n,), jnp.bfloat16)
  call = jax.jit(jmf.mosaic_kernel(kernel, (out, out), grid=jmf.cdiv(n, 128), block=128,
                                   scalars=(np.float32(3.0), np.int32(n))))
  x = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
  raw = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
  y, copy = call(x, raw)
  expected = (np.float32(3.0) * x.astype(np.float32)).astype(ml_dtypes.bfloat16)
  np.testing.assert_array_equal(np.asarray(y).view(np.uint16), expected.view(np.uint16))
  np.testing.assert_array_equal(np.asarray(copy).view(np.uint16), raw.view(np.uint16))
  # The same kernel through signature=, from its PTX.
  (ptx,) = images_of(kernel, ImageKind.PTX)
  typed = jmf.ptx_kernel(ptx.data, "scale_bf16",
                         signature=["const bfloat16*", "const uint16_t*", "bfloat16*", "uint16_t*", "float", "int"])
  call = jax.jit(jmf.mosaic_kernel(typed, (out, out), grid=jmf.cdiv(n, 128), block=128,
                                   scalars=(np.float32(3.0), np.int32(n))))
  y, copy = call(x, raw)
  np.testing.assert_array_equal(np.asarray(y).view(np.uint16), expected.view(np.uint16))
