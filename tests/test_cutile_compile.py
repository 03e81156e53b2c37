"""cuTile kernels compiled on a machine without a GPU: for any arch list, once ever, through the compile cache,
packs' strict mode and the key audit, keyed by what changes the cubin, with bytes that do not depend on the folder
the kernel's file is in, and bounded by JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S."""

import textwrap

import jax
import jax.numpy as jnp
import pytest

import cutile_required  # noqa: F401  (skips without cuda-tile)
import fresh_process
import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.cutile.compiler import cubin as cubin_lib
from jax_mosaic_ffi.cutile.compiler import keys as cutile_keys
from jax_mosaic_ffi.cutile.compiler import plan as plan_lib
from jax_mosaic_ffi.cutile.compiler.compile import compile_plan
from hlo_inspect import custom_calls, lower

S = cutile_required.samples()


def f32(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def vadd_plan(n=4096, dtype="float32", tile=1024):
  arrays = tuple(plan_lib.ArrayArg(b, dtype, (n,)) for b in range(3))
  return plan_lib.Plan((*arrays, plan_lib.ConstantArg(tile, cutile_keys.exact_key(tile).hex())))


def test_one_compile_gives_a_cubin_per_arch_of_any_list(isolated_disk_cache):
  targets = tuple(module_format.Arch.parse(a) for a in ("sm_80", "sm_90", "sm_100", "sm_120"))
  kernel = compile_plan(S.vector_add, vadd_plan(), name="vector_add", targets=targets)
  assert [(i.kind, i.arch.sm) for i in kernel.images] == [
      (module_format.ImageKind.CUBIN, a) for a in ("sm_80", "sm_90a", "sm_100a", "sm_120a")]
  assert all(cubin_lib.sm_number(i.data) == i.arch.number for i in kernel.images)
  # Each cubin is a tile kernel of 128 threads per block, with the tile launch's metadata, under cuTile's symbol.
  assert kernel.symbol.startswith("vector_add_")
  for image in kernel.images:
    info = kernel.launch_info(image.arch.sm)
    assert info == cubin_lib.launch_info(image.data, kernel.symbol) and info.tile and info.threads[0] > 1
  assert jmf.kernel_cache_stats().compiles["cutile"] >= 4


def test_the_matmul_declares_its_static_shared_memory(isolated_disk_cache):
  plan = plan_lib.Plan((plan_lib.ArrayArg(0, "float16", (512, 256)), plan_lib.ArrayArg(1, "float16", (256, 384)),
                        plan_lib.ArrayArg(2, "float16", (512, 384)),
                        *(plan_lib.ConstantArg(v, cutile_keys.exact_key(v).hex()) for v in (128, 128, 64))))
  kernel = compile_plan(S.matmul, plan, name="matmul", targets=(module_format.Arch(90),))
  info = kernel.launch_info("sm_90a")
  assert info.tile and info.threads == (128, 1, 1) or info.threads[0] % 128 == 0
  assert info.static_smem > 48 * 1024  # read from .nv.shared.<entry>: above the 48 KiB a SIMT kernel may declare


def test_a_compile_is_found_again_in_memory_and_not_compiled_twice(isolated_disk_cache):
  before = jmf.kernel_cache_stats().compiles["cutile"]
  a = compile_plan(S.vector_add, vadd_plan(), name="vector_add", targets=(module_format.Arch(90),))
  b = compile_plan(S.vector_add, vadd_plan(n=8192), name="vector_add", targets=(module_format.Arch(90),))
  assert a is b  # extents are launch values: 4096 and 8192 (both multiples of 16) are one compile
  assert jmf.kernel_cache_stats().compiles["cutile"] - before == 1


@pytest.mark.parametrize("change", ["constant", "dtype", "divisibility", "index width", "hint", "target", "code"])
def test_the_key_follows_what_changes_the_cubin(isolated_disk_cache, change):
  base = dict(kernel=S.vector_add, plan=vadd_plan(), targets=(module_format.Arch(90),))
  other = dict(base)
  if change == "constant":
    other["plan"] = vadd_plan(tile=512)
  elif change == "dtype":
    other["plan"] = vadd_plan(dtype="float16")
  elif change == "divisibility":
    other["plan"] = vadd_plan(n=4095)
  elif change == "index width":
    p = vadd_plan()
    other["plan"] = plan_lib.Plan((plan_lib.ArrayArg(0, "float32", (4096,), 64), *p.args[1:]))
  elif change == "hint":
    other["kernel"] = S.vector_add.replace_hints(occupancy=2)
  elif change == "target":
    other["targets"] = (module_format.Arch(100),)
  else:
    other["kernel"] = S.vector_add_pairs.replace_hints(num_ctas=None)  # the same body, another function
  before = jmf.kernel_cache_stats().compiles["cutile"]
  a = compile_plan(base["kernel"], base["plan"], name="k", targets=base["targets"])
  b = compile_plan(other["kernel"], other["plan"], name="k", targets=other["targets"])
  assert jmf.kernel_cache_stats().compiles["cutile"] - before == 2
  assert a.module != b.module


SAME_BYTES = '''
  import json, sys
  sys.path.insert(0, sys.argv[1])
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.base import module_format
  from jax_mosaic_ffi.cutile.compiler import keys, plan as P
  from jax_mosaic_ffi.cutile.compiler.compile import compile_plan
  import tile_kernels
  arrays = tuple(P.ArrayArg(b, "float32", (4096,)) for b in range(3))
  plan = P.Plan((*arrays, P.ConstantArg(256, keys.exact_key(256).hex())))
  kernel = compile_plan(tile_kernels.twice, plan, name="twice", targets=(module_format.Arch(90),))
  print(json.dumps({"hash": kernel.hash.hex(), "folder": sys.argv[1].encode() in kernel.images[0].data,
                    "compiles": jmf.kernel_cache_stats().compiles["cutile"]}))
'''

TILE_KERNELS = '''
import cuda.tile as ct

def doubled(t):
  return t + t

@ct.kernel
def twice(a, b, c, TILE: ct.Constant[int]):
  x = ct.load(a, index=(ct.bid(0),), shape=(TILE,))
  y = ct.load(b, index=(ct.bid(0),), shape=(TILE,))
  ct.store(c, index=(ct.bid(0),), tile=doubled(x) + y)
'''


def test_the_same_kernel_in_another_folder_compiles_to_the_same_bytes(tmp_path):
  """cuTile's line information names the kernel's folder; compiled from code naming a fixed one (relocate.py), the
  cubins of two checkouts are one module, and each process compiled (no shared cache)."""
  found = []
  for where in ("checkout-a", "somewhere/else/checkout-b"):
    folder = tmp_path / where
    folder.mkdir(parents=True)
    (folder / "tile_kernels.py").write_text(TILE_KERNELS)
    env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / f"cache-{len(found)}"),
           "CUDA_TILE_CACHE_DIR": str(tmp_path / "cutile-own-cache")}
    found.append(fresh_process.run(SAME_BYTES, str(folder), env=env).result)
  assert found[0]["compiles"] == found[1]["compiles"] == 1
  assert found[0]["hash"] == found[1]["hash"]
  assert not found[0]["folder"] and not found[1]["folder"]
  assert not (tmp_path / "cutile-own-cache").exists()  # cuTile's own cache is off in our compiles


WARM = '''
  import json
  import jax, jax.numpy as jnp
  import jax_mosaic_ffi as jmf
  from cutile_required import samples
  S = samples()
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.vector_add, TILE=1024, targets=["sm_90", "sm_100"]), lambda a, b: a,
                        grid=lambda a, b: jmf.cdiv(a.size, 1024))
  a = jax.ShapeDtypeStruct((4096,), jnp.float32)
  text = jax.jit(f).trace(a, a).lower(lowering_platforms=("cuda",)).as_text()
  stats = jmf.kernel_cache_stats()
  print(json.dumps({"compiles": stats.compiles["cutile"], "disk_hits": stats.disk_hits,
                    "lowered": "jax_mosaic_ffi_launch_v1" in text}))
'''


def test_a_second_process_compiles_nothing(tmp_path):
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}
  cold = fresh_process.run(WARM, env=env).result
  warm = fresh_process.run(WARM, env=env).result
  assert cold["compiles"] == 2 and cold["lowered"]
  assert warm["compiles"] == 0 and warm["disk_hits"] == 1 and warm["lowered"]


def test_strict_packs_refuse_a_compile_no_pack_holds(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_PACKS_STRICT", "1")
  with pytest.raises(jmf.NotInPacks, match="cuTile"):
    compile_plan(S.vector_add, vadd_plan(n=1 << 20), name="vector_add", targets=(module_format.Arch(90),))


def test_the_key_audit_proves_a_hit_against_the_kernels_tileir(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "1")
  plan = vadd_plan(n=2048, tile=128)
  compile_plan(S.vector_add, plan, name="vector_add", targets=(module_format.Arch(90),))
  before = jmf.kernel_cache_stats()
  compile_plan(S.vector_add, plan, name="vector_add", targets=(module_format.Arch(90),))
  after = jmf.kernel_cache_stats()
  assert after.memory_hits - before.memory_hits == 1
  from jax_mosaic_ffi.store import compile_cache
  assert compile_cache.stats().audits >= 1


SLOW = '''
import cuda.tile as ct

@ct.kernel
def unrolled(a, b, TILE: ct.Constant[int]):
  t = ct.load(a, index=(ct.bid(0),), shape=(TILE,))
  for i in ct.static_iter(range(1000)):
    for j in ct.static_iter(range(1000)):
      t = t * 1.0001 + 0.5
  ct.store(b, index=(ct.bid(0),), tile=t)
'''


def test_a_compile_that_cannot_finish_is_stopped_at_the_bound(tmp_path, isolated_disk_cache, monkeypatch):
  """A million unrolled steps cannot compile within the bound; the child is killed there, and this process goes on."""
  (tmp_path / "slow_tile.py").write_text(SLOW)
  monkeypatch.syspath_prepend(str(tmp_path))
  import slow_tile
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S", "2")
  plan = plan_lib.Plan((plan_lib.ArrayArg(0, "float32", (1024,)), plan_lib.ArrayArg(1, "float32", (1024,)),
                        plan_lib.ConstantArg(128, cutile_keys.exact_key(128).hex())))
  with pytest.raises(jmf.CompileTimeout, match="(?s)unrolled.*ran past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=2"):
    compile_plan(slow_tile.unrolled, plan, name="unrolled", targets=(module_format.Arch(90),))


# A kernel whose front end sleeps JMF_TEST_TRACE_SLEEP_S seconds (reading a constant of a module that makes it on
# demand): the key reader cannot read that whole, so the kernel is keyed by its bytecode: two runs of the front end.
SLEEPS_IN_ITS_FRONT_END = {
    "slow_constants.py": """
import os, time
def __getattr__(name):
  if name != "SCALE":
    raise AttributeError(name)
  time.sleep(float(os.environ["JMF_TEST_TRACE_SLEEP_S"]))
  return 2.0
""",
    "sleepy_tile.py": """
import cuda.tile as ct
import slow_constants

@ct.kernel
def sleepy(a, b, TILE: ct.Constant[int]):
  t = ct.load(a, index=(ct.bid(0),), shape=(TILE,))
  ct.store(b, index=(ct.bid(0),), tile=t * slow_constants.SCALE)
"""}


def test_the_pieces_of_one_compile_share_one_deadline(tmp_path, isolated_disk_cache, monkeypatch):
  # The bytecode key's front end and the compile's each take 0.6 of the bound: one deadline stops the compile,
  # wherever the time went (a fresh bound per piece let it finish, at up to twice the bound).
  for name, text in SLEEPS_IN_ITS_FRONT_END.items():
    (tmp_path / name).write_text(text)
  monkeypatch.syspath_prepend(str(tmp_path))
  import sleepy_tile
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S", "10")
  monkeypatch.setenv("JMF_TEST_TRACE_SLEEP_S", "6")
  plan = plan_lib.Plan((plan_lib.ArrayArg(0, "float32", (1024,)), plan_lib.ArrayArg(1, "float32", (1024,)),
                        plan_lib.ConstantArg(128, cutile_keys.exact_key(128).hex())))
  with pytest.raises(jmf.CompileTimeout, match=r"(?s)sleepy.*ran past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=10 seconds"):
    compile_plan(sleepy_tile.sleepy, plan, name="sleepy", targets=(module_format.Arch(90),))


def test_a_kernel_cutile_refuses_names_the_kernel_and_its_file(tmp_path, isolated_disk_cache, monkeypatch):
  (tmp_path / "broken_tile.py").write_text(textwrap.dedent('''
    import cuda.tile as ct

    @ct.kernel
    def broken(a, b, TILE: ct.Constant[int]):
      t = ct.load(a, index=(ct.bid(0),), shape=(TILE,))
      ct.store(b, index=(ct.bid(0),), tile=t @ undefined_name)
  '''))
  monkeypatch.syspath_prepend(str(tmp_path))
  import broken_tile
  plan = plan_lib.Plan((plan_lib.ArrayArg(0, "float32", (1024,)), plan_lib.ArrayArg(1, "float32", (1024,)),
                        plan_lib.ConstantArg(128, cutile_keys.exact_key(128).hex())))
  with pytest.raises(jmf.CompileError, match="cuTile could not compile") as e:
    compile_plan(broken_tile.broken, plan, name="broken", targets=(module_format.Arch(90),))
  assert "undefined_name" in str(e.value) and "/jax_mosaic_ffi-cutile" not in str(e.value)


def test_a_family_target_is_refused_before_anything_compiles(isolated_disk_cache):
  with pytest.raises(ValueError, match="family target"):
    compile_plan(S.vector_add, vadd_plan(), name="vector_add", targets=(module_format.Arch(100, "f"),))


def test_cold_compile_costs_what_export_kernel_costs(isolated_disk_cache):
  """Not a timing (no outcome depends on speed): the cold path runs export_kernel once per target and nothing else
  that compiles (a second lookup of the same key is a memory hit)."""
  before = jmf.kernel_cache_stats().compiles["cutile"]
  f = jmf.mosaic_kernel(jmf.cutile_kernel(S.softmax, TILE_N=256, targets=["sm_90"]), lambda x: x,
                        grid=lambda x: x.shape[0])
  for _ in range(3):
    custom_calls(lower(f, f32(8, 200)))
  assert jmf.kernel_cache_stats().compiles["cutile"] - before == 1



def test_a_compile_leaves_no_file_and_asks_tileiras_its_bytecode_version_once(tmp_path, isolated_disk_cache,
                                                                            monkeypatch):
  """cuTile writes each compile's bytecode and cubin into its temporary folder and leaves them there, and probes
  tileiras for the bytecode version it takes (two more files) once per process: a forked compile's child does
  both in its own folder, and asks no probe, which this process made once."""
  from cuda.tile import _cext
  from jax_mosaic_ffi.cutile.compiler import release
  release.bytecode_version()
  folder = tmp_path / "cutile-temp"
  folder.mkdir()
  monkeypatch.setattr(_cext.default_tile_context.config, "temp_dir", str(folder))
  for n in (2048, 2047):  # two keys (the extent's divisibility differs): two compiles
    compile_plan(S.vector_add, vadd_plan(n=n, tile=256), name="vector_add", targets=(module_format.Arch(90),))
  assert sorted(p.name for p in folder.iterdir()) == []
