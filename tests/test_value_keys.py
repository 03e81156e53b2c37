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


def test_what_cannot_be_read_whole_is_refused_by_name():
  with pytest.raises(ValueKeyError, match="builtins.object without attributes"):
    value_key(object())
  with pytest.raises(ValueKeyError, match="Python objects"):
    value_key(np.array([object()]))

  def traced(x):
    value_key(x)
    return x

  with pytest.raises(ValueKeyError, match="traced value"):
    jax.jit(traced)(1.0)


def test_subclasses_of_arrays_and_containers_are_refused_not_read_in_part():
  # A masked array's mask and np.matrix's type live outside the ndarray's bytes.
  with pytest.raises(ValueKeyError, match="MaskedArray, a subclass of numpy.ndarray"):
    value_key(np.ma.masked_array([1.0, 2.0], mask=[False, True]))
  with pytest.raises(ValueKeyError, match="numpy.matrix, a subclass of numpy.ndarray"):
    value_key(np.matrix([[1.0]]))

  class Table(dict):
    pass

  with pytest.raises(ValueKeyError, match="Table, a subclass of builtins.dict"):
    value_key(Table(a=1))


def test_instances_that_compute_their_face_are_refused():
  class Proxy:
    def __getattr__(self, name):
      return 3

  class Loose:
    def __init__(self, v):
      self.v = v

    def __eq__(self, other):
      return True

    __hash__ = object.__hash__

  with pytest.raises(ValueKeyError, match="defines __getattr__"):
    value_key(Proxy())
  with pytest.raises(ValueKeyError, match="defines __eq__"):
    value_key(Loose(1))


def test_instances_are_keyed_by_every_attribute_and_their_class_code():
  @dataclasses.dataclass
  class Config:
    block: int

    def scale(self):
      return 2.0

  a, b = Config(128), Config(128)
  assert same(a, b)
  b.extra = 1  # an attribute outside the dataclass's fields
  assert not same(a, b)

  def make(factor):
    class Config:  # two classes of one qualified name, made by a factory
      block = 128

      def scale(self):
        return factor
    return Config

  assert not same(make(2.0)(), make(3.0)()) and same(make(2.0)(), make(2.0)())


def test_enum_members_are_keyed_with_their_class():
  def make(value):
    class Mode(enum.Enum):
      FAST = value

      def factor(self):
        return 2
    return Mode

  assert not same(make(1).FAST, make(2).FAST) and same(make(1).FAST, make(1).FAST)


def test_self_references_are_finite_and_sharing_is_no_part_of_the_key():
  looped = [1]
  looped.append(looped)
  assert same(looped, looped) and not same(looped, [1, [1]])

  @dataclasses.dataclass(frozen=True)
  class Node:
    items: list

  inner = [1]
  nested = frozenset({Node((1,)), 2})  # a set whose member holds a list that holds the set
  inner.append(nested)
  assert same(nested, nested)
  shared = (1.0, 2.0)
  assert same((shared, shared), ((1.0, 2.0), (1.0, 2.0)))  # one object twice or two equal ones: one key


def test_structured_arrays_are_keyed_without_their_padding():
  dtype = np.dtype({"names": ["a", "b"], "formats": ["i1", "f8"], "offsets": [0, 8], "itemsize": 16})
  first = np.zeros(3, dtype)
  second = np.frombuffer(bytes(range(48)), dtype).copy()
  second["a"], second["b"] = 0, 0.0  # the same fields; other bytes in the padding
  assert first.tobytes() != second.tobytes() and same(first, second)
  second["b"][1] = 1.0
  assert not same(first, second)


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


def test_a_triton_constexpr_that_cannot_be_read_whole_is_keyed_by_its_ttir(isolated_disk_cache):
  triton_sources()

  class Table:  # indexes like an array, but what it gives the kernel is computed: keyed by the IR it makes
    def __init__(self, entry):
      self.entry = entry

    def __getitem__(self, i):
      return self.entry

    def __eq__(self, other):
      return True

    __hash__ = object.__hash__

  _, ptx = entry_of(Table(0.625))
  _, other = entry_of(Table(0.375))
  assert ptx_constant(0.625) in ptx and ptx_constant(0.375) in other


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
  print(json.dumps({"compiles": stats.compiles["triton"], "disk_hits": stats.disk_hits}))
'''


def test_a_triton_table_edited_in_its_ninth_digit_is_not_served_from_disk(tmp_path):
  triton_sources()
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}
  first = fresh_process.run(TRITON_ENTRY, "0.123456789", env=env).result
  second = fresh_process.run(TRITON_ENTRY, "0.123456788", env=env).result
  third = fresh_process.run(TRITON_ENTRY, "0.123456789", env=env).result
  assert first["compiles"] == 1 and second["compiles"] == 1
  assert third["compiles"] == 0 and third["disk_hits"] >= 1


def test_tritons_knobs_that_reach_a_compile_are_in_the_key(monkeypatch):
  """Triton's list of its settings (its knobs, set from the environment or by code) is read whole."""
  triton_sources()
  from triton import knobs
  from jax_mosaic_ffi.triton.compiler import keys as triton_keys
  before = triton_keys.settings_key()
  with knobs.compilation.scope():
    knobs.compilation.allow_non_constexpr_globals = True
    assert triton_keys.settings_key() != before
  monkeypatch.setenv("TRITON_OVERRIDE_ARCH", "sm90")
  assert triton_keys.settings_key() != before
  monkeypatch.delenv("TRITON_OVERRIDE_ARCH")
  assert triton_keys.settings_key() == before


def test_structured_fields_are_keyed_with_their_dtypes():
  ints = np.zeros(2, [("a", "<i4"), ("b", "<i4")])
  floats = np.zeros(2, [("a", "<f4"), ("b", "<i4")])
  assert ints.tobytes() == floats.tobytes() and not same(ints, floats)
