"""Keys by proof (base/value_key.py, base/code_key.py, base/code_origin.py, base/dynamic_reads.py): the reader
admits only what it reads whole. Each test edits what a kernel reads, through a pattern an earlier reader keyed
by text, by name or not at all, and checks the key changed, or that the value is refused (its front end then keys
the kernel by its IR); a refusal is never a crash, and a key is the same in every process."""

import builtins
import dataclasses
import enum
import functools
import importlib.util
import json
import os
import posixpath
import sys
import textwrap
import types
import typing

import numpy as np
import pytest

from jax_mosaic_ffi.base import code_origin
from jax_mosaic_ffi.base.errors import ValueKeyError
from jax_mosaic_ffi.base.value_key import value_key
from jax_mosaic_ffi.cute.compiler import keys as cute_keys
from jax_mosaic_ffi.triton.compiler import keys as triton_keys

import benchmarks_package
import fresh_process
from triton_required import import_triton


def load(folder, name: str, text: str):
  """A module of the user's from its text, under ``name`` (not put in sys.modules: no import sees it)."""
  path = folder / f"{name}.py"
  path.write_text(textwrap.dedent(text))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def refused(value, match: str = "") -> bool:
  try:
    value_key(value)
  except ValueKeyError as e:
    assert match in str(e), str(e)
    return True
  return False


def test_a_namespace_is_read_whole_not_by_its_text():
  table = np.linspace(0.0, 1.0, 2000)
  edited = table.copy()
  edited[1000] += 1e-9
  assert repr(types.SimpleNamespace(t=table)) == repr(types.SimpleNamespace(t=edited))
  assert value_key(types.SimpleNamespace(t=table)) != value_key(types.SimpleNamespace(t=edited))

  def scale(x):
    return x * 2.0

  def scale_edited(x):
    return x * 3.0

  scale_edited.__qualname__ = scale.__qualname__
  assert value_key(types.SimpleNamespace(f=scale)) != value_key(types.SimpleNamespace(f=scale_edited))


def test_typing_is_read_by_its_parts():
  table = np.linspace(0.0, 1.0, 2000)
  edited = table.copy()
  edited[7] = 5.0
  assert value_key(typing.Annotated[float, table]) != value_key(typing.Annotated[float, edited])
  assert value_key(list[int]) != value_key(list[float])
  assert value_key(typing.Optional[int]) == value_key(typing.Optional[int])
  assert value_key(typing.Literal[1]) != value_key(typing.Literal[True])


def test_reads_by_a_computed_name_or_of_the_process_are_refused():
  def by_globals(name):
    return globals()[name]

  def by_environ():
    return os.environ.get("BLOCK", "64")

  def by_getenv():
    return os.getenv("BLOCK")

  getenv = os.getenv

  def by_imported_getenv():
    return getenv("BLOCK")

  def by_eval(text):
    return eval(text)  # noqa: S307  (the pattern under test)

  def by_import(name):
    return __import__(name)

  def by_modules(name):
    return sys.modules[name]

  def by_importlib(name):
    return importlib.import_module(name)

  def by_file(path):
    return open(path).read()  # noqa: SIM115  (the pattern under test)

  for fn, what in ((by_globals, "globals()"), (by_environ, "os.environ"), (by_getenv, "os.getenv"),
                   (by_imported_getenv, "os.getenv"), (by_eval, "eval()"), (by_import, "__import__()"),
                   (by_modules, "sys.modules"), (by_importlib, "importlib"), (by_file, "open()")):
    assert refused(fn, what), fn.__name__
  assert refused(os.environ, "os.environ") and refused(sys.argv, "sys.argv")



def test_the_environment_through_another_library_module_is_refused(tmp_path):
  user = load(tmp_path, "fz_through", """
    import posixpath

    def block():
      return posixpath.os.environ["BLOCK"]  # a library module that imported os hands it on
    """)
  assert "os" not in vars(user) and refused(user.block, "os.environ")


def test_a_module_read_by_computed_name_is_read_whole(tmp_path):
  keys = []
  for a in ("1.0", "2.0"):
    helpers = load(tmp_path, "fz_helpers", f"HELPER_A = {a}\nHELPER_B = 0.5\n")
    user = load(tmp_path, "fz_user", """
      def pick(kind):
        return getattr(helpers, "HELPER_" + kind)
      """)
    user.helpers = helpers
    keys.append(value_key(user.pick))
  assert keys[0] != keys[1]


@pytest.mark.parametrize("body, read", [
    ("return float(os.path.expandvars('$BLOCK'))", "os.path.expandvars"),
    ("return float(os.path.expanduser('~').count('/'))", "os.path.expanduser"),
    ("return float(pathlib.Path(NAME).read_text())", "pathlib.Path.read_text"),
    ("return float(len(os.listdir('.')))", "os.listdir"),
    ("return float(np.loadtxt(NAME))", "numpy.loadtxt"),
    ("return float(getattr(shutil, 'o' + 's').environ['BLOCK'])", "an attribute of os by a computed name"),
    ("return float(subprocess.check_output(['cat', NAME]))", "subprocess.check_output"),
])
def test_what_library_functions_read_for_the_code_is_refused(tmp_path, body, read):
  # D31: the environment, a file, a folder, a program, read through a library function: no key of the code holds
  # what they give, so the kernel is keyed by its IR.
  user = load(tmp_path, "fz_outside", f"""
    import os, pathlib, shutil, subprocess
    import numpy as np
    NAME = "block.txt"

    def block():
      {body}
    """)
  assert refused(user.block, read)


def test_a_module_handed_to_a_library_function_is_read_whole(tmp_path):
  # D31: operator.attrgetter(computed)(module), inspect.getmembers(module): the module is a value the code hands on,
  # so every attribute of it is read, whatever the function that reads them.
  for body in ("return operator.attrgetter('HELPER_' + kind)(helpers)",
               "return dict(inspect.getmembers(helpers))['HELPER_' + kind]",
               "return functools.reduce(getattr, ['HELPER_' + kind], helpers)"):
    keys = []
    for a in ("1.0", "2.0"):
      helpers = load(tmp_path, "fz_helpers", f"HELPER_A = {a}\nHELPER_B = 0.5\n")
      user = load(tmp_path, "fz_user", f"""
        import functools, inspect, operator

        def pick(kind):
          {body}
        """)
      user.helpers = helpers
      keys.append(value_key(user.pick))
    assert keys[0] != keys[1], body
  # A module read only for the attributes the code names keeps its other attributes out of the key.
  keys = []
  for a in ("1.0", "2.0"):
    helpers = load(tmp_path, "fz_helpers", f"HELPER_A = {a}\nHELPER_B = 0.5\n")
    user = load(tmp_path, "fz_user", "def pick():\n  return helpers.HELPER_B\n")
    user.helpers = helpers
    keys.append(value_key(user.pick))
  assert keys[0] == keys[1]


def test_an_attribute_the_program_set_on_a_library_module_is_read(tmp_path, monkeypatch):
  # D31: np.FZ_BIAS = ... is the program's value, not numpy's; the function it sets there is the program's code.
  user = load(tmp_path, "fz_library_attribute", """
    import numpy as np

    def bias():
      return np.FZ_BIAS + np.fz_helper()
    """)
  keys = set()
  for value, helper in ((0.5, lambda: 1.0), (0.75, lambda: 1.0), (0.75, lambda: 2.0)):
    monkeypatch.setattr(np, "FZ_BIAS", value, raising=False)
    monkeypatch.setattr(np, "fz_helper", helper, raising=False)
    keys.add(value_key(user.bias))
  assert len(keys) == 3


def test_a_library_module_is_keyed_by_its_release(tmp_path):
  from jax_mosaic_ffi.base import library_modules
  import importlib.metadata
  assert library_modules.release("numpy") == f"numpy {importlib.metadata.version('numpy')}"
  assert library_modules.release("json") == f"python {sys.version.split()[0]}"


def test_a_dict_in_a_hashs_order_is_left_to_the_ir_and_data_keeps_its_order():
  # D24: a dict built from a set of strings has the set's order, which differs from process to process; where an IR
  # stands in (ir=True) it is refused, so its kernel keys alike in every process. Data (no IR) keeps its order, and
  # so do a sorted dict and one of integers.
  from_a_set = {name: len(name) for name in {"alpha", "beta", "gamma", "delta"}}
  if list(from_a_set) == sorted(from_a_set):  # the set happened to iterate in sorted order in this process
    from_a_set = dict(reversed(from_a_set.items()))
  with pytest.raises(ValueKeyError, match="a dict whose keys are not in sorted order"):
    value_key(from_a_set, ir=True)
  assert value_key(from_a_set) != value_key(dict(sorted(from_a_set.items())))
  for kept in (dict(sorted(from_a_set.items())), {3: 1, 1: 2}, {"only": 1}):
    value_key(kept, ir=True)


def test_a_module_imported_inside_a_function_is_read(tmp_path, monkeypatch):
  user = load(tmp_path, "fz_importer", """
    def scale():
      import fz_local_params
      from fz_local_params import OFFSET
      return fz_local_params.SCALE + OFFSET
    """)
  keys = []
  for scale in ("1.0", "2.0"):
    monkeypatch.setitem(sys.modules, "fz_local_params", load(tmp_path, "fz_local_params",
                                                             f"SCALE = {scale}\nOFFSET = 0.5\n"))
    keys.append(value_key(user.scale))
  assert keys[0] != keys[1]
  monkeypatch.delitem(sys.modules, "fz_local_params")
  assert refused(user.scale, "not imported yet")


def test_a_builtin_a_program_set_is_read_like_a_global(monkeypatch):
  def scale(x):
    return x * FZ_SCALE  # noqa: F821  (set on builtins below)

  keys = []
  for value in (1.0, 2.0):
    monkeypatch.setattr(builtins, "FZ_SCALE", value, raising=False)
    keys.append(value_key(scale))
  assert keys[0] != keys[1]


def test_a_module_that_computes_its_attributes_is_refused(tmp_path):
  lazy = load(tmp_path, "fz_lazy", """
    def __getattr__(name):
      return 2.0
    """)

  def reads(x):
    return x * lazy.SCALE

  assert refused(reads, "__getattr__")


def test_a_module_held_as_a_value_is_read_whole(tmp_path):
  keys = []
  for scale in ("2.0", "3.0"):
    module = load(tmp_path, "fz_held", f"SCALE = {scale}\n")
    keys.append(value_key(types.SimpleNamespace(ops=module)))
  assert keys[0] != keys[1]


@pytest.mark.parametrize("name", ["queue", "profile", "json"])
def test_a_users_module_named_like_the_standard_librarys_is_the_users(tmp_path, name):
  keys = []
  for body in ("x * 2", "x * 3"):
    module = load(tmp_path, name, f"def scale(x):\n  return {body}\n")
    assert module.scale.__module__ == name
    keys.append(value_key(module.scale))
  assert keys[0] != keys[1]
  assert code_origin.Libraries(frozenset()).function(json.dumps)


def test_a_function_wrapped_to_look_like_a_librarys_is_read():
  def make(factor):
    @functools.wraps(json.dumps)
    def dumps(x):
      return x * factor
    return dumps

  assert make(2).__module__ == "json" and make(2).__qualname__ == "dumps"
  assert value_key(make(2)) != value_key(make(3))


def test_every_attribute_of_a_function_is_read_the_private_ones_too():
  def kernel(x):
    return x

  kernel._block = 64
  first = value_key(kernel)
  kernel._block = 128
  assert value_key(kernel) != first


def test_attributes_set_on_a_partial_are_read():
  bound = functools.partial(max, 1)
  bound.block = 64
  first = value_key(bound)
  bound.block = 128
  assert value_key(bound) != first


def test_attributes_set_on_an_enum_member_are_read():
  class Mode(enum.Enum):
    FAST = 1

  Mode.FAST.block = 64
  first = value_key(Mode.FAST)
  Mode.FAST.block = 128
  assert value_key(Mode.FAST) != first


def _subclass_keys(base, edit):
  """The keys of an instance of a user's subclass of ``base`` whose method returns ``edit`` (two versions)."""
  keys = []
  for value in edit:
    cls = type("Sub", (base,), {"extra": (lambda v: lambda self: v)(value)})
    try:
      keys.append(value_key(cls(lambda: 0)))
    except ValueKeyError:
      keys.append("refused")
  return keys


@pytest.mark.parametrize("base", [functools.partial, property, staticmethod, classmethod,
                                  functools.cached_property])
def test_subclasses_of_the_types_the_reader_knows_are_read_as_theirs_or_refused(base):
  first, second = _subclass_keys(base, (1.0, 2.0))
  assert first == second == "refused" or first != second


def test_a_structured_dtype_is_keyed_whole():
  packed = np.dtype([("a", "<f4"), ("b", "<i4")])
  padded = np.dtype({"names": ["a", "b"], "formats": ["<f4", "<i4"], "offsets": [0, 8], "itemsize": 16})
  swapped = np.dtype({"names": ["a", "b"], "formats": ["<f4", "<i4"], "offsets": [4, 0]})
  nested = np.dtype([("a", "<f4", (2,)), ("b", "<i4")])
  nested_other = np.dtype([("a", "<f4", (3,)), ("b", "<i4")])
  keys = [value_key(d) for d in (packed, padded, swapped, nested, nested_other)]
  assert len(set(keys)) == len(keys)


def test_what_the_reader_cannot_order_or_read_is_refused_not_a_crash():
  class Holder:
    pass

  odd = Holder()
  odd.__dict__[1] = 2
  assert refused(odd, "named by a int")

  class Computed:
    @property
    def __dict__(self):
      return {"x": 1}

  assert refused(Computed(), "defines __dict__")

  class Raising:
    __slots__ = ("x",)

    def __init__(self):
      self.x = 1

  weird = types.SimpleNamespace()
  weird.__dict__[("not", "a", "name")] = 1
  assert refused(weird)
  assert not refused(Raising())
  assert refused(dataclasses.field(default=1))  # a field of no class: refused, never AttributeError


def test_subclasses_of_numpy_scalars_are_not_keyed_as_numpys():
  class Scaled(np.float64):
    pass

  assert refused(Scaled(1.0)) or value_key(Scaled(1.0)) != value_key(np.float64(1.0))


def test_a_library_is_decided_by_where_its_code_lives(tmp_path):
  libraries = code_origin.Libraries(frozenset())
  # A frozen standard module's code names no file: it is the standard library's where its module holds it.
  assert posixpath.join.__code__.co_filename.startswith("<frozen") and libraries.function(os.path.join)
  forged = types.FunctionType(compile("def join(): pass", "<frozen posixpath>", "exec").co_consts[0], {})
  forged.__module__ = "posixpath"
  assert not libraries.function(forged)
  user = load(tmp_path, "json", "class JSONEncoder:\n  def encode(self, o):\n    return ''\n")
  assert libraries.cls(json.JSONEncoder) and not libraries.cls(user.JSONEncoder)
  assert not libraries.module(user)


def test_a_triton_type_is_keyed_by_every_attribute():
  tl = import_triton().language
  global_memory, shared_memory = tl.pointer_type(tl.float32, 1), tl.pointer_type(tl.float32, 3)
  assert str(global_memory) == str(shared_memory)
  assert triton_keys.exact(global_memory) != triton_keys.exact(shared_memory)


KEYS = '''
  import functools, json, sys, types
  import numpy as np
  from jax_mosaic_ffi.base.value_key import value_key

  def scale(x):
    return x * 2.0

  values = [{"b", "a", "c"}, frozenset({"x", "y"}), types.SimpleNamespace(f=scale, t=np.arange(3.0)),
            functools.partial(scale, 1.0), scale]
  print(json.dumps([value_key(v).hex() for v in values]))
'''


def test_keys_are_the_same_in_every_process():
  runs = [fresh_process.run(KEYS, env={"PYTHONHASHSEED": seed}).result for seed in ("1", "2", "3")]
  assert runs[0] == runs[1] == runs[2]


CORPUS = [("cute_gemm", ("hopper_gemm",)), ("cute_rmsnorm", ("rmsnorm",)), ("cute_elementwise", ("axpy", "add_one")),
          ("fa4_user", ("attention_launch", "backward_launch")),
          ("quack_user", ("softmax_launch", "softmax_backward_launch")),
          ("triton_user", ("grouped_matmul", "attention_fwd", "softmax_kernel", "layer_norm_fwd", "add_one")),
          ("gluon_user", ("blocked_matmul_pipelined",))]


@pytest.mark.parametrize("name, kernels", CORPUS, ids=[name for name, _ in CORPUS])
def test_the_corpus_kernels_keep_their_fast_key(name, kernels):
  """The warm start: every kernel of the corpus (benchmarks/kernels/) is read, none sent to its IR key."""
  if name.startswith(("triton", "gluon")):
    import_triton()
  else:
    pytest.importorskip("cutlass.cute")
  if name in ("fa4_user", "quack_user"):
    pytest.importorskip("flash_attn.cute" if name == "fa4_user" else "quack")
  module = benchmarks_package.module(f"kernels.{name}")
  for kernel in kernels:
    value = getattr(module, kernel)
    key = (cute_keys.fingerprint(value) if name.startswith(("cute", "fa4", "quack"))
           else triton_keys.constexpr_key(value))
    assert key is not None, f"{name}.{kernel} is keyed by its IR: a warm start traces it"
