"""The edit fuzzer's corpus for keys by proof (issue 68): per wing, a program whose kernel reads through the
patterns an earlier reader keyed by text, by a trusted name or not at all (they must be read, and an edit of each
must change the key), and a program whose kernel reads what no key of its code holds (the environment, a global
by computed name, ``eval``, a module's ``__getattr__``: that kernel must be keyed by its IR, so an edit still
changes the key). tests/test_key_fuzz.py runs them with key_fuzz.py's programs."""

from __future__ import annotations

from key_fuzz import Edit, Program

# A user's module named like the standard library's, loaded from the program's folder (not put in sys.modules,
# so the test process's own ``profile`` is untouched), and one that computes its attributes.
_LOCAL_MODULES = '''
  import importlib.util, os


  def _local(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


  profile = _local("profile", "profile.py")
  lazy = _local("fz_lazy", "fz_lazy.py")
  helpers = _local("fz_helpers", "fz_helpers.py")
'''
_FILES = (("profile.py", "SCALE = {profile}\n"),
          ("fz_lazy.py", "def __getattr__(name):\n  return {lazy}\n"),
          ("fz_helpers.py", "SCALE_A = 0.5\nSCALE_B = {helper}\nSCALE_C = {attrgetter}\nSCALE_D = {members}\n"),
          ("fz_data.txt", "{data}\n"))

# What the kernel reads through patterns the reader must read whole (a plain Python function: a Triton
# constexpr_function's body, or a CuTe DSL launcher's helper).
_READS = '''
  import enum, functools, inspect, math, operator, types, typing
  import numpy as np

  np.FZ_BIAS = {np_bias}  # an attribute the program sets on a library's module

  NS = types.SimpleNamespace(table=np.linspace(0.0, 1.0, 2000) + {ns_entry} * (np.arange(2000) == 1000),
                             scale=lambda: {ns_fn})
  META = typing.Annotated[float, {meta}]
  DT = np.dtype({{"names": ["a", "b"], "formats": ["<f4", "<f4"], "offsets": [0, {offset}], "itemsize": 16}})


  @functools.wraps(math.sqrt)
  def lookalike():
    return {wraps}


  def with_attribute():
    return 0.0


  with_attribute._scale = {private}


  class Mode(enum.Enum):
    ON = 1


  Mode.ON.extra = {enum_attr}


  class Cached(functools.cached_property):
    def extra(self):
      return {cached}


  CACHED = Cached(lambda self: 0.0)


  def extras_value():
    return (float(NS.table[1000]) + NS.scale() + META.__metadata__[0] + DT.fields["b"][1] / 100.0 + lookalike()
            + with_attribute._scale + Mode.ON.extra + profile.SCALE + CACHED.extra() + np.FZ_BIAS
            + operator.attrgetter("SCALE_" + "C")(helpers) + dict(inspect.getmembers(helpers))["SCALE_D"])
'''
_READS_HOLES = {"ns_entry": "0.0", "ns_fn": "0.25", "meta": "0.5", "offset": "4", "wraps": "0.125",
                "private": "0.0625", "enum_attr": "0.03125", "profile": "1.5", "cached": "0.75", "np_bias": "0.5"}
_READS_EDITS = (
    Edit("a table a SimpleNamespace holds, in its middle", "namespace", (("ns_entry", "1.0"),)),
    Edit("a function a SimpleNamespace holds", "namespace", (("ns_fn", "0.375"),)),
    Edit("typing.Annotated's metadata", "typing", (("meta", "0.625"),)),
    Edit("a structured dtype's offset", "structured dtype", (("offset", "8"),)),
    Edit("a user function under functools.wraps(math.sqrt)", "trusted name", (("wraps", "0.25"),)),
    Edit("a private attribute of a function", "function attribute", (("private", "0.1875"),)),
    Edit("an attribute set on an enum member", "enum member attribute", (("enum_attr", "0.09375"),)),
    Edit("a user's profile.py", "module named like the standard library's", (("profile", "2.5"),)),
    Edit("a method of a cached_property subclass", "subclass of a known type", (("cached", "0.875"),)),
    Edit("an attribute the program set on numpy (np.FZ_BIAS)", "library module attribute", (("np_bias", "0.75"),)),
    Edit("a module attribute read by operator.attrgetter(computed)(module)", "module through a library function",
         (("attrgetter", "0.4375"),)),
    Edit("a module attribute read through inspect.getmembers(module)", "module through a library function",
         (("members", "0.3125"),)),
    Edit("the same text again (a namespace holds a lambda)", "control", changes_kernel=False))

# What the kernel reads that no key of its code holds: refused, so the kernel is keyed by its IR.
_DYNAMIC = '''
  import os, pathlib, shutil

  FACTOR_A = {factor}


  def dynamic_value():
    return (float(os.environ.get("FZ_SCALE", "1.0")) + globals()["FACTOR_" + "A"] + eval("FACTOR_" + "A")
            + getattr(helpers, "SCALE_" + "B") + lazy.ANYTHING + through_libraries())


  def through_libraries():
    # What library functions read for the code: the environment, a file.
    data = pathlib.Path(os.path.join(os.path.dirname(__file__), "fz_data.txt")).read_text()
    return (len(os.path.expandvars("${{FZ_EXPANDED}}")) / 8.0 + float(data)  # unset: the text itself
            + float(getattr(shutil, "o" + "s").environ.get("FZ_THROUGH_SHUTIL", "0.25")))
'''
_DYNAMIC_HOLES = {"factor": "0.5", "helper": "0.25", "lazy": "0.125"}
_DYNAMIC_EDITS = (
    Edit("an environment variable it reads", "environment", env=(("FZ_SCALE", "2.0"),)),
    Edit("a global it reads by globals()[computed] and eval", "computed name", (("factor", "0.75"),)),
    Edit("a module attribute read by getattr(module, computed)", "computed name", (("helper", "0.375"),)),
    Edit("what a module's __getattr__ returns", "module __getattr__", (("lazy", "0.0625"),)))
# What library functions read for the launcher (D31): a CuTe DSL launcher calls any Python; Triton and Gluon refuse a
# library function a constexpr_function names, so their kernels cannot read through one.
_THROUGH_LIBRARIES_EDITS = (
    Edit("a variable os.path.expandvars reads", "environment through a library function",
         env=(("FZ_EXPANDED", "1.5"),)),
    Edit("a file pathlib.Path.read_text reads", "file through a library function", (("data", "0.875"),)),
    Edit("a variable read through getattr(shutil, 'o' + 's').environ", "environment through a library module",
         env=(("FZ_THROUGH_SHUTIL", "2.25"),)))
_CONTROL = Edit("the same text again", "control", changes_kernel=False)

# Triton and Gluon run a constexpr_function's body at compile time, and refuse a plain function it names: the
# patterns are inline there, and a namespace holds a JIT function the kernel calls.
_JIT_READS = '''
  import enum, types, typing
  import numpy as np

  np.FZ_BIAS = {np_bias}  # an attribute the program sets on a library's module


  @{jit}
  def epilogue(x):
    return x * {ns_fn}


  TABLES = types.SimpleNamespace(table=np.linspace(0.0, 1.0, 2000) + {ns_entry} * (np.arange(2000) == 1000))
  NS = types.SimpleNamespace(epi=epilogue)  # a constexpr (Triton copies a global's value, and a JIT function's lock
                                            # cannot be copied)
  METAS = (typing.Annotated[float, {meta}],)
  DT = np.dtype({{"names": ["a", "b"], "formats": ["<f4", "<f4"], "offsets": [0, {offset}], "itemsize": 16}})


  class Mode(enum.Enum):
    ON = 1


  Mode.ON.extra = {enum_attr}


  @triton.constexpr_function
  def extra():
    return (float(TABLES.table[1000]) + METAS[0].__metadata__[0] + DT.fields["b"][1] / 100.0 + Mode.ON.extra
            + profile.SCALE + np.FZ_BIAS)
'''
_JIT_READS_HOLES = {"ns_entry": "0.0", "ns_fn": "2.0", "meta": "0.5", "offset": "4", "enum_attr": "0.03125",
                    "np_bias": "0.5"}
_JIT_READS_EDITS = (
    Edit("a table a SimpleNamespace holds, in its middle", "namespace", (("ns_entry", "1.0"),)),
    Edit("a JIT function a SimpleNamespace holds", "namespace", (("ns_fn", "3.0"),)),
    Edit("typing.Annotated's metadata", "typing", (("meta", "0.625"),)),
    Edit("a structured dtype's offset", "structured dtype", (("offset", "8"),)),
    Edit("an attribute set on an enum member", "enum member attribute", (("enum_attr", "0.09375"),)),
    Edit("a user's profile.py", "module named like the standard library's", (("profile", "2.5"),)),
    Edit("an attribute the program set on numpy (np.FZ_BIAS)", "library module attribute", (("np_bias", "0.75"),)),
    Edit("the same text again (a namespace holds a JIT function)", "control", changes_kernel=False))
_JIT_DYNAMIC = '''
  import os

  FACTOR_A = {factor}


  def epilogue(x):
    return x


  @triton.constexpr_function
  def extra():
    return (float(dict(os.environ).get("FZ_SCALE", "1.0")) + globals()["FACTOR_" + "A"] + eval("FACTOR_" + "A")
            + getattr(helpers, "SCALE_" + "B") + lazy.ANYTHING)
'''

_TRITON = '''
  import triton, triton.language as tl
  import jax_mosaic_ffi as jmf
  {body}

  @triton.jit
  def kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr{param}):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, {epilogue}(tl.load(x_ptr + offs, mask=m)) + extra(), mask=m)


  def call(x):
    return jmf.triton_call(x, kernel=kernel, out_type=x, n=x.size, grid=(8,), BLOCK=128{given})
'''

_GLUON = '''
  import numpy as np
  import triton
  from triton.experimental import gluon
  from triton.experimental.gluon import language as gl
  import jax_mosaic_ffi as jmf
  {body}

  @gluon.jit
  def kernel(x_ptr, out_ptr, n, num_warps: gl.constexpr{param}):
    layout: gl.constexpr = gl.BlockedLayout([512 // (32 * num_warps)], [32], [num_warps], [0])
    offsets = gl.program_id(0) * 512 + gl.arange(0, 512, layout=layout)
    mask = offsets < n
    gl.store(out_ptr + offsets, {epilogue}(gl.load(x_ptr + offsets, mask=mask)) + extra(), mask=mask)


  def call(x):
    k = jmf.gluon_kernel(kernel, num_warps=4{given})
    return jmf.mosaic_kernel(k, lambda x: x, grid=(2,), scalars=lambda meta, x: (np.int32(x.size),))(x)
'''

_CUTE = '''
  import cuda.bindings.driver as cuda
  import cutlass
  import cutlass.cute as cute
  import jax_mosaic_ffi as jmf
  {body}

  @cute.kernel
  def _kernel(x: cute.Tensor, y: cute.Tensor, a: cutlass.Float32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < x.shape[0]:
      y[i] = x[i] + a


  @cute.jit
  def launcher(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor):
    _kernel(x, y, cutlass.Float32({value})).launch(grid=((x.shape[0] + 127) // 128, 1, 1), block=(128, 1, 1),
                                                   stream=stream)


  def call(x):
    k = jmf.cute_kernel(launcher, targets=("sm_90a",))
    return jmf.mosaic_kernel(k, lambda x: x)(x)
'''


def _program(wing: str, frame: str, kind: str) -> Program:
  files_holes = {"profile": "1.5", "lazy": "0.125", "helper": "0.25", "attrgetter": "0.375", "members": "0.1875",
                 "data": "0.625"}
  if wing == "cute":
    body, expr = (_READS, "extras_value()") if kind == "reads" else (_DYNAMIC, "dynamic_value()")
    holes, edits = (_READS_HOLES, _READS_EDITS) if kind == "reads" else (
        _DYNAMIC_HOLES, _DYNAMIC_EDITS + _THROUGH_LIBRARIES_EDITS + (_CONTROL,))
    text = frame.replace("{body}", _LOCAL_MODULES + body).replace("{value}", expr)
  else:
    jit = "triton.jit" if wing == "triton" else "gluon.jit"
    body = (_JIT_READS if kind == "reads" else _JIT_DYNAMIC).replace("{jit}", jit)
    holes, edits = (_JIT_READS_HOLES, _JIT_READS_EDITS) if kind == "reads" else (_DYNAMIC_HOLES,
                                                                                _DYNAMIC_EDITS + (_CONTROL,))
    reads = kind == "reads"
    given = (", NS=NS" if wing == "triton" else ', constexprs={{"NS": NS}}') if reads else ""
    text = (frame.replace("{body}", _LOCAL_MODULES + body).replace("{epilogue}", "NS.epi" if reads else "")
            .replace("{param}", f", NS: {'tl' if wing == 'triton' else 'gl'}.constexpr" if reads else "")
            .replace("{given}", given))
  return Program(wing, text, {**files_holes, **holes}, edits, files=_FILES, name=f"{wing}_{kind}")


CUDA_ENVIRONMENT = Program("cuda", '''
  import os, pathlib, types
  import numpy as np
  import jax_mosaic_ffi as jmf

  NS = types.SimpleNamespace(table=np.linspace(0.0, 1.0, 2000) + {entry} * (np.arange(2000) == 1000))
  FACTOR = os.environ.get("FZ_CUDA_FACTOR", "2.0")
  OFFSET = {offset} + float(pathlib.Path(os.path.join(os.path.dirname(__file__), "fz_cuda.txt")).read_text())
  SOURCE = r"""
  extern "C" __global__ void scale(const float* x, float* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * %sf + %.17gf;
  }}
  """ % (FACTOR, NS.table[1000] + OFFSET)


  def call(x):
    k = jmf.cuda_kernel(SOURCE, "scale", targets=("sm_90",))
    return jmf.mosaic_kernel(k, lambda x: x, grid=(4,), block=(256,), scalars=(np.int32(1024),))(x)
''', {"entry": "0.0", "offset": "0.5", "data": "0.25"},
    (Edit("an environment variable the source is built from", "environment", env=(("FZ_CUDA_FACTOR", "3.0"),)),
     Edit("a table a SimpleNamespace holds, formatted into the source", "namespace", (("entry", "1.0"),)),
     Edit("a module global formatted into the source", "global", (("offset", "0.75"),)),
     Edit("a file pathlib.Path.read_text reads, formatted into the source", "file through a library function",
          (("data", "0.375"),)),
     Edit("the same text again", "control", changes_kernel=False)),
    files=(("fz_cuda.txt", "{data}\n"),), name="cuda_reads")

PROGRAMS = {p.id: p for p in (*(_program(w, f, k) for w, f in (("triton", _TRITON), ("gluon", _GLUON),
                                                                  ("cute", _CUTE)) for k in ("reads", "dynamic")),
                              CUDA_ENVIRONMENT)}
