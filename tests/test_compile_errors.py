"""A kernel that does not compile is named at the user's lines: the line that called the compile, and each position
NVRTC's log (``k.cu(4)``) or ptxas's (``ptx input, line 30``) names, as a line of the user's file where the source
is a literal in it, a module's constant or a file it was read from (cuda/nvrtc/error_lines.py,
base/source_origin.py). Real NVRTC on the CPU."""

import inspect
import os
import re
import sys

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import ptx_info
from jax_mosaic_ffi.base import source_origin
from jax_mosaic_ffi.cuda.nvrtc import error_lines
from jax_mosaic_ffi.cuda.nvrtc import release
from jax_mosaic_ffi.cuda.nvrtc import worker

HERE = os.path.abspath(__file__)

TYPO = r'''
extern "C" __global__ void typo(float* y) {
  int i = threadIdx.x;
  y[i] = undefined_name;
}
'''

FORMATTED = r'''
extern "C" __global__ void scaled(float* y) {
  int i = threadIdx.x;
  y[i] = %s * not_declared_here;
}
'''

BAD_ASM = r'''
extern "C" __global__ void bad_asm(float* y) {
  float v;
  asm volatile("mov.b32.bogus %0, 1.0;" : "=f"(v));
  y[0] = v;
}
'''


def shown(path) -> str:
  """A path as the messages show it: relative to the working directory when under it."""
  relative = os.path.relpath(path)
  return str(path) if relative.startswith(os.pardir) else relative


def line_of(start: str, path=HERE) -> int:
  """The number of the one line of ``path`` that starts with ``start`` (past its indent)."""
  with open(path) as f:
    found = [n for n, line in enumerate(f, 1) if line.strip().startswith(start.strip())]
  assert len(found) == 1, (start, found)
  return found[0]


def compile_error(source, name, **options) -> str:
  with pytest.raises(jmf.CompileError) as caught:
    jmf.cuda_kernel(source, name, **options)  # the line that calls the compile
  return str(caught.value)


CALL = "(called at test_compile_errors.py:{} (compile_error)):\n".format(line_of("jmf.cuda_kernel(source, name,"))


def test_a_typo_in_a_literal_is_named_at_the_line_of_this_file(isolated_disk_cache):
  message = compile_error(TYPO, "typo")
  assert message.startswith("NVRTC could not compile kernel 'typo' " + CALL), message
  assert 'typo.cu(4): error: identifier "undefined_name" is undefined' in message  # NVRTC's log, as it was
  line = line_of("  y[i] = undefined_name;")
  assert f"  typo.cu(4) is {shown(HERE)}:{line}:\n  {line:5d} |   y[i] = undefined_name;" in message, message


def test_a_formatted_literal_is_found_by_its_lines(isolated_disk_cache):
  message = compile_error(FORMATTED % "2.0f", "scaled")
  line = line_of("  y[i] = %s * not_declared_here;")
  assert f"  scaled.cu(4) is {shown(HERE)}:{line}:\n  {line:5d} |   y[i] = %s * not_declared_here;" in message, message


def test_a_source_read_from_a_file_is_named_in_that_file(isolated_disk_cache, tmp_path):
  path = tmp_path / "kernels" / "typo.cu"
  path.parent.mkdir()
  path.write_text("// a kernel of the user's\n" + TYPO)
  message = compile_error(path.read_text(), "typo")
  assert f"  typo.cu(5) is {shown(path)}:5:\n      5 |   y[i] = undefined_name;" in message, message


def test_a_constant_of_another_module_is_named_in_that_module(isolated_disk_cache, tmp_path, monkeypatch):
  module = tmp_path / "user_kernels.py"
  module.write_text("# the user's kernels\n\nSOURCE = r'''" + TYPO + "'''\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "user_kernels", raising=False)
  import user_kernels
  message = compile_error(user_kernels.SOURCE, "typo")
  assert f"  typo.cu(4) is {shown(module)}:6:\n      6 |   y[i] = undefined_name;" in message, message


def test_a_source_found_nowhere_keeps_the_compilers_numbers(isolated_disk_cache):
  # Written with escapes, on one line of this file: no line of any file is the kernel's line 3.
  message = compile_error('extern "C" __global__ void k(float* x) {\n  x[0] = 1.0f;\n  x[1] = nowhere_name;\n}\n',
                          "k")
  assert "source lines named above:\n      3 |   x[1] = nowhere_name;" in message, message


@pytest.mark.parametrize("pdl", [True, False])
def test_a_ptxas_error_is_named_at_the_source_line_of_its_ptx_line(isolated_disk_cache, pdl):
  message = compile_error(BAD_ASM, "bad_asm", pdl=pdl)
  assert "ptxas application ptx input, line " in message and "Unknown modifier '.bogus'" in message, message
  line = line_of('asm volatile("mov.b32.bogus')
  assert f", bad_asm.cu(4) is {shown(HERE)}:{line}:\n  {line:5d} |   asm volatile(" in message, message


def test_ptx_lines_are_taken_to_the_loc_before_them():
  ptx = "\n".join([
      ".entry k(",       # 1
      ")",               # 2
      "{",               # 3
      "\t.loc\t1 4 3",
      "\tmov.b32 %f1, 1.0;",   # 4: main file, line 4
      "\t.loc\t2 17 1, function_name $L__info_string0, inlined_at 1 5 2",
      "\tadd.f32 %f2, %f1, %f1;",  # 5: a header's line 17
      "}",               # 6
      '\t.file\t1 "/somewhere/k.cu"',
      '\t.file\t2 "/usr/include/helper.cuh"',
  ])
  assert error_lines.located(ptx, [1, 4, 5], "k.cu") == {4: ("k.cu", 4), 5: ("/usr/include/helper.cuh", 17)}


def test_ptx_lines_counted_with_their_directives_are_taken_to_the_loc_before_them():
  # Triton's PTX: ptxas reads it with its .loc and .file lines, and counts them; the .file names the folder apart.
  ptx = "\n".join([
      ".entry k(",              # 1
      "{",                      # 2
      "\t.loc\t1 17 3",         # 3
      "\tbogus.b32 %r1, %r2;",  # 4: the kernel's line 17
      "\t.loc\t1 0 0",          # 5
      "\tret;",                 # 6: line 0, no line of the file
      "}",
      '\t.file\t1 "/home/me" "model.py"',
  ])
  assert ptx_info.source_lines(ptx, [1, 4, 6]) == {4: ("/home/me/model.py", 17)}
  assert ptx_info.source_lines(ptx, [3], count_directives=False) == {3: ("/home/me/model.py", 17)}


def test_positions_a_compiler_names_by_path_are_shown_from_the_users_file():
  line = line_of("def test_positions_a_compiler_names_by_path")
  library = os.path.abspath(jmf.__file__)  # this package's: not the user's
  log = (f'loc("{HERE}":{line}:5): error: an MLIR location\n{HERE}:{line}:7: error: the same line again\n'
         f"{library}:3:1: error: a library's line\n/nowhere/model.py:4:1: error: no such file")
  (place,) = source_origin.places_in(log)
  assert place.excerpt() == [f"  {shown(HERE)}:{line}:", f"  {line:5d} | {place.text}"]
  assert place.text.startswith("def test_positions_a_compiler_names_by_path")


# ------------------------------------------------------------------ Triton, Gluon and the CuTe DSL

def triton_sources():
  pytest.importorskip("triton", reason="needs Triton (the triton extra)")
  import triton_sources as ts
  return ts


def numbered(message: str, label: str, module) -> tuple[int, str]:
  """The line number and text that ``message`` shows for ``label`` ("ptx line 46 is x.py:135:" then the line),
  checked against line of ``module``'s file."""
  path = os.path.abspath(module.__file__)
  found = re.search(rf"  {label}{re.escape(shown(path))}:(\d+):\n +(\d+) \| (.*)", message)
  assert found and found.group(1) == found.group(2), message
  number, text = int(found.group(1)), found.group(3)
  with open(path) as f:
    assert f.read().splitlines()[number - 1] == text
  return number, text


@pytest.mark.parametrize("bound", ["300", "0"])  # in a bounded compile's child, and in this process
def test_a_triton_ptxas_error_is_named_at_the_kernels_line(isolated_disk_cache, monkeypatch, bound):
  ts = triton_sources()
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S", bound)
  with pytest.raises(jmf.CompileError) as caught:
    jmf.triton_kernel(ts.bogus_asm, signature=["*fp32", "*fp32"], constexprs={"BLOCK": 128}, targets=["sm_90"])
  message = str(caught.value)
  assert re.search(r"\.ptx, line \d+; error +: Not a name of any known instruction: 'bogus'", message), message
  _, text = numbered(message, r"ptx line \d+ is ", ts)
  assert text.strip().startswith('y = tl.inline_asm_elementwise("bogus.instr.f32')


def test_a_triton_frontend_error_is_named_at_the_files_line(isolated_disk_cache):
  ts = triton_sources()
  with pytest.raises(jmf.CompileError) as caught:
    jmf.triton_kernel(ts.add, signature=["*fp32", "*fp32", "*fp32", "i32"], constexprs={"BLOCK": 255},
                      targets=["sm_90"])
  message = str(caught.value)
  assert "CompilationError: at 3:26:" in message, message  # Triton's own, counted from the def
  number, text = numbered(message, "at 3:26 is ", ts)
  assert text == "  offsets = pid * BLOCK + tl.arange(0, BLOCK)"
  lines, start = inspect.getsourcelines(ts.add.fn)
  assert start <= number < start + len(lines)  # add's own line, not the same text in another kernel


def test_a_gluon_layout_error_names_its_mlir_location_as_a_line(isolated_disk_cache):
  pytest.importorskip("triton", reason="needs Triton (the triton extra)")
  from triton.experimental.gluon import language as gl
  import gluon_sources as gs
  with pytest.raises(jmf.CompileError) as caught:
    jmf.gluon_kernel(gs.add, signature=["*fp32"] * 3 + ["i32"], num_warps=8, targets=["sm_90"],
                     constexprs={"XBLOCK": 512, "layout": gl.BlockedLayout([1], [32], [4], [0])})
  _, text = numbered(str(caught.value), "", gs)
  assert "gl.arange(0, XBLOCK, layout=layout)" in text


def test_a_cute_dsl_error_is_named_at_the_launchers_line(isolated_disk_cache):
  pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the cute extra)")
  import jax
  import jax.numpy as jnp
  import cute_kernels as K
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  with pytest.raises(jmf.CompileError) as caught:
    jax.jit(jmf.cute_call(K.broken, output_shape_dtype=x)).trace(x).lower(lowering_platforms=("cuda",))
  message = str(caught.value)
  assert re.search(r"^CuTe DSL could not compile 'broken' for sm_\w+ \(called at test_compile_errors\.py:\d+ ",
                   message), message  # the line that made the kernel
  _, text = numbered(message, "", K)
  assert text == "  x.nope()"


# ------------------------------------------------------------------ when ptxas's lines are not mapped

MISMATCH = "NVRTC 13.5 (nvidia-cuda-nvrtc 13.5.37) is newer than nvJitLink 13.0 (nvidia-nvjitlink 13.0.88): ..."


@pytest.fixture
def recompiles(monkeypatch):
  """The line-table re-compiles of ptxas's lines that compiles make (each request with -lineinfo), recorded."""
  made = []
  real = worker.compile_bounded

  def recording(request, timeout):
    if "-lineinfo" in request["options"]:
      made.append(request)
    return real(request, timeout)
  monkeypatch.setattr(worker, "compile_bounded", recording)
  return made


def test_a_toolchain_mismatch_is_not_compiled_again_for_its_ptxas_lines(isolated_disk_cache, monkeypatch, recompiles):
  monkeypatch.setattr(release, "advice", lambda: MISMATCH)
  message = compile_error(BAD_ASM, "bad_asm", pdl=False)
  assert "Unknown modifier '.bogus'" in message and message.endswith(f"advice: {MISMATCH}"), message
  assert recompiles == [] and "ptx input line" not in message
  monkeypatch.setattr(release, "advice", lambda: None)  # the same error without the mismatch: mapped, once
  message = compile_error(BAD_ASM, "bad_asm", pdl=False)
  assert len(recompiles) == 1 and ", bad_asm.cu(4) is " in message, message


def test_ptxas_refusing_the_ptx_release_or_no_ptxas_line_makes_no_recompile(recompiles):
  request = {"targets": ["sm_90"], "options": [], "filename": "k.cu"}  # would fail if it were compiled again
  unsupported = "ptxas application ptx input, line 5; fatal   : Unsupported .version 9.5; current version is '9.0'"
  assert error_lines.excerpts(unsupported, "int x;\n", "k.cu", request, 10.0) == []
  no_ptxas = 'k.cu(2): error: identifier "nowhere_zz" is undefined'
  assert error_lines.excerpts(no_ptxas, "int a;\nint b = nowhere_zz;\n", "k.cu", request, 10.0) == [
      "      2 | int b = nowhere_zz;"]
  assert recompiles == []
