"""A kernel that does not compile is named at the user's lines: the line that called the compile, and each position
NVRTC's log (``k.cu(4)``) or ptxas's (``ptx input, line 30``) names, as a line of the user's file where the source
is a literal in it, a module's constant or a file it was read from (cuda/nvrtc/error_lines.py,
base/source_origin.py). Real NVRTC on the CPU."""

import os
import sys

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.cuda.nvrtc import error_lines

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
