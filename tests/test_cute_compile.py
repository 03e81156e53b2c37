"""CuTe DSL kernels on a machine without a GPU: compiled once ever, lowered to the CuTe target, exported.

The DSL compiles for an explicit arch without a GPU (sm_90a here), so everything up to the launch runs in CI.
"""

import abc
import dataclasses
import enum
import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)
import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.cute.compiler import keys as cute_keys

import cute_kernels as K
import cute_objects
import fresh_process
from hlo_inspect import custom_calls, lower

from cutlass.jax import TensorSpec  # noqa: E402  (after the guard)


def one_call(fn, *avals):
  (cc,) = custom_calls(lower(fn, *avals))
  return cc


def test_cute_call_lowers_to_the_cute_target_with_its_object(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  before = jmf.kernel_cache_stats().compiles["cute"]
  cc = one_call(jmf.cute_call(K.add_one, output_shape_dtype=x), x)
  assert cc["target"] == contract.CUTE_TARGET == "jax_mosaic_ffi_cute_v1"
  config = cc["config"]
  assert config["kernel_hash"] == hashlib.sha256(config["module"]).digest()
  parsed = module_format.parse(config["module"])
  assert parsed.host_code and parsed.symbol == "jmf_cute"
  (image,) = parsed.images
  assert image.kind == module_format.ImageKind.CUTE and image.arch.sm == "sm_90a"
  assert image.data[:4] == b"\x7fELF"
  assert image.dsl_version == __import__("importlib.metadata").metadata.version("nvidia-cutlass-dsl")
  # Per buffer: its address, then each dimension (dynamic tensors, as cutlass_call's default).
  assert config["host_args"] == [1, 0, 0, 2, 0, 0, 1, 1, 0, 2, 1, 0]
  assert image.host_arg_kinds == (1, 2, 1, 2)
  assert config["grid"] == config["block"] == config["cluster"] == [1, 1, 1] and config["param_order"] == []
  assert config["kernel_name"] == b"add_one" and config["call_site"].startswith(b"test_cute_compile.py:")
  assert jmf.kernel_cache_stats().compiles["cute"] - before == 1


def test_static_tensors_take_only_their_address(isolated_disk_cache):
  a = jax.ShapeDtypeStruct((8, 32), jnp.float32)
  cc = one_call(jmf.cute_call(K.axpy, output_shape_dtype=a, use_static_tensors=True, alpha=3.0), a, a)
  assert cc["config"]["host_args"] == [1, 0, 0, 1, 1, 0, 1, 2, 0]


def test_allow_cuda_graph_false_uses_the_target_outside_graphs(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  cc = one_call(jmf.cute_call(K.add_one, output_shape_dtype=x, allow_cuda_graph=False), x)
  assert cc["target"] == contract.CUTE_NOGRAPH_TARGET
  assert contract.CUTE_NOGRAPH_TARGET not in core.command_buffer_targets()
  assert contract.CUTE_TARGET in core.command_buffer_targets()


def test_compiled_once_per_specialization(isolated_disk_cache):
  a = jax.ShapeDtypeStruct((8, 32), jnp.float32)
  before = jmf.kernel_cache_stats().compiles["cute"]
  for alpha in (2.0, 2.0, 5.0):
    one_call(jmf.cute_call(K.axpy, output_shape_dtype=a, alpha=alpha), a, a)
  assert jmf.kernel_cache_stats().compiles["cute"] - before == 2  # alpha 2.0 once, 5.0 once


WARM = '''
  import json, time
  import jax, jax.numpy as jnp
  import jax_mosaic_ffi as jmf
  import cute_kernels as K
  a = jax.ShapeDtypeStruct((64, 128), jnp.float32)
  start = time.perf_counter()
  f = jmf.cute_call(K.axpy, output_shape_dtype=a, alpha=1.5)
  text = jax.jit(f).trace(a, a).lower(lowering_platforms=("cuda",)).as_text()
  stats = jmf.kernel_cache_stats()
  print(json.dumps({"compiles": stats.compiles["cute"], "disk_hits": stats.disk_hits,
                   "seconds": time.perf_counter() - start, "lowered": "jax_mosaic_ffi_cute_v1" in text}))
'''


def test_a_second_process_compiles_nothing(tmp_path):
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}
  cold = fresh_process.run(WARM, env=env).result
  warm = fresh_process.run(WARM, env=env).result
  assert cold["compiles"] == 1 and cold["lowered"]
  assert warm["compiles"] == 0 and warm["disk_hits"] == 1 and warm["lowered"]


def test_fingerprint_follows_code_closures_and_constants():
  def make(k):
    return lambda stream, x, y: K.add_one(stream, x, y) if k else None
  assert cute_keys.fingerprint(make(1)) == cute_keys.fingerprint(make(1))
  assert cute_keys.fingerprint(make(1)) != cute_keys.fingerprint(make(2))
  assert cute_keys.fingerprint(K.add_one) != cute_keys.fingerprint(K.axpy)
  assert cute_keys.fingerprint(K.add_one) is not None

  class Opaque:
    __slots__ = ()
  assert cute_keys.fingerprint(lambda s: Opaque()) is not None  # a class is read by its code
  assert cute_keys.fingerprint(object()) is None  # nothing to read: keyed by a trace instead


def test_fingerprint_reads_through_functools_caches():
  # Libraries of kernels (quack's Softmax.compile, under its jit_cache and lru_cache) cache functions that a
  # launcher reaches: the cache's code is the wrapped function's, whatever the cache holds.
  def make(k):
    @functools.lru_cache
    def tile(n):
      return n * k

    @functools.cache
    def threads(n):
      return tile(n) + k
    return lambda stream, x, y: K.add_one(stream, x, y) if threads(k) else None

  assert cute_keys.fingerprint(make(1)) is not None
  assert cute_keys.fingerprint(make(1)) == cute_keys.fingerprint(make(1))
  assert cute_keys.fingerprint(make(1)) != cute_keys.fingerprint(make(2))


class _Barrier(enum.IntEnum):  # FlashAttention-4's named barriers are such enums
  EPILOGUE = 1
  WARP_SCHEDULER = 2


@dataclasses.dataclass(frozen=True)
class _Info:  # and its helpers dataclasses
  tile_m: int = 128
  offsets: tuple = dataclasses.field(default_factory=tuple)


def test_fingerprint_reads_enums_and_dataclasses_of_kernel_libraries():
  def make(barrier_class, info_class):
    return lambda stream, x, y: K.add_one(stream, x, y) if barrier_class.EPILOGUE and info_class().tile_m else None

  assert cute_keys.fingerprint(make(_Barrier, _Info)) is not None
  assert cute_keys.fingerprint(make(_Barrier, _Info)) == cute_keys.fingerprint(make(_Barrier, _Info))

  @dataclasses.dataclass(frozen=True)
  class Other:
    tile_m: int = 64  # only a default differs
    offsets: tuple = dataclasses.field(default_factory=tuple)
  Other.__qualname__ = _Info.__qualname__
  assert cute_keys.fingerprint(make(_Barrier, Other)) != cute_keys.fingerprint(make(_Barrier, _Info))


class _Sync(abc.ABC):  # FlashAttention-4's named barriers subclass the DSL's, which are abstract base classes
  @abc.abstractmethod
  def arrive(self): ...


def test_fingerprint_reads_subclasses_of_abstract_base_classes():
  def make(tile_m):
    @dataclasses.dataclass(frozen=True)
    class Barrier(_Sync):
      def arrive(self):
        return tile_m

    return lambda stream, x, y: K.add_one(stream, x, y) if Barrier().arrive() else None

  assert vars(_Sync)["_abc_impl"] is not None  # C data the fingerprint cannot read: ABCMeta's caches, no code
  assert cute_keys.fingerprint(make(128)) is not None
  assert cute_keys.fingerprint(make(128)) == cute_keys.fingerprint(make(128))
  assert cute_keys.fingerprint(make(128)) != cute_keys.fingerprint(make(64))


SET_CONSTANT = '''
  import json
  from jax_mosaic_ffi.cute.compiler import keys as cute_keys
  import cute_kernels as K

  def launch(stream, x, y, *, name="tile_m"):
    if name in {"tile_m", "tile_n", "seqlen_q", "seqlen_k", "offset_q", "offset_k", "swap_AB", "num_splits"}:
      K.add_one(stream, x, y)
  print(json.dumps({"fingerprint": cute_keys.fingerprint(launch)}))
'''


def test_fingerprint_is_the_same_in_every_process():
  # `x in {...}` compiles to a frozenset constant, whose order follows the process's string hashes.
  found = {fresh_process.run(SET_CONSTANT, env={"PYTHONHASHSEED": seed}).result["fingerprint"]
           for seed in ("1", "2", "3")}
  assert len(found) == 1 and None not in found


FIRST_COMPILE = '''
  import json
  import jax, jax.numpy as jnp
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.cute.compiler import keys as cute_keys
  import cute_kernels as K
  before = cute_keys.fingerprint(K.axpy)
  a = jax.ShapeDtypeStruct((8, 32), jnp.float32)
  for alpha in (2.0, 2.0, 3.0):  # the DSL rewrites the launcher's code when it first compiles it
    jax.jit(jmf.cute_call(K.axpy, output_shape_dtype=a, alpha=alpha)).trace(a, a).lower(lowering_platforms=("cuda",))
  print(json.dumps({"same": cute_keys.fingerprint(K.axpy) == before,
                    "compiles": jmf.kernel_cache_stats().compiles["cute"]}))
'''


def test_a_launcher_keeps_its_fingerprint_once_the_dsl_compiled_it(tmp_path):
  # A fresh process: the first compile of K.axpy in it (the DSL rewrites a function's code in place).
  result = fresh_process.run(FIRST_COMPILE, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert result == {"same": True, "compiles": 2}


def test_launchers_that_cannot_be_read_are_keyed_by_a_trace(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  opaque = object()

  def launch(stream, a, b):
    assert opaque is not None
    K.add_one(stream, a, b)

  assert cute_keys.fingerprint(launch) is None
  cc = one_call(jmf.cute_call(launch, output_shape_dtype=x), x)
  assert cc["target"] == contract.CUTE_TARGET


def test_the_tensors_the_launcher_sees_are_cutlass_calls(isolated_disk_cache, monkeypatch):
  """Each spec gives the launcher a tensor of the very type cutlass_call's own wrapper builds."""
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S", "0")  # traced in this process, where `seen` is
  from cutlass.jax import compile as cutlass_compile
  from cutlass.jax.primitive import _resolve_spec_flat
  import cutlass.cute as cute
  from jax_mosaic_ffi.cute import specs
  from jax_mosaic_ffi.cute.compiler import compile as ours
  from jax_mosaic_ffi.cute.compiler.plan import Plan

  seen = []

  @cute.jit
  def launcher(stream, a, b):
    seen.append(str(a.type))
    seen.append(str(b.type))

  cases = [((8, 16, 32), None, False), ((8, 16, 32), TensorSpec(mode=(1, 2, 0)), False),
           ((8, 16, 32), TensorSpec(layout=(1, 2, 0)), False), ((6, 10), TensorSpec(layout=(0, 1), mode=(1, 0)), False),
           ((8, 16, 32), TensorSpec(layout=(0, 2, 1), divisibility=(8, None, 4)), False),
           ((6, 10), TensorSpec(layout=(0, 1), divisibility=2), False), ((6, 10), TensorSpec(layout=(0, 1)), True),
           ((8, 16, 32), TensorSpec(divisibility=(None, 4, 8)), False),
           ((8, 16, 32), TensorSpec(static=True, mode=(2, 0, 1)), False), ((64,), None, True),
           ((6, 10), TensorSpec(divisibility=2, ptr_assumed_align=16), False)]
  every = []
  for shape, spec, static in cases:
    a, o = jnp.zeros(shape, jnp.float32), jax.ShapeDtypeStruct(shape, jnp.float32)
    theirs_spec = cutlass_compile.build_function_spec(
        [a], jax.tree.structure((0,)), [o], jax.tree.structure((0,)),
        _resolve_spec_flat(None if spec is None else (spec,), [a]), _resolve_spec_flat(None, [o]), {}, None, static, {})
    seen.clear()
    cutlass_compile._generate_precompiled_mlir(launcher, theirs_spec)
    theirs = list(seen)
    tensors = (specs.tensor_arg(spec, a, static, 0, "input_spec", "t"), specs.tensor_arg(None, o, static, 0, "o", "t"))
    plan = Plan(tensors, 1, jax.tree.structure((0,)), jax.tree.structure((0,)), (True,), (), ())
    seen.clear()
    ours._trace_key(launcher, plan, module_format.Arch(90, "a"), None)
    assert seen == theirs, (shape, spec)
    every += theirs
  assert "div=2" in "".join(theirs)  # the types carry what the comparison must see
  assert '"(6,10):(1,6)"' in " ".join(every)  # and the strides: the static column-major tensor's


def test_export_carries_the_object(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((512,), jnp.float32)
  f = jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=x))
  exported = jax.export.export(f, platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(x)
  back = jax.export.deserialize(exported.serialize())
  text = back.mlir_module()
  assert "jax_mosaic_ffi_cute_v1" in text and "host_args" in text


def test_symbolic_shapes_export_once_for_every_size(isolated_disk_cache):
  n, m = jax.export.symbolic_shape("32*n, 16*m")
  a = jax.ShapeDtypeStruct((n, m), jnp.float32)
  spec = TensorSpec(divisibility=(32, 16))
  f = jax.jit(jmf.cute_call(K.axpy, output_shape_dtype=a, input_spec=(spec, spec), output_spec=spec))
  exported = jax.export.export(f, platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(a, a)
  assert "jax_mosaic_ffi_cute_v1" in exported.mlir_module()
  with pytest.raises(jmf.LaunchError, match="symbolic"):
    jax.export.export(jax.jit(jmf.cute_call(K.axpy, output_shape_dtype=a, use_static_tensors=True)),
                      platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(a, a)


def test_aliases_pytrees_and_absent_inputs(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  cc = one_call(jmf.cute_call(K.scale_in_place, output_shape_dtype=x, input_output_aliases={0: 0}), x)
  assert cc["config"]["host_args"][:3] == [1, 0, 0] and cc["config"]["num_outputs"] == 1

  def launch(stream, pair, absent, out):
    assert absent is None
    K.add_one(stream, pair["a"], out)

  f = jmf.cute_call(launch, output_shape_dtype=x)
  lowered = jax.jit(lambda a, b: f({"a": a, "b": b}, None)).trace(x, x).lower(lowering_platforms=("cuda",))
  (cc,) = custom_calls(lowered)
  assert cc["config"]["num_inputs"] == 2


COLUMN_MAJOR = TensorSpec(layout=(0, 1))


def test_a_layout_is_asked_of_xla_and_compiled_into_the_tensor(isolated_disk_cache):
  # CuTe's (0, 1) (dimension 0 innermost) is XLA's minor-to-major [0, 1]; no layout is row-major, [1, 0].
  m = jax.ShapeDtypeStruct((8, 32), jnp.float32)
  plain = one_call(jmf.cute_call(K.axpy, output_shape_dtype=m), m, m)
  assert plain["operand_layouts"] == [[1, 0], [1, 0]] and plain["result_layouts"] == [[1, 0]]
  before = jmf.kernel_cache_stats().compiles["cute"]
  f = jmf.cute_call(K.axpy, output_shape_dtype=m, input_spec=(COLUMN_MAJOR, None), output_spec=COLUMN_MAJOR)
  cc = one_call(f, m, m)
  assert cc["operand_layouts"] == [[0, 1], [1, 0]] and cc["result_layouts"] == [[0, 1]]
  assert cc["config"]["host_args"] == plain["config"]["host_args"]  # the contract's attributes are unchanged
  assert cc["config"]["kernel_hash"] != plain["config"]["kernel_hash"]  # compiled for the layout: its own key
  assert jmf.kernel_cache_stats().compiles["cute"] - before == 1
  cube = jax.ShapeDtypeStruct((4, 8, 16), jnp.float32)
  g = jmf.cute_call(K.add_one, output_shape_dtype=cube, input_spec=TensorSpec(layout=(1, 2, 0)))
  (cc,) = custom_calls(lower(lambda x: g(x), cube))
  assert cc["operand_layouts"] == [[2, 0, 1]] and cc["result_layouts"] == [[2, 1, 0]]
  # An export with symbolic shapes carries the layouts (jax adds the result shapes' operands after ours).
  n, k = jax.export.symbolic_shape("32*n, 16*k")
  sym = jax.ShapeDtypeStruct((n, k), jnp.float32)
  spec = TensorSpec(layout=(0, 1), divisibility=(32, 16))
  f = jax.jit(jmf.cute_call(K.axpy, output_shape_dtype=sym, input_spec=(spec, TensorSpec(divisibility=(32, 16))),
                            output_spec=spec))
  exported = jax.export.export(f, platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(sym, sym)
  text = jax.export.deserialize(exported.serialize()).mlir_module()
  assert "operand_layouts = [dense<[0, 1]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0>" in text
  assert "result_layouts = [dense<[0, 1]> : tensor<2xindex>]" in text


def test_a_layout_under_vmap_keeps_the_batch_major_most(isolated_disk_cache):
  m = jax.ShapeDtypeStruct((8, 32), jnp.float32)
  batch = jax.ShapeDtypeStruct((3, 8, 32), jnp.float32)
  f = jmf.cute_call(K.axpy, output_shape_dtype=m, input_spec=(COLUMN_MAJOR, COLUMN_MAJOR), output_spec=COLUMN_MAJOR)
  (cc,) = custom_calls(lower(jax.vmap(f, in_axes=(0, None)), batch, m))
  # Each batch element stays one compact block: batch_strides are the element's bytes.
  assert cc["operand_layouts"] == [[1, 2, 0], [0, 1]] and cc["result_layouts"] == [[1, 2, 0]]
  assert cc["config"]["batch_size"] == 3 and cc["config"]["batch_strides"] == [1024, 0, 1024]
  nested = jax.ShapeDtypeStruct((2, 3, 8, 32), jnp.float32)
  (cc,) = custom_calls(lower(jax.vmap(jax.vmap(f)), nested, nested))  # nested vmaps: one leading axis
  assert cc["operand_layouts"] == [[1, 2, 0]] * 2 and cc["config"]["batch_size"] == 6
  # A launcher with a batch mode takes the batch as the outermost stride of its (M, N, L) tensors.
  h = jmf.cute_call(K.axpy_batched, output_shape_dtype=m, input_spec=(COLUMN_MAJOR, None), batch_mode=-1)
  for args in ((m, m), (batch, batch)):
    (cc,) = custom_calls(lower(h if args[0] is m else jax.vmap(h), *args))
    assert cc["operand_layouts"] == [[1, 2, 0], [2, 1, 0]] and cc["result_layouts"] == [[2, 1, 0]]


def test_the_tensor_of_a_layout_with_a_batch_mode_is_compact_in_that_order():
  from jax_mosaic_ffi.cute import launch, specs
  t = specs.tensor_arg(COLUMN_MAJOR, jax.ShapeDtypeStruct((8, 32), jnp.float32), False, 0, "input_spec", "t")
  assert t.order == (0, 1) and t.minor_to_major() == (0, 1) and not t.row_major
  batched = launch._with_batch(t, 5, -1, 0, "input_spec", "t")  # noqa: SLF001
  # The buffer is (L, M, N): L outermost, M innermost; the launcher sees (M, N, L).
  assert batched.order == (2, 0, 1) and batched.minor_to_major() == (1, 2, 0) and batched.mode == (1, 2, 0)


SHARDED_LAYOUT = '''
  import glob, json, os, sys
  import jax, jax.numpy as jnp, numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  import jax_mosaic_ffi as jmf
  import cute_kernels as K
  from cutlass.jax import TensorSpec
  f = jmf.mosaic_kernel(jmf.cute_kernel(K.add_one, input_spec=TensorSpec(layout=(0, 1))),
                        lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), sharding=jmf.Elementwise())
  mesh = Mesh(np.array(jax.devices("cpu")[:8]), ("x",))
  x = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("x")))
  lowered = jax.jit(lambda a: f(a) * 2).trace(x).lower(lowering_platforms=("cuda",))
  error = ""
  try:
    lowered.compile()  # the CPU compiler partitions, then finds no CPU handler for a CUDA kernel
  except Exception as e:
    error = str(e)
  (dump,) = glob.glob(os.path.join(sys.argv[1], "*after_spmd-partitioning*"))
  print(json.dumps({"calls": [line for line in open(dump).read().splitlines() if "jax_mosaic_ffi_cute" in line],
                   "error": error}))
'''


def test_a_sharded_call_asks_each_shard_for_the_layout(tmp_path):
  dump = tmp_path / "dump"
  flags = f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"
  result = fresh_process.run(SHARDED_LAYOUT, dump, env={
      "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  (call,) = result["calls"]  # each device's (8, 32) shard, column-major for the kernel
  assert "f32[8,32]{1,0} custom-call(" in call and "operand_layout_constraints={f32[8,32]{0,1}}" in call, call
  assert "jax_mosaic_ffi_cute_v1" in result["error"]  # only the missing CPU handler stopped it


def test_aliased_buffers_need_one_layout(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((16, 16), jnp.float32)
  f = jmf.cute_call(K.scale_in_place, output_shape_dtype=x, input_output_aliases={0: 0}, input_spec=COLUMN_MAJOR)
  with pytest.raises(jmf.LaunchError, match=r"input 0 \(TensorSpec layout=\(0, 1\)\) and output 0 "
                     r"\(layout=\(1, 0\)\) alias.*give both specs the same layout="):
    one_call(f, x)
  same = jmf.cute_call(K.scale_in_place, output_shape_dtype=x, input_output_aliases={0: 0}, input_spec=COLUMN_MAJOR,
                       output_spec=COLUMN_MAJOR)
  cc = one_call(same, x)
  assert cc["operand_layouts"] == cc["result_layouts"] == [[0, 1]]
  assert "operand_index = 0" in str(cc["attributes"]["output_operand_aliases"])


def _path(*keys):
  return tuple(jax.tree_util.SequenceKey(k) if isinstance(k, int) else jax.tree_util.DictKey(k) for k in keys)


def in_place(stream, state, *outputs):
  """Adds one to every leaf of ``state`` in place; its outputs (aliased, so absent or None) are not written."""
  assert all(o is None for o in jax.tree.leaves(outputs, is_leaf=lambda o: o is None)), outputs
  for leaf in jax.tree.leaves(state):
    K.add_one(stream, leaf, leaf)


def test_key_path_aliases_lower_as_their_index_aliases(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)

  def lowered(aliases, out=x, arg=x):
    (cc,) = custom_calls(lower(jmf.cute_call(in_place, output_shape_dtype=out, input_output_aliases=aliases), arg))
    return cc["config"]["host_args"], str(cc["attributes"]["output_operand_aliases"]), cc["results"]

  assert lowered({_path(0): _path(0)}) == lowered({0: 0})
  # An index alias of a pytree aliases it leaf by leaf.
  state = {"m": x, "v": x}
  both = {_path(0, "m"): _path(0, "m"), _path(0, "v"): _path(0, "v")}
  assert lowered(both, (state,), state) == lowered({0: 0}, (state,), state)
  # One leaf of a pytree: the launcher gets None for it among its outputs, and writes the input instead.
  f = jmf.cute_call(K.step_state, output_shape_dtype=(state,), input_output_aliases={_path(0, "m"): _path(0, "m")})
  (cc,) = custom_calls(lower(f, state))
  assert cc["operands"] == 2 and cc["results"] == 2 and cc["config"]["num_outputs"] == 2
  assert "output_tuple_indices = [0], operand_index = 0" in str(cc["attributes"]["output_operand_aliases"])
  with pytest.raises(jmf.CompileError, match="NoneType"):  # new_state["v"] is None for it now: the alias reached it
    lower(jmf.cute_call(K.step_state, output_shape_dtype=(state,), input_output_aliases=both), state)


def test_bad_key_path_aliases_are_refused_by_name(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  y = jax.ShapeDtypeStruct((128,), jnp.float32)
  state = {"m": x, "v": x}

  def call(aliases, out=(state,), arg=state):
    return lower(jmf.cute_call(K.step_state, output_shape_dtype=out, input_output_aliases=aliases), arg)

  with pytest.raises(jmf.LaunchError, match=r"step_state' at test_cute_compile.py:\d+.*input path \[0\]\['w'\] "
                     r"names no tensor leaf of the inputs; their leaves are at \[0\]\['m'\], \[0\]\['v'\]"):
    call({_path(0, "w"): _path(0, "m")})
  with pytest.raises(jmf.LaunchError, match=r"output path \[1\]\['m'\] names no tensor leaf of the outputs"):
    call({_path(0, "m"): _path(1, "m")})
  with pytest.raises(jmf.LaunchError, match=r"input path \[0\] names no tensor leaf"):  # a subtree, not a leaf
    call({_path(0): _path(0, "m")})
  with pytest.raises(jmf.LaunchError, match=r"\[0\]\['m'\]: \[0\]\['m'\] aliases an input of float32\[256\] "
                     r"with an output of float32\[128\]"):
    call({_path(0, "m"): _path(0, "m")}, out=({"m": y, "v": x},))
  with pytest.raises(jmf.LaunchError, match="reuses an input buffer"):
    call({0: 0, _path(0, "m"): _path(1)}, out=(state, x))
  with pytest.raises(jmf.LaunchError, match=r"0: 0 must map pytrees of the same structure"):
    call({0: 0}, out=({"m": x},))
  with pytest.raises(TypeError, match="an integer to an integer or a JAX KeyPath to a JAX KeyPath"):
    jmf.cute_call(K.step_state, output_shape_dtype=(state,), input_output_aliases={0: _path(0)})
  with pytest.raises(TypeError, match="must be JAX key entries"):
    jmf.cute_call(K.step_state, output_shape_dtype=(state,), input_output_aliases={("m",): ("m",)})
  with pytest.raises(ValueError, match="maps several inputs to output"):
    jmf.cute_call(K.step_state, output_shape_dtype=(state,), input_output_aliases={0: 0, np.int64(1): 0})
  with pytest.raises(ValueError, match="must be nonnegative"):
    jmf.cute_call(K.step_state, output_shape_dtype=(state,), input_output_aliases={-1: 0})


def test_errors_name_what_to_fix(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  with pytest.raises(jmf.CompileError, match=r"(?s)^CuTe DSL could not compile 'broken' for sm_90a.*"
                     r"test_cute_compile.py.*nope") as failed:
    one_call(jmf.cute_call(K.broken, output_shape_dtype=x), x)
  assert failed.value.compiler == "CuTe DSL" and failed.value.kernel == "broken" and "nope" in failed.value.log
  with pytest.raises(ValueError, match="output_shape_dtype"):
    jmf.cute_call(K.add_one)
  for given, shown in ((5, r"output_shape_dtype is 5 \(int\)"), ("f32", r"output_shape_dtype is 'f32' \(str\)"),
                       ((x, 3), r"output_shape_dtype\[1\] is 3 \(int\)")):
    with pytest.raises(jmf.LaunchError, match=rf"^cute_call 'add_one': {shown}, not a shape and dtype; pass a "
                                              r"jax.ShapeDtypeStruct"):
      jmf.cute_call(K.add_one, output_shape_dtype=given)
  with pytest.raises(jmf.LaunchError, match="ffi_call_target"):
    jmf.cute_call(K.add_one, output_shape_dtype=x, ffi_call_target="cutlass_call")
  m = jax.ShapeDtypeStruct((4, 8), jnp.float32)
  with pytest.raises(jmf.LaunchError, match=r"input_spec #0 has layout=\(0, 0\), which is not a permutation of 0..1"):
    one_call(jmf.cute_call(K.axpy, output_shape_dtype=m, input_spec=(TensorSpec(layout=(0, 0)), None)), m, m)
  with pytest.raises(jmf.LaunchError, match=r"output_spec #0 has layout=\(2, 1, 0\), which is not a permutation"):
    one_call(jmf.cute_call(K.axpy, output_shape_dtype=m, output_spec=TensorSpec(layout=(2, 1, 0))), m, m)
  with pytest.raises(jmf.LaunchError, match="does not divide"):
    one_call(jmf.cute_call(K.add_one, output_shape_dtype=x, input_spec=TensorSpec(divisibility=(3,))), x)
  with pytest.raises(jmf.LaunchError, match="takes no grid"):
    jmf.mosaic_kernel(jmf.cute_kernel(K.add_one), x, grid=4)


@pytest.mark.parametrize("options", ["--gpu-arch sm_100a", "--gpu-arch=sm_80", "--gpu sm_80",
                                     "--opt-level 3 --host-target linux-aarch64", "--enable-tvm-ffi"])
def test_compile_options_that_retarget_the_compile_are_refused(options):
  with pytest.raises(jmf.LaunchError, match=r"cute_kernel 'add_one': compile_options=.* sets --"):
    jmf.cute_kernel(K.add_one, compile_options=options)
  with pytest.raises(jmf.LaunchError, match="targets="):
    jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct((256,), jnp.float32),
                  compile_options="--gpu-arch sm_100a")
  jmf.cute_kernel(K.add_one, compile_options="--opt-level 3 --generate-line-info")  # the rest are taken


def test_mosaic_kernel_takes_a_cute_kernel(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((300,), jnp.float32)
  f = jmf.mosaic_kernel(jmf.cute_kernel(K.add_one), x, fallback=lambda v: v + 1)
  assert one_call(f, x)["target"] == contract.CUTE_TARGET
  # Off CUDA the fallback runs.
  np.testing.assert_allclose(jax.jit(f)(jnp.arange(300, dtype=jnp.float32)), np.arange(300) + 1)


def test_autotuning_over_constexprs_times_each_config_and_keeps_a_compile_failure(isolated_disk_cache, monkeypatch,
                                                                                   rng):
  # The autotuner's machinery on the CPU (the configs' fallbacks timed): each config is the launcher with its
  # constexprs, compiled on its own; one the launcher does not take fails to compile, a failure kept as lasting.
  from jax_mosaic_ffi.transforms import autotune as autotuning
  from jax_mosaic_ffi.store import tuning_failures
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  a, b = (rng.standard_normal((32, 128)).astype(np.float32) for _ in range(2))
  before = jmf.kernel_cache_stats()
  f = jmf.mosaic_kernel(jmf.cute_kernel(K.axpy, alpha=2.0), jax.ShapeDtypeStruct(a.shape, jnp.float32),
                        fallback=lambda x, y: 2 * x + y, configs=[{"threads": 64}, {"threads": 256}, {"nope": 1}])
  np.testing.assert_allclose(np.asarray(jax.jit(f)(a, b)), 2 * a + b, rtol=1e-6)
  report = f.last_report
  assert report["source"] == "tuned" and report["winner"] in (0, 1), report
  assert all(report["table"][k]["us"] > 0 for k in (0, 1)), report
  error = report["table"][2]["error"]
  assert report["table"][2]["us"] is None and "CuTe DSL could not compile 'axpy'" in error, error
  assert tuning_failures.lasting(error), error
  assert jmf.kernel_cache_stats().compiles["cute"] - before.compiles["cute"] == 2
  # Each config's call is its own launch: another kernel, so the autotuner keys their timings apart.
  launches = [f._launches(k, (a, a)) for k in (0, 1)]  # noqa: SLF001
  assert launches[0] != launches[1] and all(len(found) == 1 for found in launches), launches


def test_vmap_lowers_one_call_that_runs_per_element(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((4, 256), jnp.float32)
  f = jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct((256,), jnp.float32))
  (cc,) = custom_calls(jax.jit(jax.vmap(f)).trace(x).lower(lowering_platforms=("cuda",)))
  assert cc["config"]["batch_size"] == 4 and cc["config"]["batch_strides"] == [1024, 1024]
  odd = jmf.cute_call(K.add_one, output_shape_dtype=jax.ShapeDtypeStruct((100,), jnp.float32))
  with pytest.raises(jmf.LaunchError, match="multiple of the 256 bytes"):
    jax.jit(jax.vmap(odd)).trace(jax.ShapeDtypeStruct((4, 100), jnp.float32)).lower(lowering_platforms=("cuda",))


def test_a_launcher_with_a_batch_mode_is_vmapped_into_one_call(isolated_disk_cache):
  a = jax.ShapeDtypeStruct((8, 32), jnp.float32)
  f = jmf.cute_call(K.axpy_batched, output_shape_dtype=a, batch_mode=-1, alpha=2.0)
  before = jmf.kernel_cache_stats().compiles["cute"]

  def host_args(buffers):  # per buffer (2 inputs, 1 output): its address, then 3 dimensions, the batch first
    return [v for b in range(buffers) for v in (1, b, 0, 2, b, 0, 2, b, 1, 2, b, 2)]
  plain = one_call(f, a, a)  # a batch of one: (8, 32) arrays are (8, 32, 1) tensors
  assert plain["config"]["host_args"] == host_args(3) and plain["config"].get("batch_size", 1) == 1
  for shape, in_axes in (((4, 8, 32), (0, 0)), ((7, 8, 32), (0, None))):
    batch = jax.ShapeDtypeStruct(shape, jnp.float32)
    (cc,) = custom_calls(lower(jax.vmap(f, in_axes=in_axes), batch, batch if in_axes[1] == 0 else a))
    assert cc["config"]["host_args"] == host_args(3) and cc["config"].get("batch_size", 1) == 1
  nested = jax.ShapeDtypeStruct((3, 4, 8, 32), jnp.float32)
  (cc,) = custom_calls(lower(jax.vmap(jax.vmap(f)), nested, nested))
  assert cc["config"].get("batch_size", 1) == 1
  # Dynamic tensors read the batch at run time: one compile for every batch size.
  assert jmf.kernel_cache_stats().compiles["cute"] - before == 1
  with pytest.raises(jmf.LaunchError, match="batch_mode=3 is no mode position of input_spec #0"):
    lower(jmf.cute_call(K.axpy_batched, output_shape_dtype=a, batch_mode=3), a, a)
  with pytest.raises(TypeError, match="batch_mode is a mode position"):
    jmf.cute_call(K.axpy_batched, output_shape_dtype=a, batch_mode="last")


def test_a_batched_launcher_falls_back_per_batch_off_cuda(isolated_disk_cache, rng):
  a, b = (rng.standard_normal((5, 8, 32)).astype(np.float32) for _ in range(2))
  f = jmf.mosaic_kernel(jmf.cute_kernel(K.axpy_batched, batch_mode=2, alpha=2.0),
                        lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype), fallback=lambda x, y: 2 * x + y)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(f))(a, b)), 2 * a + b, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(f)(a[0], b[0])), 2 * a[0] + b[0], rtol=1e-6)


def test_each_target_compiles_whatever_arch_the_dsl_believes_it_runs_on(isolated_disk_cache):
  # dump_to_object works only for the DSL's runtime arch (CUTE_DSL_ARCH, this GPU's, or sm_100a without one):
  # cute/compiler/dsl.py sets it per compile. One of these two targets differs from it on any machine.
  from cutlass.cutlass_dsl.cutlass import CuTeDSL
  env = CuTeDSL._get_dsl().envar  # the DSL's private name that cute/compiler/dsl.py relies on: this test fails with it
  arch = getattr(type(env), "arch", None)
  assert isinstance(arch, property) and arch.fset and arch.fdel, "the DSL's runtime arch is no settable property"
  runtime = env.arch
  x = jax.ShapeDtypeStruct((512,), jnp.float32)
  f = jmf.mosaic_kernel(jmf.cute_kernel(K.add_one, targets=["sm_90a", "sm_100a"]), x)
  images = module_format.parse(one_call(f, x)["config"]["module"]).images
  assert [(i.kind, i.arch.sm) for i in images] == [(module_format.ImageKind.CUTE, "sm_90a"),
                                                   (module_format.ImageKind.CUTE, "sm_100a")]
  assert all(i.data[:4] == b"\x7fELF" for i in images)
  assert env.arch == runtime  # restored


def test_the_contract_refuses_crafted_cute_calls():
  base = {"kernel_hash": bytes(32), "grid": [1, 1, 1], "block": [1, 1, 1], "cluster": [1, 1, 1], "num_inputs": 1,
          "num_outputs": 1, "param_order": [], "host_args": [1, 0, 0, 1, 1, 0]}
  assert core.validate_launch(base, False)["host_launch"] is True
  for change, message in [({"host_args": [1, 0, 0, 3, 1, 0]}, "kind 3"), ({"host_args": [1, 5, 0]}, "buffer 5"),
                          ({"host_args": [2, 0, 64]}, "dimension 64"), ({"host_args": [1, 0]}, "3 per argument"),
                          ({"grid": [2, 1, 1]}, "grid, block and cluster must be"),
                          ({"param_order": [0]}, "param_order")]:
    with pytest.raises(ValueError, match=message):
      core.validate_launch({**base, **change}, False)
  with pytest.raises(ValueError, match="CuTe target alone"):
    core.validate_launch({**base, "uses_xla_collective_metadata": True, "xla_replica_ids": "0"}, True)


def test_the_module_parser_bounds_cute_objects():
  image = module_format.Image(module_format.ImageKind.CUTE, module_format.Arch(90, "a"), cute_objects.real_object(),
                              "4.8.1", (1, 2))
  data = module_format.serialize(module_format.ParsedModule("jmf_cute", (image,)), compress=False)
  assert module_format.parse(data).images[0] == image
  header = 8 + 16 + len(b"jmf_cute") + 24  # module header, symbol, image header
  for cut in range(1, len(data) - header):
    with pytest.raises(module_format.ModuleFormatError):
      module_format.parse(data[:-cut])
  payload = bytearray(data)
  payload[header:header + 4] = (65).to_bytes(4, "little")  # a version longer than allowed
  with pytest.raises(module_format.ModuleFormatError, match="DSL version"):
    module_format.parse(bytes(payload))
  cubin = module_format.Image(module_format.ImageKind.CUBIN, module_format.Arch(90), b"\x7fELF" + bytes(8))
  with pytest.raises(module_format.ModuleFormatError, match="mixes"):
    module_format.serialize(module_format.ParsedModule("jmf_cute", (image, cubin)))


def test_missing_dsl_names_the_extra(monkeypatch):
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  from jax_mosaic_ffi.cute.compiler import dsl
  monkeypatch.setattr(cute_package, "compiler_release", lambda: None)
  with pytest.raises(jmf.CuteUnavailable, match=r"jax_mosaic_ffi\[cute\]"):
    jmf.cute_kernel(K.add_one)
  with pytest.raises(jmf.CuteUnavailable, match="4.9.0 is installed"):
    dsl.check_release("4.9.0")


DAMAGED_DSL = '''
  import json, os, sys
  # A cutlass package whose import fails as a damaged install's does (here: an AttributeError of its own code).
  os.makedirs("damaged/cutlass", exist_ok=True)
  with open("damaged/cutlass/__init__.py", "w") as f:
    f.write("import types\\ntypes.NoSuchThing\\n")
  sys.path.insert(0, os.path.abspath("damaged"))
  import jax, jax.numpy as jnp
  import jax_mosaic_ffi as jmf

  def launch(stream, x, y):
    pass

  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  try:
    jax.jit(jmf.cute_call(launch, output_shape_dtype=x)).trace(x)
    found = "nothing raised"
  except Exception as e:
    found = f"{type(e).__name__}: {e}"
  print(json.dumps({"error": found}))
'''


def test_a_damaged_dsl_import_is_named(tmp_path):
  r = fresh_process.run(DAMAGED_DSL, cwd=tmp_path, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert r["error"].startswith("CuteUnavailable: CuTe DSL could not be imported: import cutlass raised "
                               "AttributeError: module 'types' has no attribute 'NoSuchThing'. The "
                               "nvidia-cutlass-dsl install looks damaged"), r


def test_runtime_library_is_found_without_importing_the_dsl():
  code = '''
  import json, sys
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  found = cute_package.runtime()
  print(json.dumps({"library": str(found.library), "release": found.release,
                   "imported": any(m == "cutlass" or m.startswith("cutlass.") for m in sys.modules)}))
  '''
  result = fresh_process.run(code).result
  assert result["library"].endswith("nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so")
  assert not result["imported"]


FOUND_LIBRARY = '''
  import json
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  print(json.dumps({"library": str(cute_package.runtime().library)}))
'''


def test_a_library_planted_in_the_working_directory_or_on_pythonpath_is_not_loaded(tmp_path):
  # nvidia_cutlass_dsl is a namespace package: a portion of it in the working directory (first on sys.path for
  # `python -c`) or on PYTHONPATH used to win. The library is found in its distribution's file list instead, and a
  # planted distribution there is not one either.
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  installed = str(cute_package.runtime().library)
  cwd, path = tmp_path / "cwd", tmp_path / "path"
  for root in (cwd, path):
    planted = root / "nvidia_cutlass_dsl" / "cu13" / "lib" / "libcute_dsl_runtime.so"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"\x7fELF planted")
  record = path / "nvidia_cutlass_dsl_libs_cu13-4.8.1.dist-info"
  record.mkdir()
  (record / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cutlass-dsl-libs-cu13\nVersion: 4.8.1\n")
  (record / "RECORD").write_text("nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so,,\n")
  found = fresh_process.run(FOUND_LIBRARY, cwd=cwd, env={"PYTHONPATH": str(path)}).result["library"]
  assert found == installed and str(tmp_path) not in found


ONLY_ON_PYTHONPATH = '''
  import json, sys, sysconfig
  from jax_mosaic_ffi.base.native import core
  from jax_mosaic_ffi.call import runtime_libraries
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  # The installed copy off the path (everything is imported): the one on PYTHONPATH is all there is.
  sys.path[:] = [p for p in sys.path if p != sysconfig.get_paths()["purelib"]]
  runtime_libraries.publish()
  print(json.dumps({"found": str(cute_package.runtime()), "problem": core.cute_dsl_runtime_problem(),
                   "library": core.cute_dsl_runtime_library()}))
'''


def test_a_library_installed_only_on_pythonpath_is_named_not_loaded(tmp_path):
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  installed = cute_package.runtime().library
  path = tmp_path / "path"
  library = path / "nvidia_cutlass_dsl" / "cu13" / "lib" / "libcute_dsl_runtime.so"
  library.parent.mkdir(parents=True)
  library.write_bytes(installed.read_bytes())   # a real copy: not loaded all the same
  record = path / "nvidia_cutlass_dsl_libs_cu13-4.8.1.dist-info"
  record.mkdir()
  (record / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cutlass-dsl-libs-cu13\nVersion: 4.8.1\n")
  (record / "RECORD").write_text("nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so,,\n")
  result = fresh_process.run(ONLY_ON_PYTHONPATH, env={"PYTHONPATH": str(path)}).result
  assert result["found"] == "None" and result["library"] == "", result
  assert (f"nvidia-cutlass-dsl-libs-cu13 is installed only in {path}, the working directory or on PYTHONPATH, "
          "where jax_mosaic_ffi loads no native code") in result["problem"], result
  assert "install it into the environment (pip install)" in result["problem"]


def test_the_first_lowering_tells_the_runtime_where_the_library_is():
  # A process that only deserializes a CuTe DSL export calls no jmf.register(): the registration at its first
  # lowering (before XLA compiles, so before any instantiate) hands the runtime the library's path, without
  # importing the DSL. Here jax has no CUDA device, so nothing is registered, but the path is handed over.
  code = '''
  import json, sys
  import jax
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.base.native import core
  before = core.cute_dsl_runtime_library()
  jax.jit(lambda v: v + 1)(1.0)  # no mosaic_kernel in it: what a deserialized artifact's call does
  print(json.dumps({"before": before, "after": core.cute_dsl_runtime_library(),
                   "registration": jmf.registration.status()["message"],
                   "imported": any(m == "cutlass" or m.startswith("cutlass.") for m in sys.modules)}))
  '''
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  result = fresh_process.run(code, env={"JAX_PLATFORMS": "cpu"}).result
  assert result["before"] == "" and result["after"] == str(cute_package.runtime().library), result
  assert result["registration"] == "not registered: JAX has no CUDA device here" and not result["imported"], result


DAMAGED_RUNTIME = '''
  import json
  import jax, jax.numpy as jnp
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.cute.compiler import package as cute_package
  from jax_mosaic_ffi.base.native import core
  import cute_kernels as K

  def damaged():
    raise OSError("the nvidia-cutlass-dsl package cannot be read")

  cute_package.runtime = damaged
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  cuda = jmf.mosaic_kernel(jmf.cuda_kernel('extern "C" __global__ void k(float* out) {}', "k"), x, grid=1, block=256)
  cute = jmf.cute_call(K.add_one, output_shape_dtype=x)

  def lower(fn, *avals):
    try:
      return "jax_mosaic_ffi_" in jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
    except Exception as e:
      return f"{type(e).__name__}: {e}"

  lowered = [lower(cuda), lower(cute, x), lower(cute, x), lower(cuda)]
  print(json.dumps({"lowered": lowered, "status": jmf.registration.status(),
                   "runtime_problem": core.cute_dsl_runtime_problem(), "library": core.cute_dsl_runtime_library()}))
'''


def test_a_damaged_runtime_library_stops_cute_kernels_alone(tmp_path):
  # Finding the CuTe DSL runtime library, a step of registering, fails here as a damaged install makes it fail: the
  # targets are registered all the same (here: nothing to register without CUDA) and a CUDA C++ kernel lowers,
  # while each CuTe DSL lowering raises the kept cause, which the runtime reports at a CuTe call's instantiate too.
  r = fresh_process.run(DAMAGED_RUNTIME, env={"JAX_PLATFORMS": "cpu",
                                              "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  kept = ("jax_mosaic_ffi could not find NVIDIA's CuTe DSL runtime library: OSError: the nvidia-cutlass-dsl package "
          "cannot be read. CuTe DSL kernels cannot run in this process (every other kernel can): reinstall "
          "nvidia-cutlass-dsl in the supported range (docs/compatibility.md; pip install 'jax_mosaic_ffi[cute]'")
  cuda, cute, again, cuda_again = r["lowered"]
  assert cuda is True and cuda_again is True, r
  assert cute.startswith("CuteUnavailable: mosaic_kernel 'add_one' at <string>:") and kept in cute, r
  assert again == cute, r
  assert r["status"]["message"] == "not registered: JAX has no CUDA device here", r
  problem = r["status"]["runtime_libraries"]["libcute_dsl_runtime.so"]
  assert problem.startswith(kept) and problem == r["runtime_problem"], r
  assert r["library"] == "", r


def test_a_launcher_that_is_not_a_cute_jit_function_and_launches_nothing_is_named(isolated_disk_cache):
  x = jax.ShapeDtypeStruct((128,), jnp.float32)
  with pytest.raises(jmf.CompileError, match=r"'lambda' .*\nthe launcher <function .*<lambda>.*> is not a @cute.jit "
                                             r"function and launched no kernel\n\nadvice: decorate the launcher with "
                                             r"@cute.jit"):
    lower(jmf.cute_call(lambda stream, a, b: None, output_shape_dtype=x), x)
  lower(jmf.cute_call(lambda stream, a, b: K.add_one(stream, a, b), output_shape_dtype=x), x)  # one that calls one
