"""Triton kernels under @triton.autotune and @triton.heuristics, as people write them: compile and lower (any
machine), refusals by name, and results on the GPU."""

import importlib.util
import os
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from triton_required import import_triton

triton = import_triton()

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.transforms.autotune import AutotuneSkipped

import triton_decorated_sources as ds
from hlo_inspect import custom_calls, f32, lower

gpu = pytest.mark.gpu


def ints(*values):
  return tuple(np.int32(v) for v in values)


def ptx_of(cc) -> str:
  """The PTX of the kernel a lowered custom call launches (from the compile cache, by its hash)."""
  (kernel,) = {k for k in (found.value for found in stack.MEMORY.entries("compile"))
               if isinstance(k, jmf.TritonKernel) and k.hash == cc["config"]["kernel_hash"]}
  return next(image.data.decode() for image in kernel.images if image.kind == ImageKind.PTX)


def softmax_call(seen=None):
  def grid(meta, x):
    if seen is not None:
      seen.append(dict(meta))
    return x.shape[0]
  return jmf.mosaic_kernel(jmf.triton_kernel(ds.softmax_rows), lambda x: x, grid=grid,
                           scalars=lambda meta, x: ints(x.shape[1], x.shape[1], x.shape[1]))


def matmul_scalars(meta, a, b):
  (m, k), n = a.shape, b.shape[1]
  return ints(m, n, k, k, 1, n, 1, n, 1)   # M, N, K, then row-major strides of A, B, C


def grouped_matmul_call():
  return jmf.mosaic_kernel(
      jmf.triton_kernel(ds.grouped_matmul), lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
      grid=lambda meta, a, b: jmf.cdiv(a.shape[0], meta["BLOCK_M"]) * jmf.cdiv(b.shape[1], meta["BLOCK_N"]),
      scalars=matmul_scalars)


def splitk_call():
  return jmf.mosaic_kernel(
      jmf.triton_kernel(ds.splitk_matmul), lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32),
      grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], meta["BLOCK_M"]), jmf.cdiv(b.shape[1], meta["BLOCK_N"]),
                               meta["SPLIT_K"]),
      scalars=matmul_scalars)


def scaled_copy_call(seen=None):
  def grid(meta, x):
    if seen is not None:
      seen.append(dict(meta))
    return jmf.cdiv(x.size, meta["BLOCK"])
  return jmf.mosaic_kernel(jmf.triton_kernel(ds.scaled_copy), lambda x: x, grid=grid,
                           scalars=lambda meta, x: (np.int32(x.size), np.float32(2.5)))


def copy_call(kernel, seen=None, **options):
  def grid(meta, x):
    if seen is not None:
      seen.append(dict(meta))
    return jmf.cdiv(x.size, meta["BLOCK"])
  return jmf.mosaic_kernel(kernel, lambda x: x, grid=grid, scalars=lambda meta, x: (np.int32(x.size),), **options)


def in_place_call():
  return jmf.mosaic_kernel(jmf.triton_kernel(ds.add_in_place), lambda x, y: x,
                           grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                           scalars=lambda meta, x, y: (np.int32(x.size),), input_output_aliases={0: 0},
                           param_order=("in0", "in1", "scalar0"))


def untuned(fn, *avals):
  """Lowers where there is no GPU: the autotuner warns and takes the first config. Where there is one it times
  the configs instead, which the GPU tests below check."""
  if gpu_info.has_gpu():
    pytest.skip("checks the config lowered where nothing is timed; on a GPU the configs are timed (GPU tests)")
  with pytest.warns(AutotuneSkipped):
    return lower(fn, *avals)


def last_decision():
  return jmf.autotune_report()[-1]


# ---------------------------------------------------------------- any machine

def test_heuristics_run_at_trace_time_in_order_and_reach_the_grid_and_the_launch(isolated_disk_cache):
  seen = []
  call = softmax_call(seen)
  with warnings.catch_warnings():
    warnings.simplefilter("error", AutotuneSkipped)  # one config: nothing to time
    (wide,) = custom_calls(lower(call, jax.ShapeDtypeStruct((64, 3000), jnp.float16)))
    (narrow,) = custom_calls(lower(call, f32(8, 100)))
  # BLOCK from n_cols; num_warps from BLOCK (the heuristic before it); UPCAST from the dtype's itemsize.
  assert seen == [{"BLOCK": 4096, "UPCAST": True, "num_warps": 8, "num_stages": 3, "num_ctas": 1},
                  {"BLOCK": 128, "UPCAST": False, "num_warps": 4, "num_stages": 3, "num_ctas": 1}]
  assert wide["config"]["block"] == [256, 1, 1] and narrow["config"]["block"] == [128, 1, 1]
  assert wide["config"]["grid"] == [64, 1, 1] and narrow["config"]["grid"] == [8, 1, 1]
  assert wide["config"]["kernel_hash"] != narrow["config"]["kernel_hash"]


def test_autotune_alone_lowers_its_first_config_where_nothing_is_timed(isolated_disk_cache):
  a, b = jax.ShapeDtypeStruct((300, 200), jnp.float16), jax.ShapeDtypeStruct((200, 130), jnp.float16)
  (cc,) = custom_calls(untuned(grouped_matmul_call(), a, b))
  assert cc["config"]["block"] == [256, 1, 1]            # num_warps=8 of the first triton.Config
  assert cc["config"]["grid"] == [3 * 2, 1, 1]           # cdiv(300, 128) * cdiv(130, 128)
  decision = last_decision()
  assert decision["name"] == "mosaic_kernel grouped_matmul @triton.autotune" and decision["source"] == "untuned"
  assert decision["config"] == {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8,
                                "num_stages": 3, "num_ctas": 1}


def test_heuristics_under_autotune_see_each_configs_values_and_reset_to_zero_zeroes_the_output(isolated_disk_cache):
  a = jax.ShapeDtypeStruct((200, 256), jnp.float16)
  b = jax.ShapeDtypeStruct((256, 96), jnp.float16)
  (cc,) = custom_calls(untuned(splitk_call(), a, b))
  assert last_decision()["config"]["EVEN_K"] is True     # 256 % (BLOCK_K 32 * SPLIT_K 4) == 0
  assert cc["config"]["grid"] == [7, 3, 4] and cc["config"]["zero_outputs"] == [0]
  odd = jax.ShapeDtypeStruct((200, 200), jnp.float16)
  (cc_odd,) = custom_calls(untuned(splitk_call(), odd, jax.ShapeDtypeStruct((200, 96), jnp.float16)))
  assert last_decision()["config"]["EVEN_K"] is False    # 200 % 128 != 0: another kernel
  assert cc_odd["config"]["kernel_hash"] != cc["config"]["kernel_hash"]


def test_heuristics_over_autotune_see_no_config_and_pruning_can_leave_one_config(isolated_disk_cache):
  seen = []
  call = scaled_copy_call(seen)
  with warnings.catch_warnings():
    warnings.simplefilter("error", AutotuneSkipped)  # 300 elements: one config survives the pruning, no timing
    (small,) = custom_calls(lower(call, f32(300)))
  assert seen[-1] == {"MASKED": True, "BLOCK": 128, "num_warps": 2, "num_stages": 3, "num_ctas": 1}
  assert small["config"]["grid"] == [3, 1, 1] and small["config"]["block"] == [64, 1, 1]
  (large,) = custom_calls(untuned(call, f32(4096)))      # all three survive: the first config, untimed
  assert seen[-1]["MASKED"] is False and seen[-1]["BLOCK"] == 128


def test_prune_configs_by_uses_tritons_calling_conventions(isolated_disk_cache):
  calls = {"prune": [], "model": []}

  def early_config_prune(configs, named_args, **kwargs):
    calls["prune"].append((configs, named_args, kwargs))
    return [c for c in configs if c.kwargs["BLOCK"] != 64]

  def perf_model(**kwargs):
    calls["model"].append(kwargs)
    return abs(kwargs["BLOCK"] - 256)   # 256 is "fastest": top_k=1 keeps it alone

  configs = [triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256}, num_warps=8),
             triton.Config({"BLOCK": 1024})]
  tuned = triton.autotune(configs=configs, key=["n"], prune_configs_by={
      "early_config_prune": early_config_prune, "perf_model": perf_model, "top_k": 1})(ds.copy)
  seen = []
  with warnings.catch_warnings():
    warnings.simplefilter("error", AutotuneSkipped)
    (cc,) = custom_calls(lower(copy_call(jmf.triton_kernel(tuned), seen), f32(1000)))
  assert seen == [{"BLOCK": 256, "num_warps": 8, "num_stages": 3, "num_ctas": 1}]
  assert cc["config"]["grid"] == [4, 1, 1] and cc["config"]["block"] == [256, 1, 1]
  ((got_configs, named, kwargs),) = calls["prune"]
  assert got_configs == configs and kwargs == {}
  assert sorted(named) == ["n", "out_ptr", "x_ptr"] and named["n"] == 1000 and type(named["n"]) is int
  x = named["x_ptr"]
  assert x.shape == (1000,) and x.dtype == "float32" and x.dtype == triton.language.float32 and x.dtype == np.float32
  assert x.dtype.itemsize == 4 and x.element_size() == 4 and x.numel() == 1000 and x.stride(0) == 1
  assert [m["BLOCK"] for m in calls["model"]] == [128, 256, 1024]
  assert all(m["x_ptr"] is x and m["n"] == 1000 and m["num_warps"] in (4, 8) for m in calls["model"])
  # A fraction keeps at least one: 0.25 of three configs left.
  tuned = triton.autotune(configs=configs, key=["n"], prune_configs_by={"perf_model": perf_model, "top_k": 0.25})(
      ds.copy)
  seen.clear()
  lower(copy_call(jmf.triton_kernel(tuned), seen), f32(1000))
  assert [m["BLOCK"] for m in seen] == [256]


def test_maxnreg_of_a_config_and_of_triton_kernel_reaches_the_ptx(isolated_disk_cache):
  limited = triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=4, maxnreg=40)], key=[])(ds.copy)
  (cc,) = custom_calls(lower(copy_call(jmf.triton_kernel(limited)), f32(1000)))
  assert ".maxnreg 40" in ptx_of(cc)
  (plain,) = custom_calls(lower(copy_call(jmf.triton_kernel(ds.copy, constexprs={"BLOCK": 256})), f32(1000)))
  assert ".maxnreg" not in ptx_of(plain)
  (direct,) = custom_calls(lower(copy_call(jmf.triton_kernel(ds.copy, constexprs={"BLOCK": 256}, maxnreg=48)),
                                 f32(1000)))
  assert ".maxnreg 48" in ptx_of(direct)
  configured = copy_call(jmf.triton_kernel(ds.copy), configs=[{"BLOCK": 256, "maxnreg": 56}, {"BLOCK": 128}])
  (tuned,) = custom_calls(untuned(configured, f32(1000)))   # mosaic_kernel(configs=...) passes it on too
  assert ".maxnreg 56" in ptx_of(tuned)
  with pytest.raises(ValueError, match=re.escape("triton_kernel 'copy': maxnreg must be a positive int, got 0")):
    jmf.triton_kernel(ds.copy, maxnreg=0)


def test_launch_options_are_bounded_before_triton_sees_them(isolated_disk_cache):
  for given, shown in (({"num_warps": 2**40}, "num_warps=1099511627776 is out of range: num_warps is a power of "
                                              "two from 1 to 32"),
                       ({"num_warps": 12}, "num_warps=12 is out of range"),
                       ({"num_stages": 10**6}, "num_stages=1000000 is out of range: num_stages is from 1 to 32"),
                       ({"num_ctas": 64}, "num_ctas=64 is out of range"),
                       ({"maxnreg": 4096}, "maxnreg=4096 is out of range: maxnreg is from 1 to 255")):
    with pytest.raises(jmf.LaunchError, match=re.escape(f"triton_kernel 'copy': {shown}")):
      jmf.triton_kernel(ds.copy, constexprs={"BLOCK": 256}, **given)
  # A heuristic sets them per call, after triton_kernel checked its own: the compile checks again, before Triton.
  absurd = triton.heuristics({"BLOCK": lambda args: 256, "num_warps": lambda args: 2**40})(ds.copy)
  before = jmf.kernel_cache_stats().compiles["triton"]
  with pytest.raises(jmf.LaunchError, match=re.escape("triton_kernel 'copy': num_warps=1099511627776 is out of")):
    lower(copy_call(jmf.triton_kernel(absurd)), f32(1000))
  assert jmf.kernel_cache_stats().compiles["triton"] == before
  x = f32(1000)
  with pytest.raises(jmf.LaunchError, match="num_warps=1099511627776 is out of range"):
    lower(lambda a: jmf.triton_call(a, kernel=ds.copy, out_type=a, n=a.size, grid=(4,), BLOCK=256,
                                    num_warps=2**40), x)


def test_restore_value_needs_an_aliased_buffer_and_lowers_in_place(isolated_disk_cache):
  (cc,) = custom_calls(untuned(in_place_call(), f32(1000), f32(1000)))
  assert cc["operands"] == 2 and cc["results"] == 1
  assert "output_operand_aliases" in str(cc["attributes"])
  not_in_place = jmf.mosaic_kernel(jmf.triton_kernel(ds.add_in_place), lambda x, y: x,
                                   grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                                   scalars=lambda meta, x, y: (np.int32(x.size),),
                                   param_order=("in0", "in1", "scalar0"))
  with pytest.raises(jmf.LaunchError, match=re.escape(
      "@triton.autotune(restore_value=...) names 'x_ptr', which is in0 here, not updated in place: make it an input "
      "aliased to an output (input_output_aliases) if the kernel writes it, else drop it from restore_value")):
    lower(not_in_place, f32(1000), f32(1000))


HOOK = lambda *args, **kwargs: None  # noqa: E731


@pytest.mark.parametrize("decorate, message", [
    (triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"], pre_hook=HOOK),
     "triton_kernel 'copy': @triton.autotune(pre_hook=...) is not supported: a hook runs Python on the GPU tensors "
     "before each launch, which a compiled XLA program cannot call. Use reset_to_zero=[...] for outputs the kernel "
     "accumulates into (the runtime zeroes them before every launch), or prepare the inputs with JAX before the call"),
    (triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"], post_hook=HOOK),
     "triton_kernel 'copy': @triton.autotune(post_hook=...) is not supported: a hook runs Python on the GPU tensors "
     "after each launch, which a compiled XLA program cannot call. restore_value=[...] needs no hook here (timing "
     "never writes the caller's arrays); post-process the outputs with JAX after the call"),
    (triton.autotune(configs=[triton.Config({"BLOCK": 128}, pre_hook=HOOK)], key=["n"]),
     "triton_kernel 'copy': triton.Config(pre_hook=...) is not supported: a hook runs Python on the GPU tensors "
     "before each launch, which a compiled XLA program cannot call. For outputs the kernel accumulates into use "
     "@triton.autotune(reset_to_zero=[...]) (the runtime zeroes them before every launch); a hook that sets a tensor "
     "descriptor's block shape becomes a block shape computed from the config's meta; anything else, compute with "
     "JAX before the call"),
    (triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"], do_bench=HOOK),
     "triton_kernel 'copy': @triton.autotune(do_bench=...) is not supported: jax_mosaic_ffi times each config's "
     "compiled XLA executable itself (warm-up, then the median of rounds of back-to-back calls on the default "
     "device); a benchmarking function times Python launches on another stream. Drop do_bench"),
    (triton.autotune(configs=[triton.Config({"BLOCK": 128}, ir_override="copy.ptx")], key=["n"]),
     "triton_kernel 'copy': triton.Config(ir_override=...) is not supported: the kernel is compiled from its Python "
     "source; drop it"),
    (triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["m"]),
     "triton_kernel 'copy': @triton.autotune(key=...) names 'm', which is not a parameter of the kernel (x_ptr, "
     "out_ptr, n, BLOCK)"),
    (triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"], reset_to_zero=["out"]),
     "triton_kernel 'copy': @triton.autotune(reset_to_zero=...) names 'out', which is not a parameter of the kernel "
     "(x_ptr, out_ptr, n, BLOCK)"),
    (triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"], reset_to_zero=["BLOCK"]),
     "triton_kernel 'copy': @triton.autotune(reset_to_zero=...) names 'BLOCK', a tl.constexpr parameter; it takes "
     "the pointers of buffers the kernel writes"),
    (triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"], restore_value=["y_ptr"]),
     "triton_kernel 'copy': @triton.autotune(restore_value=...) names 'y_ptr', which is not a parameter of the kernel "
     "(x_ptr, out_ptr, n, BLOCK)"),
    (triton.autotune(configs=[triton.Config({"BLOCKS": 128})], key=["n"]),
     "triton_kernel 'copy': a @triton.autotune config sets 'BLOCKS', which is not one of the kernel's tl.constexpr "
     "parameters (BLOCK)"),
    (triton.heuristics({"n": lambda args: 1}),
     "triton_kernel 'copy': @triton.heuristics computes 'n', which is not one of the kernel's tl.constexpr "
     "parameters nor a launch option (num_warps, num_stages, num_ctas, maxnreg)"),
    (lambda fn: triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"])(
        triton.autotune(configs=[triton.Config({"BLOCK": 256})], key=["n"])(fn)),
     "triton_kernel 'copy': more than one @triton.autotune on a kernel is not supported: merge their configs into "
     "one"),
    (lambda fn: triton.heuristics({"BLOCK": lambda args: 128})(
        triton.autotune(configs=[triton.Config({"BLOCK": 256})], key=["n"])(fn)),
     "triton_kernel 'copy': @triton.heuristics above @triton.autotune computes 'BLOCK', which the autotune configs "
     "set too; put the heuristic below @triton.autotune (it then sees each config's values) or drop it"),
])
def test_what_cannot_work_is_refused_by_name(decorate, message):
  try:
    decorated = decorate(ds.copy)
  except ValueError as e:
    # Newer Triton (3.9) checks the names in key=, reset_to_zero= and restore_value= itself, when decorating: the
    # user sees its message, which names the argument too. Only those cases may stop here.
    named = re.search(r"@triton\.autotune\((key|reset_to_zero|restore_value)=\.\.\.\) names '(\w+)', which is not",
                      message)
    assert named is not None, (message, e)
    assert str(e).startswith(f"{named.group(1)} contains names that are not kernel arguments: {named.group(2)}."), e
    return
  with pytest.raises(ValueError, match=re.escape(message) + "$"):
    jmf.triton_kernel(decorated)


def test_tritons_benchmark_settings_are_accepted_and_our_timing_used(isolated_disk_cache):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # Triton's own, at decoration
    legacy = triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"], warmup=5, rep=20,
                             use_cuda_graph=True, cache_results=True)(ds.copy)
  (cc,) = custom_calls(lower(copy_call(jmf.triton_kernel(legacy)), f32(1000)))
  assert cc["config"]["grid"] == [8, 1, 1]


def test_mistakes_in_decorated_calls_are_named(isolated_disk_cache):
  with pytest.raises(ValueError, match=re.escape(
      "triton_kernel 'splitk_matmul': constexprs= sets 'SPLIT_K', which a @triton.autotune config sets too; drop it "
      "from constexprs=")):
    jmf.triton_kernel(ds.splitk_matmul, constexprs={"SPLIT_K": 1})
  with pytest.raises(ValueError, match=re.escape(
      "triton_kernel 'softmax_rows': constexprs= sets 'BLOCK', which @triton.heuristics computes; drop it from "
      "constexprs=")):
    jmf.triton_kernel(ds.softmax_rows, constexprs={"BLOCK": 1024})
  with pytest.raises(ValueError, match="signature= compiles one kernel now, but its @triton.autotune"):
    jmf.triton_kernel(ds.softmax_rows, signature=["*fp32", "*fp32", "i32", "i32", "i32"])
  with pytest.raises(ValueError, match=re.escape(
      "mosaic_kernel 'grouped_matmul': the kernel's @triton.autotune/@triton.heuristics choose its configs; configs=, "
      "autotune_key=, autotune_default= and autotune_inputs= are for an undecorated kernel")):
    jmf.mosaic_kernel(jmf.triton_kernel(ds.grouped_matmul), f32(4), grid=1, configs=[{"BLOCK_M": 64}])
  failing = triton.heuristics({"BLOCK": lambda args: args["rows"] * 2})(ds.copy)
  with pytest.raises(jmf.LaunchError, match=r"mosaic_kernel 'copy' at test_triton_decorators.py:\d+ \(.*\): "
                     + re.escape("@triton.heuristics value for 'BLOCK' raised KeyError: 'rows'")):
    lower(copy_call(jmf.triton_kernel(failing)), f32(1000))
  zero_an_input = triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"], reset_to_zero=["x_ptr"])(
      ds.copy)
  with pytest.raises(jmf.LaunchError, match=re.escape(
      "@triton.autotune(reset_to_zero=...) names 'x_ptr', which is in0 here, not an output; the runtime zeroes outputs "
      "the kernel accumulates into before every launch: make it an output of its own (not aliased), or drop it from "
      "reset_to_zero")):
    lower(copy_call(jmf.triton_kernel(zero_an_input)), f32(1000))
  empty = triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"],
                          prune_configs_by={"early_config_prune": lambda configs, named, **kw: []})(ds.copy)
  with pytest.raises(jmf.LaunchError, match=re.escape(
      "prune_configs_by['early_config_prune'] left no config; it must return at least one triton.Config")):
    lower(copy_call(jmf.triton_kernel(empty)), f32(1000))
  with pytest.raises(jmf.LaunchError, match=re.escape(
      "a decorated kernel's scalars are its arguments, computed before its configs and heuristics")):
    lower(jmf.mosaic_kernel(jmf.triton_kernel(ds.scaled_copy), lambda x: x, grid=1,
                            scalars=lambda meta, x: (np.int32(x.size // meta["BLOCK"]), np.float32(1))), f32(1000))
  # out_shape is evaluated as an undecorated kernel's is (launch_values.evaluate): its error names the call.
  with pytest.raises(jmf.LaunchError, match=r"mosaic_kernel 'softmax_rows' at test_triton_decorators.py:\d+ \(.*\): "
                     + re.escape("out_shape, a callable of the input avals, raised IndexError")):
    lower(jmf.mosaic_kernel(jmf.triton_kernel(ds.softmax_rows), lambda x: x.shape[5], grid=1,
                            scalars=lambda meta, x: ints(4, 4, 4)), f32(4, 4))


def docs_example(tmp_path, run: bool):
  """The decorated-kernel example of docs/guides/triton_kernels.md as a module (@triton.jit reads its source from a
  file); without a GPU its last line, which runs the call, is left out."""
  guide = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "guides",
                       "triton_kernels.md")
  section = open(guide).read().split("\n## Decorated Triton kernels\n")[1]
  block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  assert block.rstrip().splitlines()[-1].startswith("s = jax.jit(total)(")
  if not run:
    block = "\n".join(block.rstrip().splitlines()[:-1])
  path = tmp_path / "docs_decorated.py"
  path.write_text("import jax, jax.numpy as jnp, numpy as np\nimport jax_mosaic_ffi as jmf\n" + block + "\n")
  spec = importlib.util.spec_from_file_location("docs_decorated", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_docs_example_compiles_and_lowers(tmp_path, isolated_disk_cache):
  example = docs_example(tmp_path, run=False)
  (cc,) = custom_calls(untuned(example.total, f32(5000)))
  assert cc["config"]["zero_outputs"] == [0] and cc["config"]["grid"] == [20, 1, 1]   # the first config: 256
  assert last_decision()["config"]["EVEN"] is False


# ---------------------------------------------------------------- GPU

def decision(kernel: str, *arrays):
  """This process's last autotuning decision for the decorated kernel and these inputs, or None."""
  shapes = [f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in arrays]
  found = [d for d in jmf.autotune_report() if d["name"] == f"mosaic_kernel {kernel} @triton.autotune"
           and d["shapes"] == shapes]
  return found[-1] if found else None


def timed(entry, configs: int) -> bool:
  return (entry is not None and entry["source"] == "tuned" and len(entry["table"]) == configs
          and all(row["us"] is not None for row in entry["table"]))


@gpu
def test_tutorial_grouped_matmul_autotuned_with_strides_matches_numpy(rng, isolated_disk_cache):
  call = jax.jit(grouped_matmul_call())
  for m, k, n in ((300, 200, 130), (512, 384, 256)):
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = call(a, b)
    assert timed(decision("grouped_matmul", a, b), 3), decision("grouped_matmul", a, b)
    np.testing.assert_allclose(np.asarray(c, np.float32), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=2e-2, atol=1e-1)


@gpu
def test_heuristics_softmax_matches_numpy(rng, isolated_disk_cache):
  call = jax.jit(softmax_call())
  for dtype, shape, tol in ((np.float32, (37, 100), 1e-5), (np.float16, (64, 3000), 2e-3)):
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    wide = x.astype(np.float64)
    want = np.exp(wide - wide.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(np.asarray(call(x), np.float64), want, rtol=tol, atol=tol)


@gpu
def test_reset_to_zero_makes_the_atomic_split_k_matmul_right(rng, isolated_disk_cache):
  call = jax.jit(splitk_call())
  for m, k, n in ((200, 256, 96), (130, 200, 70)):   # EVEN_K true for two configs, then for none
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    want = a.astype(np.float32) @ b.astype(np.float32)
    for _ in range(2):  # outputs are poisoned (NaN) before each launch: only the zeroing makes the sums right
      np.testing.assert_allclose(np.asarray(call(a, b)), want, rtol=1e-2, atol=5e-2)
    assert timed(decision("splitk_matmul", a, b), 3)


@gpu
def test_heuristics_over_autotune_with_pruning_match_numpy(rng, isolated_disk_cache):
  call = jax.jit(scaled_copy_call())
  for n, configs in ((300, 1), (4096, 3), (5000, 3)):   # masked, one config left; unmasked; masked
    x = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(np.asarray(call(x)), np.float32(2.5) * x, rtol=1e-6)
    assert decision("scaled_copy", x) is None if configs == 1 else timed(decision("scaled_copy", x), configs)


@gpu
def test_restore_value_timing_never_writes_the_callers_arrays(rng, isolated_disk_cache):
  x = rng.standard_normal(5000).astype(np.float32)
  y = rng.standard_normal(5000).astype(np.float32)
  kept = jnp.asarray(x)
  out = jax.jit(in_place_call())(kept, y)   # tuned here: three configs timed, each many times
  assert timed(decision("add_in_place", x, y), 3)
  np.testing.assert_array_equal(np.asarray(out), x + y)       # y added once
  np.testing.assert_array_equal(np.asarray(kept), x)           # not donated: the caller's x is untouched
  donated = jax.jit(in_place_call(), donate_argnums=0)(jnp.asarray(x), y)
  np.testing.assert_array_equal(np.asarray(donated), x + y)


@gpu
def test_the_docs_example_runs(tmp_path, isolated_disk_cache):
  example = docs_example(tmp_path, run=True)
  np.testing.assert_array_equal(np.asarray(example.s), [5000.0])
  assert timed(decision("sum_all", np.ones(5000, np.float32)), 2)
