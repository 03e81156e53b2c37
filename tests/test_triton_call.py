"""jmf.triton_call, jax-triton's call: binding, outputs, tuples, in-place updates, zeroing, options, decorated
kernels, effects, export, what it runs that jax-triton refuses, and the jax_mosaic_ffi.jax_triton namespace.

Everything up to the launch (binding, Triton's compile, lowering, export) runs on any machine; the GPU tests
run the kernels and compare with numpy. jax-triton's own tests run against it from outside the repository
(docs/coming_from_jax_triton.md says how).
"""

import json
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import partial_eval as pe

from triton_required import import_triton

triton = import_triton()

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import module_format
import jax_mosaic_ffi.jax_triton as jt
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p
from jax_mosaic_ffi.triton.decorators import NotSupported

import triton_call_sources as tc
import triton_descriptor_sources as tds
import triton_sources as ts
from hlo_inspect import custom_calls, f32, lower, only_call

gpu = pytest.mark.gpu


def add(x, y, **kwargs):
  kwargs.setdefault("BLOCK", 128)
  return jmf.triton_call(x, y, x.size, kernel=tc.add, out_type=jax.typeof(x),
                         grid=lambda meta: triton.cdiv(x.size, meta["BLOCK"]), **kwargs)


def module(cc) -> bytes:
  """The code the custom call carries, inflated: its cubin and PTX."""
  return b"".join(image.data for image in module_format.parse(cc["config"]["module"]).images)


# ---------------------------------------------------------------- binding

def test_operands_bind_by_position_and_by_name_as_python_binds_them(isolated_disk_cache):
  x = f32(1000)
  by_position = only_call(add, x, x)
  # in0, in1, the size, out0, then Triton's two scratch pointers (null scalars).
  assert by_position["config"]["param_order"] == [0, 1, -1, 2, -2, -3]
  assert by_position["operands"] == 2 and by_position["results"] == 1
  assert by_position["config"]["grid"] == [8, 1, 1] and by_position["config"]["block"] == [128, 1, 1]

  def by_name(x, y):  # keywords out of order
    return jmf.triton_call(x, n=x.size, y_ptr=y, kernel=tc.add, out_type=jax.typeof(x), grid=8, BLOCK=128)
  assert only_call(by_name, x, x)["config"]["param_order"] == [0, 1, -1, 2, -2, -3]

  def constexpr_between(x, y):  # (x_ptr, BLOCK, y_ptr, scale, n, out_ptr): BLOCK by keyword
    return jmf.triton_call(x, y_ptr=y, scale=2.5, n=x.size, kernel=tc.scaled_add_late_constexpr,
                           out_type=jax.typeof(x), grid=(4,), BLOCK=256)
  cc = only_call(constexpr_between, x, x)
  assert cc["config"]["param_order"] == [0, 1, -1, -2, 2, -3, -4]
  assert cc["config"]["scalar_data"][:4] == np.float32(2.5).tobytes()


def test_a_parameter_given_twice_or_outputs_that_do_not_fit_are_refused():
  x = jnp.zeros(8, jnp.float32)
  with pytest.raises(TypeError, match="multiple values for argument 'x_ptr'"):
    jmf.triton_call(x, x_ptr=x, kernel=tc.add, out_type=x, grid=1, BLOCK=8)
  with pytest.raises(ValueError, match="out_type has 2 unaliased outputs, but 1 kernel parameters are missing"):
    jmf.triton_call(x, x, 8, kernel=tc.add, out_type=(x, x), grid=1, BLOCK=8)
  with pytest.raises(TypeError, match="parameter 'y_ptr' got 'text'"):
    jmf.triton_call(x, "text", 8, kernel=tc.add, out_type=x, grid=1, BLOCK=8)
  with pytest.raises(ValueError, match="no outputs and no Ref arguments"):
    jmf.triton_call(x, 8, kernel=tc.increment, out_type=(), grid=1, BLOCK=8)


def test_constexpr_defaults_and_other_metaparameters_reach_the_grid(isolated_disk_cache):
  seen = []

  def call(x, y):
    def grid(meta):
      seen.append(dict(meta))
      return meta["SPLIT"] * triton.cdiv(x.size, meta["BLOCK"])
    return jmf.triton_call(x, y, x.size, kernel=tc.add_defaults, out_type=jax.typeof(x), grid=grid, SPLIT=2)

  cc = only_call(call, f32(640), f32(640))
  assert cc["config"]["grid"] == [20, 1, 1]  # 2 x 640 / 64: BLOCK's default, SPLIT a keyword that is no parameter
  assert seen[-1]["BLOCK"] == 64 and seen[-1]["SPLIT"] == 2 and seen[-1]["num_warps"] == 4


@pytest.mark.parametrize("value, size, data", [
    (7, 4, np.int32(7).tobytes()),
    (2**31 + 3, 4, np.uint32(2**31 + 3).tobytes()),
    (-2**40, 8, np.int64(-2**40).tobytes()),
    (2**63 + 5, 8, np.uint64(2**63 + 5).tobytes()),
    (2.5, 4, np.float32(2.5).tobytes()),
    (1e-300, 8, np.float64(1e-300).tobytes()),   # below fp32's range: fp64, as jax-triton types it
    (float("inf"), 4, np.float32("inf").tobytes()),
    (True, 1, b"\x01"),
    (np.int16(-3), 2, np.int16(-3).tobytes()),  # numpy scalars keep their type (jax-triton refuses them)
])
def test_python_scalars_are_typed_as_jax_triton_types_them(isolated_disk_cache, value, size, data):
  def call(x):
    return jmf.triton_call(x, value, kernel=tc.plus_scalar, out_type=jax.ShapeDtypeStruct((), jnp.float64), grid=1)
  with jax.enable_x64(True):
    cc = only_call(call, jax.ShapeDtypeStruct((1,), jnp.float64))
  assert cc["config"]["scalar_sizes"] == [size, 8, 8]
  assert cc["config"]["scalar_data"][:size] == data


def test_an_integer_equal_to_one_is_compiled_in_and_one_too_large_is_refused(isolated_disk_cache):
  def call(x, value):
    return jmf.triton_call(x, value, kernel=tc.plus_scalar, out_type=jax.ShapeDtypeStruct((), x.dtype), grid=1)
  cc = only_call(lambda x: call(x, 1), f32(1))
  assert cc["config"]["scalar_sizes"] == [8, 8]  # only the scratch pointers: 1 is a constexpr, as in Triton
  with pytest.raises(ValueError, match="integer overflow representing 18446744073709551616"):
    lower(lambda x: call(x, 2**64), f32(1))


# ---------------------------------------------------------------- outputs

def test_out_type_is_a_pytree_and_the_result_has_its_structure(isolated_disk_cache):
  def call(x):
    out = {"neg": jax.typeof(x), "pos": jax.typeof(x)}  # leaves in key order fill pos_ptr, then neg_ptr
    return jmf.triton_call(x, x.size, kernel=tc.two_outputs, out_type=out, grid=4, BLOCK=256)
  result = jax.eval_shape(call, f32(1000))
  assert set(result) == {"neg", "pos"} and result["pos"].shape == (1000,)
  cc = only_call(call, f32(1000))
  assert cc["results"] == 2 and cc["config"]["param_order"][:4] == [0, -1, 1, 2]


def test_out_shape_is_the_older_spelling():
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  with pytest.warns(DeprecationWarning, match="out_shape= is deprecated"):
    result = jax.eval_shape(lambda a: jmf.triton_call(a, a, a.size, kernel=tc.add, out_shape=jax.typeof(a), grid=2,
                                                      BLOCK=128), x)
  assert result.shape == (256,)
  with pytest.raises(TypeError, match="Cannot specify both"):
    jmf.triton_call(kernel=tc.add, out_type=x, out_shape=x, grid=1)
  with pytest.raises(TypeError, match="Either out_type= or the deprecated out_shape="):
    jmf.triton_call(kernel=tc.add, grid=1)


# ---------------------------------------------------------------- tuple parameters

def test_tuples_are_triton_tuple_parameters(isolated_disk_cache):
  def call(x, y, z, scale):
    return jmf.triton_call(x, (y, (z, scale)), x.size, kernel=tc.sum_tuple, out_type=jax.typeof(x), grid=4,
                           BLOCK=256)
  z16 = jax.ShapeDtypeStruct((1000,), jnp.float16)
  cc = only_call(lambda x, y, z: call(x, y, z, 3.0), f32(1000), f32(1000), z16)
  # The tuple's leaves in order: in1, in2, the scale; then n and the output.
  assert cc["operands"] == 3 and cc["config"]["param_order"][:6] == [0, 1, 2, -1, -2, 3]
  assert cc["config"]["scalar_data"][:4] == np.float32(3.0).tobytes()
  # An integer 1 inside a tuple is compiled in, as Triton's launcher does it.
  cc = only_call(lambda x, y, z: call(x, y, z, 1), f32(1000), f32(1000), z16)
  assert cc["config"]["param_order"][:5] == [0, 1, 2, -1, 3]


def test_mosaic_kernel_takes_tuple_parameters_in_param_order(isolated_disk_cache):
  call = jmf.mosaic_kernel(jmf.triton_kernel(tc.sum_tuple, constexprs={"BLOCK": 256}), lambda x, y, z: x,
                           grid=lambda meta, x, y, z: jmf.cdiv(x.size, meta["BLOCK"]),
                           scalars=(np.float32(2), np.int32(1000)),
                           param_order=("in0", ("in1", ("in2", "scalar0")), "scalar1", "out0"))
  cc = only_call(call, f32(1000), f32(1000), f32(1000))
  assert cc["config"]["param_order"][:6] == [0, 1, 2, -1, -2, 3]


def _tuple_misfits(first):
  """Ways a well-typed cached specialization of sum_tuple(x, (y, (z, scale=1)), n=48, out) can be wrong for the
  call, each at a tuple element's path (leaves: x 0, y 1, z 2, scale 3, n 4, out 5)."""
  import dataclasses
  pair = first.signature["pair"]
  return {
      "an element of another kind": dataclasses.replace(
          first, signature={**first.signature, "pair": (pair[0], ("*fp16", pair[1][1]))}),
      "an element's alignment dropped, its hint kept": dataclasses.replace(
          first, aligned=tuple(k for k in first.aligned if k != 2)),
      "a constant at another element": dataclasses.replace(
          first, constexprs={**{k: v for k, v in first.constexprs.items() if k != (1, 1, 1)}, (1, 1, 0): 1}),
      "n (48) compiled in as 1": dataclasses.replace(
          first, dropped=(3, 4), aligned=tuple(k for k in first.aligned if k != 4),
          signature={**first.signature, "n": "constexpr"}, constexprs={**first.constexprs, (2,): 1}),
  }


@pytest.mark.parametrize("case", ["an element of another kind", "an element's alignment dropped, its hint kept",
                                  "a constant at another element", "n (48) compiled in as 1"])
def test_a_tuple_parameters_cached_specialization_is_checked_leaf_by_leaf(isolated_disk_cache, monkeypatch, case):
  """A tuple parameter's specialization reads back from the disk cache (as in a new process) without asking
  Triton, and one that does not fit the call at some element is asked again and rebuilt."""
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "0")  # it counts Triton's answers: the audit asks on each hit
  import hashlib
  from triton.backends.compiler import GPUTarget
  from triton.compiler import make_backend
  from jax_mosaic_ffi.base import disk_cache
  from jax_mosaic_ffi.store import compile_cache
  from jax_mosaic_ffi.triton.compiler import specialize as triton_specialize
  asked = []
  real = triton_specialize.specialize
  monkeypatch.setattr(triton_specialize, "specialize", lambda *a: asked.append(a) or real(*a))
  types = ["*fp32", ("*fp32", ("*fp32", "i32")), "i32", "*fp32"]

  def answer():
    return triton_specialize.specialize_cached(tc.sum_tuple, types, {3: np.int32(1), 4: np.int32(48)},
                                               {"BLOCK": 256}, "sm_90", lambda: make_backend(GPUTarget("cuda", 90, 32)))

  first = answer()
  assert first.dropped == (3,) and first.signature["pair"] == ("*fp32", ("*fp32", "constexpr"))
  assert first.constexprs[(1, 1, 1)] == 1 and 2 in first.aligned and len(asked) == 1
  compile_cache.clear_memory_cache()  # as in a new process
  assert answer() == first and len(asked) == 1
  (path,) = [p for p in disk_cache.cache_dir().rglob("*.bin") if b'"dropped"' in p.read_bytes()]
  payload = triton_specialize._encode(_tuple_misfits(first)[case])
  assert triton_specialize._decode(payload) is not None  # well-typed: it reads back
  path.write_bytes(disk_cache._ENTRY_HEADER.pack(disk_cache._ENTRY_MAGIC, len(payload),
                                                 hashlib.sha256(payload).digest()) + payload)
  compile_cache.clear_memory_cache()
  assert answer() == first and len(asked) == 2  # asked of Triton again, not taken as read


def test_a_descriptor_inside_a_tuple_is_refused():
  x = jax.ShapeDtypeStruct((64, 64), jnp.float16)

  def call(a):
    desc = jt.TensorDescriptor.from_array(a, block_shape=[64, 64])
    return jmf.triton_call((desc, desc), kernel=tc.copy_tile, out_type=jax.typeof(a), grid=1, M=64, N=64)
  with pytest.raises(jmf.LaunchError, match="inside a tuple"):
    lower(call, x)


# ---------------------------------------------------------------- in place: aliases and Refs

def test_input_output_aliases_count_operands_as_jax_triton_counts_them(isolated_disk_cache):
  def call(x):  # operands: n (0), x (1)
    return jmf.triton_call(x.size, x, kernel=tc.increment_size_first, out_type=jax.typeof(x), grid=4, BLOCK=256,
                           input_output_aliases={1: 0})
  lowered = lower(call, f32(1000))
  (cc,) = custom_calls(lowered)
  assert cc["operands"] == 1 and cc["results"] == 1
  assert cc["config"]["param_order"][:2] == [-1, 0]  # one buffer for the aliased pair
  assert "output_operand_aliases" in lowered.as_text()
  x = jnp.zeros(8, jnp.float32)
  with pytest.raises(ValueError, match="must be a bijection"):
    jmf.triton_call(x, x, 8, kernel=tc.add, out_type=x, grid=1, BLOCK=8, input_output_aliases={0: 0, 1: 0})
  with pytest.raises(ValueError, match="operand 2, a scalar"):
    jmf.triton_call(x, x, 8, kernel=tc.add, out_type=x, grid=1, BLOCK=8, input_output_aliases={2: 0})
  with pytest.raises(ValueError, match="key 5 is not an operand index"):
    jmf.triton_call(x, x, 8, kernel=tc.add, out_type=x, grid=1, BLOCK=8, input_output_aliases={5: 0})


def test_aliases_and_outputs_that_are_no_indices_or_shapes_are_named():
  x = jnp.zeros(8, jnp.float32)
  for aliases, what in (({"a": 0}, r"input_output_aliases key \(an operand index\) must be an integer, got 'a'"),
                        ({0: [0]}, r"input_output_aliases value \(an output index\) must be an integer, got \[0\]"),
                        ({True: 0}, r"input_output_aliases key \(an operand index\) must be an integer, got True"),
                        ([(0, 0)], r"input_output_aliases must be a dict")):
    with pytest.raises(jmf.LaunchError, match=r"triton_call 'add' at .*: (an )?" + what):
      jmf.triton_call(x, x, 8, kernel=tc.add, out_type=x, grid=1, BLOCK=8, input_output_aliases=aliases)
  for out_type, shown in ((5, r"out_type is 5 \(int\)"), ("f32", r"out_type is 'f32' \(str\)"),
                          ((x, None, 3), r"out_type\[2\] is 3 \(int\)")):
    with pytest.raises(jmf.LaunchError, match=rf"triton_call 'add' at .*: {shown}, not a shape and dtype; pass a "
                                              r"jax.ShapeDtypeStruct"):
      jmf.triton_call(x, x, 8, kernel=tc.add, out_type=out_type, grid=1, BLOCK=8)


def test_refs_are_updated_in_place(isolated_disk_cache):
  def call(x):
    ref = jax.new_ref(x)
    assert jmf.triton_call(ref, x.size, kernel=tc.increment, out_type=(), grid=4, BLOCK=256) == ()
    return ref[...]
  lowered = lower(call, f32(1000))
  (cc,) = custom_calls(lowered)
  assert cc["operands"] == 1 and cc["results"] == 1 and "output_operand_aliases" in lowered.as_text()

  def beside_an_output(x, acc):  # accumulate(x, acc, n, out): acc a Ref, out allocated
    ref = jax.new_ref(acc)
    out = jmf.triton_call(x, ref, x.size, kernel=tc.accumulate, out_type=jax.typeof(x), grid=4, BLOCK=256)
    return out, ref[...]
  cc = only_call(beside_an_output, f32(1000), f32(1000))
  # in0, in1 (the Ref's buffer, aliased to output 1), n, out0.
  assert cc["operands"] == 2 and cc["results"] == 2 and cc["config"]["param_order"][:4] == [0, 1, -1, 2]

  def in_a_tuple(x, y, z):
    ref = jax.new_ref(y)
    out = jmf.triton_call(x, (ref, (z, 2.0)), x.size, kernel=tc.sum_tuple, out_type=jax.typeof(x), grid=4,
                          BLOCK=256)
    return out, ref[...]
  assert only_call(in_a_tuple, f32(1000), f32(1000), f32(1000))["results"] == 2


def test_a_transformed_ref_is_updated_in_place(isolated_disk_cache):
  # jax-triton refuses TransformedRefs; the view's values go in and come back.
  def call(x):
    ref = jax.new_ref(x)
    jmf.triton_call(ref.at[8:24], 16, kernel=tc.increment, out_type=(), grid=1, BLOCK=16)
    return ref[...]
  assert jax.eval_shape(call, f32(32)).shape == (32,)
  assert only_call(call, f32(32))["operands"] == 1


def test_aliases_combine_with_refs_that_they_do_not_name(isolated_disk_cache):
  def call(x, acc, out):  # add_into(x, acc, n): acc aliased to the one output; x read through a Ref
    ref = jax.new_ref(x)
    return jmf.triton_call(ref, acc, x.size, kernel=tc.add_into, out_type=jax.typeof(out), grid=4, BLOCK=256,
                           input_output_aliases={1: 0})
  cc = only_call(call, f32(1000), f32(1000), f32(1000))
  assert cc["operands"] == 2 and cc["results"] == 2
  x = jnp.zeros(8, jnp.float32)
  with pytest.raises(ValueError, match="cannot be combined with Ref"):
    jmf.triton_call(jax.new_ref(x), 8, kernel=tc.increment, out_type=(), grid=1, BLOCK=8,
                    input_output_aliases={0: 0})


# ---------------------------------------------------------------- zeroing

def test_zeroed_outputs_are_zeroed_before_every_launch(isolated_disk_cache):
  seen = []

  def call(x, zeroed):
    return _row_sums(x, zeroed, BLOCK=128)

  def by_meta(meta):
    seen.append(meta["BLOCK"])
    return (0,)
  for zeroed in ((0,), by_meta):
    assert only_call(lambda x: call(x, zeroed), f32(64, 500))["config"]["zero_outputs"] == [0]
  assert seen == [128]
  with pytest.raises(ValueError, match=r"zeroed_outputs must be indices of outputs \(0..0\)"):
    lower(lambda x: call(x, (1,)), f32(64, 500))


def _row_sums(x, zeroed, kernel=tc.row_sums, **meta):
  """row_sums(x_ptr, out_ptr, cols): the output between two operands, cols by keyword."""
  return jmf.triton_call(x, cols=x.shape[1], kernel=kernel, out_type=jax.ShapeDtypeStruct((x.shape[0],), x.dtype),
                         grid=lambda m: (x.shape[0], triton.cdiv(x.shape[1], m["BLOCK"])), zeroed_outputs=zeroed,
                         **meta)


def test_a_zeroed_aliased_output_gets_zeros_in_its_input(isolated_disk_cache):
  def call(x, acc):
    return jmf.triton_call(x, acc, x.size, kernel=tc.add_into, out_type=jax.typeof(acc), grid=4, BLOCK=256,
                           input_output_aliases={1: 0}, zeroed_outputs=(0,))
  jaxpr = jax.make_jaxpr(call)(f32(1000), f32(1000))
  (eqn,) = [e for e in jaxpr.eqns if e.primitive is mosaic_kernel_p]
  # The kernel's accumulator is a fresh zero buffer, not the caller's acc (as jax-triton zeroes it).
  assert eqn.invars[0] is jaxpr.jaxpr.invars[0] and eqn.invars[1] is not jaxpr.jaxpr.invars[1]
  assert eqn.params["spec"].zero_outputs == ()


def test_zeroed_outputs_of_an_autotuned_kernel_follow_each_config(isolated_disk_cache):
  seen = []

  def zeroed(meta):
    seen.append(meta["BLOCK"])
    return (0,)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # no GPU here: the first config is taken untimed, with a warning
    cc = only_call(lambda x: _row_sums(x, zeroed, kernel=tc.row_sums_tuned), f32(64, 500))
  assert cc["config"]["zero_outputs"] == [0] and 64 in seen


def test_a_zeroed_outputs_callable_that_raises_is_named(isolated_disk_cache):
  def zeroed(meta):
    return (0,) if meta["ZERO"] else ()
  for kernel in (tc.row_sums, tc.row_sums_tuned):  # evaluated at the call, or per config of an autotuned kernel
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # no GPU here: the first config is taken untimed, with a warning
      with pytest.raises(jmf.LaunchError) as caught:
        lower(lambda x: _row_sums(x, zeroed, kernel=kernel, BLOCK=128), f32(64, 500))
    assert re.fullmatch(
        r"triton_call 'row_sums' at \S+ \(_row_sums\): zeroed_outputs, the callable "
        r".*zeroed, raised KeyError: 'ZERO' for meta \{'BLOCK': 128, .*'num_warps': \d+.*\}; make it return the "
        r"indices of the outputs to zero for every meta, or pass them as a tuple \(zeroed_outputs=\(0,\)\)",
        str(caught.value)), str(caught.value)
    assert isinstance(caught.value.__cause__, KeyError)


# ---------------------------------------------------------------- options

def test_launch_options_and_backend_options(isolated_disk_cache):
  x = f32(1024)
  assert only_call(lambda a, b: add(a, b, num_warps=8), x, x)["config"]["block"] == [256, 1, 1]
  assert only_call(lambda a, b: add(a, b, backend_options={"num_warps": 2}), x, x)["config"]["block"] == [64, 1, 1]
  limited = only_call(lambda a, b: add(a, b, backend_options={"maxnreg": 40}), x, x)
  assert b".maxnreg 40" in module(limited)
  with pytest.raises(ValueError, match="both as explicit arguments and in ``backend_options``"):
    lower(lambda a, b: add(a, b, num_warps=4, backend_options={"num_warps": 2}), x, x)
  with pytest.raises(TypeError, match=r"backend_options\['extern_libs'\] must be hashable"):
    lower(lambda a, b: add(a, b, backend_options={"extern_libs": {"libdevice": "/x.bc"}}), x, x)
  with pytest.raises(ValueError, match="'num_wraps' is not a compile option of Triton .* it takes .*enable_fp_fusion"):
    lower(lambda a, b: add(a, b, backend_options={"num_wraps": 2}), x, x)
  with pytest.raises(ValueError, match="launch_cooperative_grid.*not taken here.*cooperative"):
    lower(lambda a, b: add(a, b, backend_options={"launch_cooperative_grid": True}), x, x)
  with pytest.raises(ValueError, match="serialized_metadata"):
    lower(lambda a, b: add(a, b, serialized_metadata=b"meta"), x, x)


def test_tritons_compile_options_reach_triton(isolated_disk_cache):
  def axpy(x, y, **kwargs):
    return jmf.triton_call(x, y_ptr=y, scale=2.0, n=x.size, kernel=tc.scaled_add_late_constexpr,
                           out_type=jax.typeof(x), grid=4, BLOCK=256, **kwargs)
  x = f32(1000)
  assert b"fma.rn.f32" in module(only_call(axpy, x, x))
  unfused = module(only_call(lambda a, b: axpy(a, b, backend_options={"enable_fp_fusion": False}), x, x))
  assert b"fma.rn.f32" not in unfused and b"mul.rn.f32" in unfused


def test_compute_capability_picks_the_target_and_clusters_need_hopper(isolated_disk_cache):
  x = f32(1024)
  ampere = only_call(lambda a, b: add(a, b, compute_capability=80), x, x)
  assert b".target sm_80" in module(ampere)
  with pytest.raises(ValueError, match=re.escape(
      "triton_kernel 'add': num_ctas > 1 unsupported before Hopper (compute capability 90); the target is sm_80: "
      "pass num_ctas=1 (or a config without num_ctas), or compile for sm_90 or newer")):
    lower(lambda a, b: add(a, b, compute_capability=80, num_ctas=2), x, x)
  clustered = only_call(lambda a: jmf.triton_call(a, kernel=tc.copy4, out_type=jax.typeof(a), grid=(256,),
                                                 num_ctas=2, compute_capability=90), x)
  assert clustered["config"]["cluster"] == [2, 1, 1] and clustered["config"]["grid"] == [512, 1, 1]



@pytest.mark.parametrize("value", ["banana", 9.0, 5, True, "sm_90"])
def test_a_compute_capability_that_is_none_is_named(value):
  x = f32(1024)
  with pytest.raises(jmf.LaunchError, match=re.escape(
      f"compute_capability={value!r} is not a compute capability; pass an int, major * 10 + minor as jax-triton "
      "takes it (80 for sm_80, 90 for sm_90), or leave it out to compile for the visible GPU (sm_90 where there is "
      "none)")) as caught:
    lower(lambda a, b: add(a, b, compute_capability=value), x, x)
  assert str(caught.value).startswith("triton_call 'add' at ")


def test_a_compute_capability_may_be_a_numpy_int_or_digits(isolated_disk_cache):
  x = f32(1024)
  for value in (np.int32(80), "80"):
    assert b".target sm_80" in module(only_call(lambda a, b: add(a, b, compute_capability=value), x, x))

def test_its_errors_name_triton_call_at_the_users_line():
  # Raised by the launch under triton_call, at the trace and at the lowering: the call as the user wrote it.
  x = f32(1024)
  with pytest.raises(jmf.LaunchError) as caught:
    lower(lambda a, b: add(a, b, backend_options={"launch_pdl": True}), x, x)
  assert re.match(r"triton_call 'add' at test_triton_call\.py:\d+ \(add\): uses_pdl=True", str(caught.value)), \
      caught.value
  with pytest.raises(NotImplementedError) as caught:  # no fallback, lowered for the CPU
    jax.jit(add).trace(x, x).lower(lowering_platforms=("cpu",))
  assert str(caught.value).startswith("triton_call 'add' at test_triton_call.py:"), caught.value
  # Its CPU path is triton_call's own fallback=, as a jax-triton user would write it: mosaic_kernel is not named.
  assert "triton_call(..., fallback=fn)" in str(caught.value) and "mosaic_kernel" not in str(caught.value)
  assert "a jax.numpy function of the kernel's operands in parameter order (outputs left out)" in str(caught.value)
  # A mosaic_kernel call after it is named as before.
  call = jmf.mosaic_kernel(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 128}), lambda x, y: x, grid=8,
                           scalars=lambda meta, x, y: (np.int32(x.size),), uses_pdl=True)
  with pytest.raises(jmf.LaunchError, match=r"^mosaic_kernel 'add' at .*uses_pdl=True"):
    lower(call, x, x)


def test_launch_pdl_is_uses_pdl():
  x = f32(1024)
  with pytest.raises(jmf.LaunchError, match="uses_pdl=True, but the kernel does not wait"):
    lower(lambda a, b: add(a, b, backend_options={"launch_pdl": True}), x, x)
  assert only_call(lambda a, b: add(a, b, backend_options={"launch_pdl": False}), x, x)["config"]["uses_pdl"] is False


def test_debug_compiles_with_tritons_debug_and_prints_its_irs(isolated_disk_cache, capsys):
  x = f32(1024)
  only_call(lambda a, b: add(a, b, debug=True), x, x)
  printed = capsys.readouterr().out
  assert "add for sm_90: ttir" in printed and "tt.func public @add" in printed and ".entry add" in printed


# ---------------------------------------------------------------- decorated kernels

def test_autotune_configs_that_disagree_with_metaparameters_are_dropped(isolated_disk_cache):
  seen = []

  def call(x, y, **meta):
    def grid(m):
      seen.append(m["BLOCK"])
      return triton.cdiv(x.size, m["BLOCK"])
    return jmf.triton_call(x, y, x.size, kernel=tc.add_tuned, out_type=jax.typeof(x), grid=grid, **meta)
  x = f32(1024)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # one config left: nothing to time, so no warning about timing
    cc = only_call(lambda a, b: call(a, b, BLOCK=128), x, x)
  assert seen == [128] and cc["config"]["block"] == [128, 1, 1]  # the BLOCK=128 config's num_warps=4
  with pytest.raises(ValueError, match="no @triton.autotune config agrees with {'BLOCK': 100}"):
    lower(lambda a, b: call(a, b, BLOCK=100), x, x)


def test_a_heuristic_wins_over_a_metaparameter(isolated_disk_cache):
  seen = []

  def call(x, y):
    def grid(m):
      seen.append((m["BLOCK"], m["EVEN"]))
      return triton.cdiv(x.size, m["BLOCK"])
    # EVEN=False given, as Triton and jax-triton would take it: the heuristic's value wins.
    return jmf.triton_call(x, y, x.size, kernel=tc.add_even, out_type=jax.typeof(x), grid=grid, BLOCK=64,
                           EVEN=False)
  only_call(call, f32(1024), f32(1024))
  assert seen == [(64, True)]


def test_pre_hooks_are_refused_as_jax_triton_refuses_them():
  x = jnp.zeros(64, jnp.float32)
  for expected in (NotImplementedError, ValueError):
    with pytest.raises(expected, match="pre_hook"):
      jmf.triton_call(x, x, 64, kernel=tc.add_with_pre_hook, out_type=x, grid=1)
  assert issubclass(NotSupported, NotImplementedError) and issubclass(NotSupported, ValueError)


def test_a_jit_function_as_a_constexpr_compiles_once_per_function(isolated_disk_cache):
  def call(x, op):  # unary(x_ptr, out_ptr, n, BLOCK, OP): n by keyword, after the output
    return jmf.triton_call(x, n=x.size, kernel=tc.unary, out_type=jax.typeof(x), grid=4, BLOCK=256, OP=op)
  before = jmf.kernel_cache_stats().compiles["triton"]
  x = f32(1000)
  negated = module(only_call(lambda a: call(a, tc.negate), x))
  squared = module(only_call(lambda a: call(a, tc.square), x))
  only_call(lambda a: call(a, tc.negate), x)
  assert negated != squared and jmf.kernel_cache_stats().compiles["triton"] - before == 2


# ---------------------------------------------------------------- effects and what travels with the call

def test_has_side_effect_keeps_a_call_whose_results_are_unused(isolated_disk_cache):
  x = f32(1024)
  for effect in (False, True):
    jaxpr = jax.make_jaxpr(lambda a, b: add(a, b, has_side_effect=effect))(x, x)
    kept, _ = pe.dce_jaxpr(jaxpr.jaxpr, [False])
    assert len([e for e in kept.eqns if e.primitive is mosaic_kernel_p]) == int(effect)
  text = lower(lambda a, b: add(a, b, has_side_effect=True), x, x).as_text()
  assert "has_side_effect = true" in text

  def discarded(a, effect):
    add(a, a, has_side_effect=effect)
    return a * 2
  for effect in (False, True):
    text = lower(lambda a: discarded(a, effect), x).as_text()
    assert text.count(f"stablehlo.custom_call @{jt.CUSTOM_CALL_TARGET_NAME}") == int(effect)


def test_a_cost_estimate_travels_with_the_call(isolated_disk_cache):
  x = f32(1024)
  cc = only_call(lambda a, b: add(a, b, cost_estimate={"flops": 123, "bytes_accessed": 456}), x, x)
  assert json.loads(cc["config"]["cost_estimate_json"]) == {"flops": 123, "bytes_accessed": 456}
  with pytest.raises(jmf.LaunchError, match="cost_estimate must map names"):
    lower(lambda a, b: add(a, b, cost_estimate={"flops": -1}), x, x)


def test_the_name_is_a_named_scope(isolated_disk_cache):
  x = f32(1024)
  text = lower(lambda a, b: add(a, b, name="my_vector_add"), x, x).as_text(debug_info=True)
  assert "my_vector_add" in text


# ---------------------------------------------------------------- export

def test_a_call_exports_with_its_cubin(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((4096,), jnp.float32)
  before = jmf.kernel_cache_stats().compiles["triton"]
  exported = jax.export.export(jax.jit(add), platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(x, x)
  restored = jax.export.deserialize(exported.serialize())
  assert f"stablehlo.custom_call @{jt.CUSTOM_CALL_TARGET_NAME}" in restored.mlir_module()
  assert restored.out_avals[0].shape == (4096,)
  assert jmf.kernel_cache_stats().compiles["triton"] - before == 1


# ---------------------------------------------------------------- what jax-triton refuses, and fallback=

def _add_with_fallback(x, y):
  return add(x, y, fallback=lambda a, b, n: a + b)


def test_a_fallback_runs_off_cuda(rng):
  x, y = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(_add_with_fallback)(x, y)), x + y, rtol=1e-6)

  def accumulate(x, acc):  # the fallback sees what the kernel sees: a zeroed accumulator
    return jmf.triton_call(x, acc, x.size, kernel=tc.add_into, out_type=jax.typeof(acc), grid=4, BLOCK=256,
                           input_output_aliases={1: 0}, zeroed_outputs=(0,), fallback=lambda a, b, n: a + b)
  np.testing.assert_allclose(np.asarray(jax.jit(accumulate)(x, y)), x, rtol=1e-6)
  with pytest.raises(ValueError, match="fallback cannot update Ref"):
    jmf.triton_call(jax.new_ref(jnp.asarray(x)), 1000, kernel=tc.increment, out_type=(), grid=4, BLOCK=256,
                    fallback=lambda a, n: ())


def test_vmap_runs_the_kernel_per_batch_element(rng):
  # jax-triton raises under vmap; here the kernel runs once per element (the fallback, off CUDA).
  xs, ys = (rng.standard_normal((3, 500)).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(_add_with_fallback))(xs, ys)), xs + ys, rtol=1e-6)
  (cc,) = custom_calls(lower(jax.vmap(add), f32(3, 500), f32(3, 500)))
  assert cc["config"]["batch_size"] == 3


def test_gradients_come_from_differentiable(rng):
  add_d = jmf.differentiable(_add_with_fallback, bwd=lambda g: (g, g))
  x, y = (rng.standard_normal(200).astype(np.float32) for _ in range(2))
  gx, gy = jax.grad(lambda a, b: (add_d(a, b) * a).sum(), argnums=(0, 1))(x, y)
  np.testing.assert_allclose(np.asarray(gx), 2 * x + y, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(gy), x, rtol=1e-5)
  with pytest.raises(TypeError, match="jmf.differentiable"):
    jax.grad(lambda a, b: _add_with_fallback(a, b).sum())(x, y)


# ---------------------------------------------------------------- the jax_triton namespace

def test_the_jax_triton_module_holds_jax_tritons_public_names():
  assert set(jt.__all__) == {"triton_call", "strides_from_shape", "CUSTOM_CALL_TARGET_NAME", "TensorDescriptor",
                             "__version__", "__version_info__"}
  assert all(hasattr(jt, name) for name in jt.__all__)
  assert jt.triton_call is jmf.triton_call and jt.__version_info__ == (0, 4, 1) and jt.__version__ == "0.4.1"
  assert jt.CUSTOM_CALL_TARGET_NAME == "jax_mosaic_ffi_launch_v1"
  assert jt.strides_from_shape((4, 8, 16)) == (128, 16, 1) and jt.strides_from_shape((5,)) == (1,)


def test_jax_tritons_other_names_are_pointed_to_from_the_package():
  with pytest.raises(AttributeError, match="import jax_mosaic_ffi.jax_triton as jt.*jt.strides_from_shape"):
    jmf.strides_from_shape((2, 2))
  with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
    assert jmf.no_such_name is None


def test_tensor_descriptors_lower_to_tma_or_to_the_decomposed_form(isolated_disk_cache):
  def copy(a, **options):
    desc = jt.TensorDescriptor.from_array(a, block_shape=[32, 64], **options)
    assert jax.tree.leaves(desc) == [a]
    return jmf.triton_call(desc, kernel=tc.copy_tile, out_type=jax.typeof(a), grid=1, M=32, N=64,
                           compute_capability=options.pop("cc", 90))
  a = f32(32, 64)
  tma = only_call(copy, a)["config"]
  assert len(tma["tensor_maps"]) == 26 and tma["tensor_maps"][1] == 7  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
  tf32 = only_call(lambda x: copy(x, round_f32_to_tf32=True), a)["config"]
  assert tf32["tensor_maps"][1] == 11  # CU_TENSOR_MAP_DATA_TYPE_TFLOAT32: the copy rounds, as in jax-triton
  with pytest.raises(jmf.LaunchError, match="round_f32_to_tf32=True needs a float32 array"):
    lower(lambda x: copy(x, round_f32_to_tf32=True), jax.ShapeDtypeStruct((32, 64), jnp.float16))
  # A layout is a Gluon kernel's (tests/test_gluon.py): a @triton.jit kernel's compiler picks its own.
  with pytest.raises(jmf.LaunchError, match="has layout='a layout', but a Triton kernel's compiler picks its "
                                            "descriptors' shared layouts; drop layout="):
    lower(lambda x: copy(x, layout="a layout"), a)


def test_a_tensor_descriptor_view(isolated_disk_cache):
  def call(a):  # rows 0..31 of a (64, 64) array, described as a view
    desc = jt.TensorDescriptor(a, (32, 64), (64, 1), (32, 64))
    return jmf.triton_call(desc, kernel=tc.copy_tile, out_type=jax.ShapeDtypeStruct((32, 64), a.dtype), grid=1,
                           M=32, N=64)
  cc = only_call(call, f32(64, 64))
  assert cc["operands"] == 1 and cc["config"]["tensor_maps"][7:9] == [64, 32]  # the view's dims, innermost first
  with pytest.raises(ValueError, match="same length"):
    jt.TensorDescriptor(jnp.zeros((4, 4)), (4, 4), (4,), (4, 4))


# ---------------------------------------------------------------- GPU

def written_through(x, y, how: str):
  """x + y, stored by the kernel through a descriptor of the output: of an array aliased to the output, or of a
  Ref (jax-triton's two ways to a buffer a TMA kernel writes)."""
  dx, dy = (jt.TensorDescriptor.from_array(v, block_shape=[32, 64]) for v in (x, y))
  grid = (jmf.cdiv(x.shape[0], 32), jmf.cdiv(x.shape[1], 64))
  if how == "aliased":
    out = jt.TensorDescriptor.from_array(jnp.zeros(x.shape, x.dtype), block_shape=[32, 64])
    return jmf.triton_call(dx, dy, out, kernel=tds.add, out_type=jax.typeof(x), grid=grid,
                           input_output_aliases={2: 0}, BM=32, BN=64)
  ref = jax.new_ref(jnp.zeros(x.shape, x.dtype))
  jmf.triton_call(dx, dy, jt.TensorDescriptor.from_array(ref, block_shape=[32, 64]), kernel=tds.add, out_type=(),
                  grid=grid, BM=32, BN=64)
  return ref[...]


@pytest.mark.parametrize("how", ["aliased", "ref"])
def test_a_kernel_writes_through_a_descriptor_of_an_aliased_array_or_a_ref(isolated_disk_cache, how):
  cc = only_call(lambda x, y: written_through(x, y, how), f32(100, 136), f32(100, 136))
  # Three buffers (x, y, the output's), three tensor maps, and the output is the third buffer, updated in place.
  assert (cc["operands"], cc["results"]) == (3, 1) and len(cc["config"]["tensor_maps"]) == 3 * 26
  assert "output_operand_aliases" in cc["attributes"]
  with pytest.raises(ValueError, match="names operand 2, a scalar; it aliases arrays"):
    x = jnp.zeros(4, jnp.float32)
    jmf.triton_call(x, x, 4, kernel=tc.add, out_type=x, grid=1, BLOCK=4, input_output_aliases={2: 0})


def test_a_constexpr_named_like_a_launch_option_takes_triton_calls_option(isolated_disk_cache):
  def call(x, **options):
    return jmf.triton_call(n=x.size, kernel=ts.fill_warps, out_type=jax.ShapeDtypeStruct(x.shape, jnp.int32),
                           grid=lambda meta: jmf.cdiv(x.size, meta["BLOCK"]), BLOCK=128, **options)
  assert only_call(lambda x: call(x, num_warps=2), f32(1000))["config"]["block"] == [64, 1, 1]
  assert only_call(call, f32(1000))["config"]["block"] == [128, 1, 1]  # jax-triton's default, 4


@gpu
def test_add_matches_numpy_for_each_grid_form(rng, isolated_disk_cache):
  for dtype, n in ((np.float32, 5003), (np.float16, 70000), (np.int32, 1000)):
    x, y = ((rng.standard_normal(n) * 100).astype(dtype) for _ in range(2))
    for grid in (triton.cdiv(n, 128), (triton.cdiv(n, 128),), lambda m: triton.cdiv(n, m["BLOCK"]),
                 lambda m: (triton.cdiv(n, m["BLOCK"]),)):
      out = jax.jit(lambda a, b: jmf.triton_call(a, b, a.size, kernel=tc.add, out_type=jax.typeof(a), grid=grid,
                                                 BLOCK=128))(x, y)
      np.testing.assert_allclose(np.asarray(out), x + y, rtol=1e-3)


@gpu
def test_python_scalars_run_with_the_type_they_get(isolated_disk_cache):
  with jax.enable_x64(True):
    x = jnp.array([1.0], jnp.float64)
    for value in (42.0, 1e-30, float("inf"), np.float32(8), 7, 2**40):
      out = jmf.triton_call(x, value, kernel=tc.plus_scalar, out_type=jax.ShapeDtypeStruct((), x.dtype), grid=1)
      np.testing.assert_allclose(np.asarray(out), 1.0 + np.float64(value), rtol=1e-6)


@gpu
def test_refs_and_aliases_update_in_place_on_the_gpu(rng, isolated_disk_cache):
  x = rng.standard_normal(1000).astype(np.float32)
  ref = jax.new_ref(jnp.asarray(x))
  jmf.triton_call(ref, 1000, kernel=tc.increment, out_type=(), grid=4, BLOCK=256)  # eagerly
  np.testing.assert_allclose(np.asarray(ref[...]), x + 1, rtol=1e-6)
  jax.jit(lambda r: jmf.triton_call(r, 1000, kernel=tc.increment, out_type=(), grid=4, BLOCK=256))(ref)
  np.testing.assert_allclose(np.asarray(ref[...]), x + 2, rtol=1e-6)

  acc = rng.standard_normal(1000).astype(np.float32)
  acc_ref = jax.new_ref(jnp.asarray(acc))
  out = jmf.triton_call(jnp.asarray(x), acc_ref, 1000, kernel=tc.accumulate, out_type=jax.typeof(x), grid=4,
                        BLOCK=256)
  np.testing.assert_allclose(np.asarray(out), 2 * x + acc, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(acc_ref[...]), acc + x, rtol=1e-5)

  donated = jnp.asarray(x)
  pointer = donated.unsafe_buffer_pointer()
  step = jax.jit(lambda a: jmf.triton_call(a.size, a, kernel=tc.increment_size_first, out_type=jax.typeof(a),
                                           grid=4, BLOCK=256, input_output_aliases={1: 0}), donate_argnums=0)
  out = step(donated)
  assert donated.is_deleted() and out.unsafe_buffer_pointer() == pointer
  np.testing.assert_allclose(np.asarray(out), x + 1, rtol=1e-6)


@gpu
def test_tuples_pytrees_and_zeroing_run(rng, isolated_disk_cache):
  x, y = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
  z = rng.standard_normal(1000).astype(np.float16)
  out = jax.jit(lambda a, b, c: jmf.triton_call(a, (b, (c, 3.0)), a.size, kernel=tc.sum_tuple,
                                                out_type=jax.typeof(a), grid=4, BLOCK=256))(x, y, z)
  np.testing.assert_allclose(np.asarray(out), x + y + 3 * z.astype(np.float32), rtol=1e-3, atol=1e-3)
  both = jmf.triton_call(jnp.asarray(x), 1000, kernel=tc.two_outputs, grid=4, BLOCK=256,
                         out_type={"a": jax.typeof(x), "b": jax.typeof(x)})
  np.testing.assert_array_equal(np.asarray(both["a"]), x)
  np.testing.assert_array_equal(np.asarray(both["b"]), -x)
  rows = rng.standard_normal((64, 1000)).astype(np.float32)
  for zeroed in ((0,), lambda meta: (0,)):  # outputs are poisoned first: only the zeroing makes the sums right
    np.testing.assert_allclose(np.asarray(jax.jit(lambda a: _row_sums(a, zeroed, BLOCK=128))(rows)),
                               rows.sum(axis=1), rtol=1e-4, atol=1e-3)
  inplace = jax.jit(lambda a, b: jmf.triton_call(a, b, a.size, kernel=tc.add_into, out_type=jax.typeof(b), grid=4,
                                                 BLOCK=256, input_output_aliases={1: 0}, zeroed_outputs=(0,)))
  np.testing.assert_allclose(np.asarray(inplace(x, y)), x, rtol=1e-6)


@gpu
def test_autotuned_and_heuristic_kernels_run(rng, isolated_disk_cache):
  for n in (4096, 5000):
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    for kernel in (tc.add_tuned, tc.add_even):
      out = jax.jit(lambda a, b: jmf.triton_call(a, b, a.size, kernel=kernel, out_type=jax.typeof(a),
                                                 grid=lambda m: triton.cdiv(a.size, m["BLOCK"])))(x, y)
      np.testing.assert_allclose(np.asarray(out), x + y, rtol=1e-6)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8])
def test_tensor_descriptors_run(rng, isolated_disk_cache, dtype):
  a = (rng.standard_normal((32, 64)) * 50).astype(dtype)
  for options in ({}, {"padding": "nan"}, {"round_f32_to_tf32": True}):
    if (options.get("padding") and dtype == np.int8) or (options.get("round_f32_to_tf32") and dtype != np.float32):
      continue
    desc = jt.TensorDescriptor.from_array(jnp.asarray(a), block_shape=[32, 64], **options)
    out = np.asarray(jmf.triton_call(desc, kernel=tc.copy_tile, out_type=jax.typeof(a), grid=1, M=32, N=64))
    expected = a
    if options.get("round_f32_to_tf32"):
      expected = np.asarray(jax.lax.reduce_precision(jnp.asarray(a), exponent_bits=8, mantissa_bits=10))
    np.testing.assert_array_equal(out, expected)
  device = jmf.triton_call(jnp.asarray(a), kernel=tc.copy_through_device_descriptors, out_type=jax.typeof(a),
                           grid=1, M=32, N=64)
  np.testing.assert_array_equal(np.asarray(device), a)


@gpu
def test_vmap_grad_and_clusters_run(rng, isolated_disk_cache):
  xs, ys = (rng.standard_normal((3, 500)).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(add))(xs, ys)), xs + ys, rtol=1e-6)
  add_d = jmf.differentiable(add, bwd=lambda g: (add(g, jnp.zeros_like(g)), g))
  gx, gy = jax.grad(lambda a, b: (add_d(a, b) * a).sum(), argnums=(0, 1))(xs[0], ys[0])
  np.testing.assert_allclose(np.asarray(gx), 2 * xs[0] + ys[0], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(gy), xs[0], rtol=1e-5)
  x = rng.standard_normal(1024).astype(np.float32)
  out = jmf.triton_call(jnp.asarray(x), kernel=tc.copy4, out_type=jax.typeof(x), grid=(256,), num_ctas=2)
  np.testing.assert_array_equal(np.asarray(out), x)


@gpu
def test_kernels_write_through_descriptors_of_aliased_arrays_and_refs(rng, isolated_disk_cache):
  x, y = (rng.standard_normal((100, 136)).astype(np.float32) for _ in range(2))
  for how in ("aliased", "ref"):
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: written_through(a, b, how))(x, y)), x + y)
  out = jmf.triton_call(n=1000, kernel=ts.fill_warps, out_type=jax.ShapeDtypeStruct((1000,), jnp.int32),
                        grid=lambda meta: jmf.cdiv(1000, meta["BLOCK"]), BLOCK=128, num_warps=8)
  np.testing.assert_array_equal(np.asarray(out), np.full(1000, 8))
