"""One launch record from options to attributes: what keeps "adding a launch option touches the options, the
contract, the C++ reader and the docs" true (CONTRIBUTING.md). No GPU needed."""

import dataclasses
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import api
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call.launch_options import LaunchOptions
from jax_mosaic_ffi.cuda.launch_options import CudaOptions
from jax_mosaic_ffi.cute.launch_options import CuteOptions
from jax_mosaic_ffi.triton.launch_options import TritonLaunchOptions
from jax_mosaic_ffi.call.launch_spec import LaunchSpec
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p

import kernel_sources

X = jax.ShapeDtypeStruct((1024,), jnp.float32)


def spec_of(call, *avals) -> LaunchSpec:
  (eqn,) = [e for e in jax.make_jaxpr(call)(*avals).jaxpr.eqns if e.primitive is mosaic_kernel_p]
  return eqn.params["spec"]


def test_the_identity_is_every_launched_field(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  call = lambda grid: jmf.mosaic_kernel(kernel, X, grid=grid, block=256, scalars=(np.int32(1024),))  # noqa: E731
  spec = spec_of(call(4), X, X)
  launched = {f.name for f in dataclasses.fields(LaunchSpec) if f.metadata.get("launched", True)}
  assert set(spec.identity()) == launched
  # What is not launched: where the call is, what runs off CUDA, what messages name.
  assert {f.name for f in dataclasses.fields(LaunchSpec)} - launched == {
      "call_site", "tensor_map_decls", "scalar_dtypes", "fallback", "derivative_rule"}
  assert spec.identity()["scalar_data"] == spec.scalar_data.hex()
  assert spec_of(call(8), X, X).identity() != spec.identity()
  # The same launch from another line of code is the same launch.
  assert spec_of(call(4), X, X).identity() == spec.identity()


def test_side_effects_and_a_cost_estimate_are_part_of_the_lowered_call(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  call = jmf.mosaic_kernel(kernel, X, grid=4, block=256, scalars=(np.int32(1024),), has_side_effect=True,
                           cost_estimate={"flops": 1024, "bytes_accessed": 12288})
  spec = spec_of(call, X, X)
  assert spec.identity()["has_side_effect"] is True
  assert json.loads(spec.attributes(kernel)["cost_estimate_json"]) == {"flops": 1024, "bytes_accessed": 12288}
  text = jax.jit(call).trace(X, X).lower(lowering_platforms=("cuda",)).as_text()
  assert "has_side_effect = true" in text and "cost_estimate_json" in text
  for absurd in (float("nan"), -1, True, 10**400, np.int64(-3), "1"):  # 10**400: past float's range
    with pytest.raises(jmf.LaunchError, match="cost_estimate must map names"):
      jmf.mosaic_kernel(kernel, X, grid=4, block=256, cost_estimate={"flops": absurd})


def front_end_keywords() -> set[str]:
  """Every keyword of mosaic_kernel that some front end takes beyond the shared ones (its options object's)."""
  return {field.name for front_end in api.FRONT_ENDS for field in dataclasses.fields(front_end.options)}


def test_the_shared_options_are_what_every_front_end_takes():
  shared = {field.name for field in dataclasses.fields(LaunchOptions)}
  assert shared == {"input_output_aliases", "fallback", "sharding", "zero_outputs", "has_side_effect",
                    "cost_estimate"}
  # mosaic_kernel's own keywords are the shared ones, the autotuning ones and the front ends' (**options), of which
  # the three most calls give (grid, block, scalars) are named in the signature for editors.
  parameters = inspect.signature(jmf.mosaic_kernel).parameters
  assert set(parameters) - {"kernel", "out_shape", "options"} == shared | {"configs", "autotune_key",
                                                                            "autotune_default", "autotune_inputs",
                                                                            "grid", "block", "scalars"}
  assert {f.name for f in dataclasses.fields(CudaOptions)} == front_end_keywords()  # the widest front end
  with pytest.raises(TypeError, match="unexpected keyword argument 'blok'"):
    jmf.mosaic_kernel(jmf.cuda_kernel(kernel_sources.ADD, "add"), X, grid=1, blok=128)


def test_a_triton_kernel_refuses_each_option_it_does_not_take(isolated_disk_cache):
  import triton_required
  triton_required.import_triton()
  import triton_sources as ts
  kernel = jmf.triton_kernel(ts.add, constexprs={"BLOCK": 1024})
  given = {"block": 128, "cluster": 2, "smem_bytes": 16, "collective": jmf.Collective("x"),
           "batch_grid_axis": "x", "scratch_bytes": 8, "zero_scratch": True}
  taken = {"grid", "scalars", "uses_pdl", "param_order"}
  assert {f.name for f in dataclasses.fields(TritonLaunchOptions)} == taken
  for name in front_end_keywords() - taken:
    # An option without a value here (a new one) is refused all the same, by its name.
    with pytest.raises(jmf.LaunchError, match=f"a Triton kernel takes no {name}"):
      jmf.mosaic_kernel(kernel, X, grid=1, **{name: given.get(name, object())})


def test_a_cute_launcher_refuses_each_option_it_does_not_take(isolated_disk_cache):
  import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)
  import cute_kernels
  kernel = jmf.cute_kernel(cute_kernels.add_one)
  given = {"grid": 4, "block": 128, "cluster": 2, "smem_bytes": 16, "uses_pdl": True, "scalars": (np.int32(1),),
           "param_order": ("in0", "out0"), "collective": jmf.Collective("x"), "batch_grid_axis": "x",
           "scratch_bytes": 8, "zero_scratch": True}
  assert not dataclasses.fields(CuteOptions)  # it takes the shared options alone
  for name in front_end_keywords():
    # An option without a value here (a new one) is refused all the same, by its name.
    with pytest.raises(jmf.LaunchError, match=f"a CuTe DSL launcher takes no {name}"):
      jmf.mosaic_kernel(kernel, X, **{name: given.get(name, object())})
  # What it takes reaches the launch it resolves: its host function's arguments are in the identity, and the
  # shared options every front end takes are its too.
  spec = spec_of(jmf.mosaic_kernel(kernel, X, zero_outputs=True, has_side_effect=True,
                                   cost_estimate={"flops": 1024}), X)
  assert spec.extension.host_args and spec.identity()["extension"]["host_args"] == spec.extension.host_args
  assert spec.zero_outputs == (0,) and spec.has_side_effect and spec.cost_estimate == '{"flops": 1024}'
  assert spec.target == jmf.contract.CUTE_TARGET and spec.param_order == ()


def test_each_front_end_is_one_line_of_the_table_and_names_its_image_kinds(isolated_disk_cache):
  by_name = {front_end.name: front_end for front_end in api.FRONT_ENDS}
  assert len(by_name) == len(api.FRONT_ENDS)
  cuda = api.front_end_of(jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90"))
  assert cuda is by_name["a CUDA kernel"]
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  assert {image.kind for image in kernel.images} <= set(cuda.image_kinds)
  with pytest.raises(TypeError, match=r"needs a kernel from cuda_kernel, ptx_kernel, cubin_kernel, triton_kernel, "
                                      r"cute_kernel, gluon_kernel, cutile_kernel, got a builtins.str"):
    api.front_end_of("add")


def test_one_normaliser_for_a_value_or_a_callable():
  avals = (X,)
  assert launch_values.evaluate(7, "grid", avals, "here") == 7
  assert launch_values.evaluate(lambda x: x.size, "grid", avals, "here") == 1024
  meta = {"BLOCK": 256}
  assert launch_values.evaluate(lambda meta: meta["BLOCK"], "grid", avals, "here", meta=meta) == 256
  assert launch_values.evaluate(lambda meta, x: x.size // meta["BLOCK"], "grid", avals, "here", meta=meta) == 4
  with pytest.raises(jmf.LaunchError, match=r"here: grid, a callable of \(meta, \*input avals\) .*KeyError"):
    launch_values.evaluate(lambda meta, x: meta["BM"], "grid", avals, "here", meta=meta)
  with pytest.raises(jmf.LaunchError, match="here: grid, a callable of the input avals, raised ZeroDivisionError"):
    launch_values.evaluate(lambda x: 1 // 0, "grid", avals, "here")


def test_a_config_meta_reaches_a_cuda_kernels_callables(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  tuned = jmf.mosaic_kernel(kernel, X, grid=lambda meta, x, y: x.size // meta["B"], block=lambda meta: meta["B"],
                            scalars=(np.int32(1024),), configs=[{"B": 128}, {"B": 256}])
  spec = spec_of(tuned.factory({"B": 256}), X, X)
  assert spec.grid == (4, 1, 1) and spec.block == (256, 1, 1)


def test_a_kernel_of_no_front_end_is_refused_by_name(isolated_disk_cache):
  """The CUDA front end launches its own CudaKernel, not every Kernel: another wing's compiled kernel (or one made
  by hand) used to reach the CUDA launcher, which asked it for a grid."""
  from jax_mosaic_ffi.toolchain.kernel import Kernel
  cuda = jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert isinstance(cuda, jmf.CudaKernel) and repr(cuda).startswith("CudaKernel('add'")
  by_hand = Kernel(cuda.name, cuda.compiled)
  with pytest.raises(TypeError, match=r"a jax_mosaic_ffi.toolchain.kernel.Kernel is a compiled kernel of none of "
                                      r"them.*FRONT_ENDS"):
    jmf.mosaic_kernel(by_hand, jax.ShapeDtypeStruct((8,), jnp.float32), grid=1, block=8)


def test_a_module_with_an_image_kind_its_front_end_does_not_declare_is_refused(isolated_disk_cache):
  from jax_mosaic_ffi.base.module_format import ImageKind
  from jax_mosaic_ffi.call import front_end
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  front_end.check_images(kernel, kernel.parsed, "here")  # CUBIN and PTX: the CUDA front end's own
  cute_like = dataclasses.replace(kernel.parsed, images=(dataclasses.replace(kernel.images[0], kind=ImageKind.CUTE),))
  with pytest.raises(jmf.LaunchError, match=r"here: a CUDA kernel's module holds CUTE images, which its front end "
                                            r"does not declare"):
    front_end.check_images(kernel, cute_like, "here")
