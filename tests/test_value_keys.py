"""The one lossless value key (jax_mosaic_ffi/base/value_key.py) and the Triton keys built on it: two values share
a key only when they are equal and of the same types (an entry in the middle of 2000, a float's ninth digit, 0.0
and -0.0 tell apart), what cannot be keyed exactly is refused by name, and a Triton kernel whose array constexpr
changed is compiled again, in memory, across processes and under @triton.autotune."""

import dataclasses
import enum

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.errors import ValueKeyError
from jax_mosaic_ffi.base.value_key import value_key

import fresh_process
from hlo_inspect import custom_calls


class Mode(enum.Enum):
  FAST = 1
  EXACT = 2


@dataclasses.dataclass(frozen=True)
class Tile:
  m: int
  scale: float


def same(a, b) -> bool:
  return value_key(a) == value_key(b)


def test_values_that_print_alike_get_different_keys():
  table = np.linspace(0.0, 1.0, 2000)
  edited = table.copy()
  edited[1000] += 1e-12
  assert repr(table) == repr(edited) and not same(table, edited)
  small = np.array([0.123456789, 2.0])
  assert repr(small) == repr(np.array([0.123456788, 2.0])) and not same(small, np.array([0.123456788, 2.0]))
  assert not same(1.00000001, 1.000000011) and not same(0.0, -0.0)
  assert not same(np.float32(0.1), np.float32(np.nextafter(np.float32(0.1), np.float32(1))))
  assert same(table, table.copy()) and same(float("nan"), float("nan"))


def test_types_are_part_of_the_key():
  assert not same(1, 1.0) and not same(1, True) and not same((1, 2), [1, 2]) and not same("a", b"a")
  assert not same(np.float32(1), np.float64(1)) and not same(np.float32(1), 1.0)
  assert not same(np.zeros(4, np.float16), np.zeros(4, ml_dtypes.bfloat16))  # same bytes, other dtype
  assert not same(np.zeros((2, 2)), np.zeros(4)) and not same(np.zeros(4), jnp.zeros(4, jnp.float64))
  assert not same(jnp.float32, np.float32) and not same(np.dtype(np.float32), np.float32)
  assert not same(Mode.FAST, 1) and not same(Mode.FAST, Mode.EXACT)
  assert not same(Tile(128, 0.5), (128, 0.5)) and not same(Tile(128, 0.5), Tile(128, 0.5000000001))
  assert same(Tile(128, 0.5), Tile(128, 0.5))


def test_containers_key_their_items():
  assert same({"b", "a", 3}, {3, "a", "b"})  # a set has no order
  assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1})  # a dict keeps its order, which code iterating it sees
  assert not same((np.zeros(2000),), (np.ones(2000),))
  assert same(jnp.arange(2000.0), jnp.arange(2000.0))
  assert not same(jnp.arange(2000.0), jnp.arange(2000.0).at[1000].add(1e-3))


def test_what_cannot_be_keyed_exactly_is_refused_by_name():
  with pytest.raises(ValueKeyError, match="builtins.object cannot be keyed exactly"):
    value_key(object())
  with pytest.raises(ValueKeyError, match="Python objects"):
    value_key(np.array([object()]))
  looped = [1]
  looped.append(looped)
  with pytest.raises(ValueKeyError, match="contains itself"):
    value_key(looped)

  def traced(x):
    value_key(x)
    return x

  with pytest.raises(ValueKeyError, match="traced value"):
    jax.jit(traced)(1.0)


def test_extra_keys_what_the_caller_knows():
  class Named:
    def __init__(self, name):
      self.name = name

  def extra(v):
    return f"named {v.name}".encode() if isinstance(v, Named) else None

  assert value_key((Named("a"), 1), extra=extra) == value_key((Named("a"), 1), extra=extra)
  assert value_key(Named("a"), extra=extra) != value_key(Named("b"), extra=extra)
  assert value_key(Named("a"), extra=extra) != value_key("named a")
  with pytest.raises(ValueKeyError):
    value_key(Named("a"))


# ---------------------------------------------------------------------------------------------- Triton

X = jax.ShapeDtypeStruct((4096,), jnp.float32)


def triton_sources():
  from triton_required import import_triton
  import_triton()
  import triton_sources as ts
  return ts


def entry_of(table, kernel=None):
  """The PTX of add_entry_of with this table, through triton_call."""
  ts = triton_sources()

  def call(x):
    return jmf.triton_call(x, kernel=kernel or ts.add_entry_of, out_type=x, n=x.size,
                           grid=lambda meta: (jmf.cdiv(x.size, meta["BLOCK"]),), TABLE=table,
                           **({} if kernel else {"BLOCK": 256}))

  (cc,) = custom_calls(jax.jit(call).trace(X).lower(lowering_platforms=("cuda",)))
  (ptx,) = [i.data.decode() for i in module_format.parse(cc["config"]["module"]).images
            if i.kind == module_format.ImageKind.PTX]
  return cc["config"]["kernel_hash"], ptx


def ptx_constant(value: float) -> str:
  return "0f" + np.float32(value).tobytes()[::-1].hex().upper()


def test_a_triton_array_constexpr_edited_in_its_middle_compiles_again(isolated_disk_cache):
  table = np.linspace(0.0, 1.0, 2000)
  edited = table.copy()
  edited[1000] = 0.625
  first, _ = entry_of(table)
  changed, ptx = entry_of(edited)
  assert changed != first and ptx_constant(0.625) in ptx
  assert entry_of(table.copy())[0] == first


def test_an_autotuned_triton_kernel_takes_the_edited_table(isolated_disk_cache):
  ts = triton_sources()
  table = np.linspace(0.0, 1.0, 2000)
  edited = table.copy()
  edited[1000] = 0.375
  _, before = entry_of(table, ts.add_entry_of_tuned)
  _, after = entry_of(edited, ts.add_entry_of_tuned)  # the configs' metas differ only in the table's middle
  assert ptx_constant(0.375) in after and ptx_constant(0.375) not in before


def test_a_triton_constexpr_that_cannot_be_keyed_is_refused(isolated_disk_cache):
  ts = triton_sources()

  def call(x):
    return jmf.triton_call(x, kernel=ts.add_entry_of, out_type=x, n=x.size, grid=(16,), TABLE=object(), BLOCK=256)

  with pytest.raises(jmf.LaunchError, match=r"triton_kernel 'add_entry_of': the constexpr TABLE = <object"
                                            r".*cannot be keyed exactly"):
    jax.jit(call).trace(X)


TRITON_ENTRY = '''
  import json, sys
  import jax, jax.numpy as jnp, numpy as np
  import jax_mosaic_ffi as jmf
  import triton_sources as ts
  table = np.linspace(0.0, 1.0, 2000)
  table[1000] = float(sys.argv[1])
  x = jax.ShapeDtypeStruct((4096,), jnp.float32)
  call = lambda x: jmf.triton_call(x, kernel=ts.add_entry_of, out_type=x, n=x.size, grid=(16,), TABLE=table,
                                   BLOCK=256)
  jax.jit(call).trace(x).lower(lowering_platforms=("cuda",))
  stats = jmf.kernel_cache_stats()
  print(json.dumps({"compiles": stats.triton_compiles, "disk_hits": stats.disk_hits}))
'''


def test_a_triton_table_edited_in_its_ninth_digit_is_not_served_from_disk(tmp_path):
  triton_sources()
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}
  first = fresh_process.run(TRITON_ENTRY, "0.123456789", env=env).result
  second = fresh_process.run(TRITON_ENTRY, "0.123456788", env=env).result
  third = fresh_process.run(TRITON_ENTRY, "0.123456789", env=env).result
  assert first["compiles"] == 1 and second["compiles"] == 1
  assert third["compiles"] == 0 and third["disk_hits"] >= 1
