"""CuTe DSL compile keys hold values by their content: a launcher that reads a module-level table, or takes an
array constexpr, is compiled again when one entry changes, in the middle of 2000 entries or in a float's ninth
digit (both print alike with numpy), in memory and across processes through the disk cache; a ``compile_key`` that
cannot be keyed exactly is refused, and a constexpr that cannot be keyed exactly is keyed by a trace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)
import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import module_format

import cute_kernels as K
import fresh_process
from hlo_inspect import custom_calls

X = jax.ShapeDtypeStruct((4096,), jnp.float32)


def lowered_kernel(call) -> tuple[bytes, bytes]:
  """The kernel hash of ``call``'s one custom call on X, and its CuTe DSL object. (A new call each time: jax.jit
  keeps a function's trace, as it does for every function whose globals change.)"""
  (cc,) = custom_calls(jax.jit(call).trace(X).lower(lowering_platforms=("cuda",)))
  (image,) = module_format.parse(cc["config"]["module"]).images
  return cc["config"]["kernel_hash"], image.data


def compiles() -> int:
  return jmf.kernel_cache_stats().compiles["cute"]


def entry_bytes(value: float) -> bytes:
  return np.float32(value).tobytes()


def test_a_module_level_table_edited_in_its_middle_compiles_again(isolated_disk_cache, monkeypatch):
  def call():
    return jmf.cute_call(K.add_table_entry, output_shape_dtype=X)

  before = compiles()
  first, _ = lowered_kernel(call())
  again, _ = lowered_kernel(call())
  assert again == first and compiles() - before == 1
  edited = K.TABLE.copy()
  edited[K.PICK] = 0.75
  assert repr(edited) == repr(K.TABLE)  # numpy prints both alike: a key of text would not tell them apart
  monkeypatch.setattr(K, "TABLE", edited)
  changed, obj = lowered_kernel(call())
  assert compiles() - before == 2 and changed != first
  assert entry_bytes(0.75) in obj  # the new constant is compiled in
  monkeypatch.setattr(K, "TABLE", edited.copy())  # the same values in another array: the same kernel
  assert lowered_kernel(call())[0] == changed and compiles() - before == 2


def test_a_table_entry_changed_in_its_ninth_digit_compiles_again(isolated_disk_cache, monkeypatch):
  table = K.TABLE.copy()
  table[K.PICK] = 0.123456789
  monkeypatch.setattr(K, "TABLE", table)
  before = compiles()
  lowered_kernel(jmf.cute_call(K.add_table_entry, output_shape_dtype=X))
  nearby = table.copy()
  nearby[K.PICK] = 0.123456788
  assert repr(nearby) == repr(table) and str(nearby[K.PICK - 1: K.PICK + 1]) == str(table[K.PICK - 1: K.PICK + 1])
  monkeypatch.setattr(K, "TABLE", nearby)
  lowered_kernel(jmf.cute_call(K.add_table_entry, output_shape_dtype=X))
  assert compiles() - before == 2


def test_an_array_constexpr_edited_in_its_middle_compiles_again(isolated_disk_cache):
  table = np.linspace(0.0, 1.0, 2000)
  edited = table.copy()
  edited[1000] = 0.625
  before = compiles()
  first, _ = lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=table))
  changed, obj = lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=edited))
  assert changed != first and compiles() - before == 2 and entry_bytes(0.625) in obj
  ninth = table.copy()
  ninth[1000] = table[1000] * (1 + 1e-9)
  lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=ninth))
  assert compiles() - before == 3
  assert lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=table.copy()))[0] == first
  assert compiles() - before == 3


ENTRY = '''
  import json, sys
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  import cute_kernels as K
  mode, value = sys.argv[1], float(sys.argv[2])
  x = jax.ShapeDtypeStruct((4096,), jnp.float32)
  if mode == "module table":
    K.TABLE[K.PICK] = value
    call = jmf.cute_call(K.add_table_entry, output_shape_dtype=x)
  else:
    table = np.linspace(0.0, 1.0, 2000)
    table[1000] = value
    call = jmf.cute_call(K.add_entry_of, output_shape_dtype=x, table=table)
  text = jax.jit(call).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  stats = jmf.kernel_cache_stats()
  print(json.dumps({"compiles": stats.compiles["cute"], "disk_hits": stats.disk_hits}))
'''


@pytest.mark.parametrize("mode", ["module table", "array constexpr"])
def test_a_changed_entry_is_not_served_from_the_disk_cache_of_another_process(tmp_path, mode):
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}

  def run(value: str) -> dict:
    return fresh_process.run(ENTRY, mode, value, env=env).result

  assert run("0.123456789") == {"compiles": 1, "disk_hits": 0}
  assert run("0.123456788") == {"compiles": 1, "disk_hits": 0}  # its ninth digit: compiled, not the other's
  assert run("0.123456789") == {"compiles": 0, "disk_hits": 1}  # the first's, from disk


def test_a_compile_key_is_keyed_exactly_or_refused(isolated_disk_cache):
  table = np.zeros(2000)
  edited = table.copy()
  edited[1000] = 1.0
  before = compiles()
  one = lowered_kernel(jmf.cute_call(K.add_one, output_shape_dtype=X, compile_key=("v1", table)))[0]
  two = lowered_kernel(jmf.cute_call(K.add_one, output_shape_dtype=X, compile_key=("v1", edited)))[0]
  assert compiles() - before == 2 and one == two  # the same code: two keys, two compiles, one object
  with pytest.raises(jmf.LaunchError, match=r"compile_key=.* cannot be keyed exactly .*Pass a str, bytes"):
    jmf.cute_call(K.add_one, output_shape_dtype=X, compile_key=object())


def test_a_constexpr_that_cannot_be_read_is_keyed_by_a_trace(isolated_disk_cache):
  class Table:  # an object neither value_key nor the fingerprint reads (slots, no __dict__): keyed by a trace
    __slots__ = ("entry",)

    def __init__(self, entry):
      self.entry = entry

    def __getitem__(self, i):
      return self.entry

  before = compiles()
  low = lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=Table(0.25)))
  high = lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=Table(0.5)))
  assert low != high and compiles() - before == 2
  assert entry_bytes(0.25) in low[1] and entry_bytes(0.5) in high[1]
  assert lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=Table(0.25)))[0] == low[0]
  assert compiles() - before == 2  # the trace keys the same value alike



def test_a_function_constexpr_is_keyed_by_its_code(isolated_disk_cache):
  # An epilogue or a mask passed as a constexpr: keyed by the code and data it reaches, as the launcher is.
  def make(entry):
    class Table:
      def __getitem__(self, i):
        return entry
    return Table()

  before = compiles()
  low = lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=make(0.25)))
  high = lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=make(0.5)))
  again = lowered_kernel(jmf.cute_call(K.add_entry_of, output_shape_dtype=X, table=make(0.25)))
  assert low[0] != high[0] and again[0] == low[0] and compiles() - before == 2
  assert entry_bytes(0.25) in low[1] and entry_bytes(0.5) in high[1]


def test_every_dsl_setting_that_changes_its_compile_is_in_the_key(monkeypatch):
  """The DSL's own list of its settings (each marked affects_compile or not, as its own cache key reads them):
  each one that changes the compile is an environment variable our key reads."""
  from cutlass.cutlass_dsl.cutlass import CuTeDSL
  from jax_mosaic_ffi.cute.compiler import keys as cute_keys
  env = CuTeDSL._get_dsl().envar
  names = [f"{env.prefix}_{entry.source}" for entry in type(env)._ENV_VAR_SPEC
           if entry.affects_compile and isinstance(entry.source, str)]
  assert "CUTE_DSL_LINEINFO" in names, names
  for name in names:
    monkeypatch.delenv(name, raising=False)
    before = cute_keys.settings_key()
    monkeypatch.setenv(name, "1")
    assert cute_keys.settings_key() != before, name
