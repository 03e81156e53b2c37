"""The edit fuzzer's corpus and runner (tests/test_key_fuzz.py runs it): a program per front end, and every kind of
edit a user makes to it between two runs.

A program is a module's text with ``{holes}``; an `Edit` fills some holes otherwise (or sets a setting). The runner
writes each version at one path (so the file's name and place never change the key), imports it afresh under one
module name, and lowers its kernel with the key audit on (JAX_MOSAIC_FFI_KEY_AUDIT=1). A hit whose kernel was
compiled from other IR than the call makes raises KeyAuditError: the fast key missed the edit. Otherwise the row
says whether the key changed (a compile) or not (a hit the audit proved), and whether the kernel did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import linecache
import os
import sys
import textwrap

from jax_mosaic_ffi.base import module_format


@dataclasses.dataclass(frozen=True)
class Edit:
  name: str
  kind: str  # what kind of edit: method body, jit function held, field, global, closure cell, default, ...
  holes: tuple[tuple[str, str], ...] = ()
  env: tuple[tuple[str, str], ...] = ()  # a setting, set for the whole process that runs this version
  changes_kernel: bool = True  # False: a control, whose key must stay (a warm cache must still hit)


@dataclasses.dataclass(frozen=True)
class Program:
  wing: str
  text: str
  holes: dict
  edits: tuple[Edit, ...]
  files: tuple[tuple[str, str], ...] = ()  # other files beside the module (a header), with holes too
  name: str = ""  # where a wing has several programs: this one's (the wing's otherwise)

  @property
  def id(self) -> str:
    return self.name or self.wing

  def version(self, edit: Edit | None) -> dict[str, str]:
    holes = {**self.holes, **dict(edit.holes if edit else ())}
    return {f"fz_{self.id}.py": textwrap.dedent(self.text).format(**holes) + _LOWER,
            **{name: textwrap.dedent(text).format(**holes) for name, text in self.files}}


_LOWER = '''
def lower():
  import jax, jax.numpy as jnp
  import jax_mosaic_ffi as jmf
  x = jax.ShapeDtypeStruct((1024,), jnp.float32)
  return jax.jit(call).trace(x).lower(lowering_platforms=("cuda",))
'''

TRITON = Program("triton", '''
  import dataclasses, enum
  import triton, triton.language as tl
  import jax_mosaic_ffi as jmf

  SCALE = tl.constexpr({scale})


  @triton.jit
  def epilogue(x):
    return x * {epilogue}


  @triton.jit
  def other_epilogue(x):
    return x + 1.0


  class Mode(enum.Enum):
    FAST = {mode}
    SLOW = 7


  class {base}:
    @triton.constexpr_function
    def bias(self):
      return {bias}


  class Plain:
    @triton.constexpr_function
    def bias(self):
      return 0.25


  @dataclasses.dataclass(frozen=True)
  class Config({config_base}):
    factor: float = {factor}
    epilogue: object = {held}
    mode: Mode = Mode.FAST


  def make_config():
    offset = {cell}

    @dataclasses.dataclass(frozen=True)
    class Shifted(Config):
      @triton.constexpr_function
      def shift(self):
        return offset
    return Shifted()


  @triton.jit
  def kernel(x_ptr, y_ptr, n, CFG: tl.constexpr, BLOCK: tl.constexpr = {default}):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = CFG.epilogue(tl.load(x_ptr + offs, mask=m)) * CFG.factor + CFG.bias() + CFG.shift() + SCALE
    if CFG.mode.value == 1:
      y = y + 1.0
    tl.store(y_ptr + offs, y, mask=m)


  def unrelated():
    return {unrelated}


  def call(x):
    return jmf.triton_call(x, kernel=kernel, out_type=x, n=x.size, grid=(8,), CFG=make_config())
''', {"scale": "2.0", "epilogue": "3.0", "mode": "1", "base": "Base", "bias": "0.5", "config_base": "Base",
               "factor": "1.5", "held": "epilogue", "cell": "0.125", "default": "128", "unrelated": "1"},
    (Edit("a method's body", "method body", (("bias", "0.75"),)),
     Edit("the JIT function an instance holds, edited", "jit function held", (("epilogue", "4.0"),)),
     Edit("another JIT function held", "jit function held", (("held", "other_epilogue"),)),
     Edit("a field's default", "field", (("factor", "2.5"),)),
     Edit("a module global the kernel reads", "global", (("scale", "2.5"),)),
     Edit("a closure cell a method returns", "closure cell", (("cell", "0.375"),)),
     Edit("a parameter's default", "default argument", (("default", "256"),)),
     Edit("an enum's value", "enum value", (("mode", "2"),)),
     Edit("the class's base", "class base", (("config_base", "Plain"),)),
     Edit("FP fusion off", "setting", env=(("TRITON_DEFAULT_FP_FUSION", "0"),)),
     Edit("a function the kernel never reaches", "control", (("unrelated", "2"),), changes_kernel=False),
     Edit("the same text again", "control", changes_kernel=False)))

GLUON = Program("gluon", '''
  import dataclasses
  import numpy as np
  from triton.experimental import gluon
  from triton.experimental.gluon import language as gl
  import jax_mosaic_ffi as jmf

  SHIFT = gl.constexpr({shift})


  class {base}:
    @gluon.jit
    def apply(x):
      return x * {body}


  class Other:
    @gluon.jit
    def apply(x):
      return x - 1.0


  class Op({op_base}):
    pass


  @dataclasses.dataclass(frozen=True)
  class Tile:
    block: int = {block}


  @gluon.jit
  def kernel(x_ptr, out_ptr, n, Op: gl.constexpr, TILE: gl.constexpr, num_warps: gl.constexpr):
    XBLOCK: gl.constexpr = TILE.block
    layout: gl.constexpr = gl.BlockedLayout([XBLOCK // (32 * num_warps)], [32], [num_warps], [0])
    offsets = gl.program_id(0) * XBLOCK + gl.arange(0, XBLOCK, layout=layout)
    mask = offsets < n
    gl.store(out_ptr + offsets, Op.apply(gl.load(x_ptr + offsets, mask=mask)) + SHIFT, mask=mask)


  def call(x):
    k = jmf.gluon_kernel(kernel, constexprs={{"Op": Op, "TILE": Tile()}}, num_warps=4)
    return jmf.mosaic_kernel(k, lambda x: x, grid=(8,), scalars=lambda meta, x: (np.int32(x.size),))(x)
''', {"shift": "0.5", "base": "Base", "body": "3.0", "op_base": "Base", "block": "512"},
    (Edit("a method of a class passed as a constexpr", "method body", (("body", "5.0"),)),
     Edit("the class's base", "class base", (("op_base", "Other"),)),
     Edit("a field of an instance passed as a constexpr", "field", (("block", "256"),)),
     Edit("a module global the kernel reads", "global", (("shift", "1.5"),)),
     Edit("the same text again", "control", changes_kernel=False)))

CUTE = Program("cute", '''
  import dataclasses, enum
  import cuda.bindings.driver as cuda
  import cutlass
  import cutlass.cute as cute
  import jax_mosaic_ffi as jmf

  OFFSET = {offset}


  class Mode(enum.Enum):
    DOUBLE = {mode}


  class {base}:
    def scale(self):
      return {scale}


  class Plain:
    def scale(self):
      return 0.25


  @dataclasses.dataclass(frozen=True)
  class Config({config_base}):
    factor: float = {factor}
    mode: Mode = Mode.DOUBLE


  @cute.kernel
  def _kernel(x: cute.Tensor, y: cute.Tensor, a: cutlass.Float32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < x.shape[0]:
      y[i] = a * x[i] + cutlass.Float32(OFFSET)


  def make_launcher():
    extra = {cell}

    @cute.jit
    def launcher(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor, *, cfg: cutlass.Constexpr,
                 bias: cutlass.Constexpr = {default}):
      a = cfg.scale() * cfg.factor * cfg.mode.value + extra + bias
      _kernel(x, y, cutlass.Float32(a)).launch(grid=((x.shape[0] + 127) // 128, 1, 1), block=(128, 1, 1),
                                               stream=stream)
    return launcher


  def call(x):
    k = jmf.cute_kernel(make_launcher(), cfg=Config(), targets=("sm_90a",))
    return jmf.mosaic_kernel(k, lambda x: x)(x)
''', {"offset": "1.0", "mode": "2", "base": "Base", "scale": "0.5", "config_base": "Base", "factor": "1.5",
               "cell": "0.125", "default": "0.0"},
    (Edit("a method's body", "method body", (("scale", "0.75"),)),
     Edit("a field's default", "field", (("factor", "2.5"),)),
     Edit("a module global the kernel reads", "global", (("offset", "2.0"),)),
     Edit("a closure cell the launcher reads", "closure cell", (("cell", "0.375"),)),
     Edit("a constexpr's default", "default argument", (("default", "1.0"),)),
     Edit("an enum's value", "enum value", (("mode", "3"),)),
     Edit("the class's base", "class base", (("config_base", "Plain"),)),
     Edit("line info on", "setting", env=(("CUTE_DSL_LINEINFO", "1"),)),
     Edit("the same text again", "control", changes_kernel=False)))

CUDA = Program("cuda", '''
  import os
  import numpy as np
  import jax_mosaic_ffi as jmf

  SOURCE = r"""
  #include "fz_params.h"
  extern "C" __global__ void scale(const float* x, float* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * {factor} + FZ_BIAS + FZ_DEFINE;
  }}
  """


  def call(x):
    k = jmf.cuda_kernel(SOURCE, "scale", options=["-I" + os.path.dirname(__file__), "-DFZ_DEFINE={define}"],
                        targets=("sm_90",))
    return jmf.mosaic_kernel(k, lambda x: x, grid=(4,), block=(256,), scalars=(np.int32(1024),))(x)


  def unrelated():
    return {unrelated}
''', {"factor": "2.0f", "define": "1.0f", "bias": "0.5f", "unrelated": "1"},
    (Edit("the kernel's body", "source", (("factor", "3.0f"),)),
     Edit("a header it includes", "header", (("bias", "0.75f"),)),
     Edit("a define", "option", (("define", "2.0f"),)),
     Edit("Python the kernel never reads", "control", (("unrelated", "2"),), changes_kernel=False)),
    files=(("fz_params.h", "#define FZ_BIAS {bias}\n"),))

PROGRAMS = {p.wing: p for p in (TRITON, GLUON, CUTE, CUDA)}


def load(folder: str, program: Program, edit: Edit | None):
  """One version of the program, written to ``folder`` and imported afresh."""
  return _load(folder, program.id, program.version(edit))


def _load(folder: str, program_id: str, files: dict[str, str]):
  for name, text in files.items():
    with open(os.path.join(folder, name), "w") as f:
      f.write(text)
  linecache.clearcache()  # Triton and the DSL read a kernel's source through it
  name = f"fz_{program_id}"
  sys.modules.pop(name, None)
  spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def _kernel_digest(lowered) -> str:
  from hlo_inspect import custom_calls
  (call,) = custom_calls(lowered)
  images = module_format.parse(call["config"]["module"]).images
  return hashlib.sha256(b"".join(i.data for i in images)).hexdigest()[:16]


def lower(folder: str, program: Program, edit: Edit | None) -> dict:
  """One version, lowered in this process: whether it compiled (its key was new) and its kernel's digest."""
  from jax_mosaic_ffi.store import compile_cache
  module = _load(folder, program.id, program.version(edit))
  before = compile_cache.stats()
  digest = _kernel_digest(module.lower())
  after = compile_cache.stats()
  compiled = sum(after.compiles.values()) > sum(before.compiles.values())
  return {"compiled": compiled, "kernel": digest, "audits": after.audits - before.audits}


def row(program: Program, edit: Edit, base: dict, edited: dict, where: str) -> dict:
  """The verdict on one edit: a kernel that changed must have a new key; a control must keep its key."""
  key_changed, kernel_changed = edited["compiled"], edited["kernel"] != base["kernel"]
  problems = []
  if kernel_changed and not key_changed:
    problems.append("the kernel changed under the same key")
  if edit.changes_kernel and not kernel_changed and edit.kind != "setting":
    problems.append("the edit was meant to change the kernel but did not (the corpus is wrong)")
  if not edit.changes_kernel and key_changed:
    problems.append("a control edit changed the key (a warm cache would miss)")
  return {"wing": program.id, "edit": edit.name, "kind": edit.kind, "where": where,
          "key": "changed" if key_changed else "same (audited)", "kernel": "changed" if kernel_changed else "same",
          "problems": problems}


def warm_run(folder: str, program: Program, names: list[str]) -> list[dict]:
  """In a process of its own with a warm disk cache: each named edit's version lowered with an empty memory
  cache, so every hit is a disk hit (and audited)."""
  import jax_mosaic_ffi as jmf
  out = []
  for name in names:
    edit = next(e for e in program.edits if e.name == name)
    jmf.clear_kernel_cache()
    out.append(lower(folder, program, edit))
  return out


if __name__ == "__main__":  # python key_fuzz.py FOLDER WING [EDIT...]: the base version, or the edits, as JSON
  folder, wing, names = sys.argv[1], sys.argv[2], sys.argv[3:]
  sys.dont_write_bytecode = True
  if names:
    print(json.dumps(warm_run(folder, PROGRAMS[wing], names)))
  else:
    print(json.dumps(lower(folder, PROGRAMS[wing], None)))
