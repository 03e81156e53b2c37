"""Every Python code block of the README and of docs/ runs, so that no snippet rots.

The blocks of one page run as a reader runs them: in order, in one namespace, in a fresh process, each from a file
of its own whose line numbers are the page's (a traceback names the page and its line; `@triton.jit`, which reads
its function's source, works). On the CPU, CUDA kernels run through their `fallback=` or are only lowered, as the
pages show; where jax has a GPU, the kernels run on it.

A block is marked by an HTML comment on the line before its fence (GitHub and the docs site show nothing of it):

    <!-- gpu -->                  runs only where there is a GPU (a kernel without a fallback)
    <!-- no-run: why -->          never runs: a fragment that cannot run alone (use sparingly; say why)

The marker is invisible on the page: a `gpu` block has a note just above its marker that the reader sees, saying
that it "needs a GPU" (`test_a_gpu_block_says_so_on_the_page`). `test_code_block_markers` lists every block not
run on the CPU, as a warning in the test summary. Pages with
expected results (`EXPECTED`) have them checked after their blocks ran.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import glob
import importlib.util
import json
import os
import re
import textwrap
import warnings

import pytest

from jax_mosaic_ffi.base import nvshmem_package

import conftest
import fresh_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKS = ("gpu", "no-run")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_COMMENT = re.compile(r"^<!--(?P<body>.*)-->$")
_PYTHON_INFO = re.compile(r"^\s*(?:python|py|\{code-block\}\s+python|\{code\}\s+python)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
  """One Python code block of a page."""
  page: str   # relative to the repository, e.g. "docs/guides/triton_kernels.md"
  line: int   # the first line of the code, counted from 1
  code: str   # dedented
  mark: str | None = None  # None: runs everywhere; "gpu"; "no-run"
  why: str = ""

  @property
  def where(self) -> str:
    return f"{self.page}:{self.line}"


class MarkerError(ValueError):
  """A comment before a Python block that is not a marker this test knows."""


def pages() -> list[str]:
  """The README and every Markdown page of docs/ (not autosummary's generated pages), relative to the repository."""
  found = ["README.md"] + sorted(
      os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
  return [p for p in found if not p.startswith(("docs/_build/", "docs/reference/generated/"))]


def code_blocks(text: str, page: str) -> list[Block]:
  """The Python code blocks of Markdown ``text``, with the marker of each (``page`` names it in errors)."""
  lines = text.split("\n")
  blocks = []
  i = 0
  while i < len(lines):
    opening = _FENCE.match(lines[i])
    if not opening:
      i += 1
      continue
    indent, fence, info = opening["indent"], opening["fence"], opening["info"]
    end = i + 1
    while end < len(lines):
      closing = _FENCE.match(lines[end])
      if (closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence) and
          not closing["info"].strip()):
        break
      end += 1
    if _PYTHON_INFO.match(info):
      body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end]]
      mark, why = _marker(lines, i, page)
      blocks.append(Block(page, i + 2, textwrap.dedent("\n".join(body)), mark, why))
    i = end + 1
  return blocks


def _marker(lines: list[str], fence_index: int, page: str) -> tuple[str | None, str]:
  """The marker on the nearest non-blank line above a fence, if that line is an HTML comment."""
  above = fence_index - 1
  while above >= 0 and not lines[above].strip():
    above -= 1
  comment = _COMMENT.match(lines[above].strip()) if above >= 0 else None
  if not comment:
    return None, ""
  mark, _, why = comment["body"].strip().partition(":")
  mark, why = mark.strip(), why.strip()
  if mark not in MARKS:
    raise MarkerError(f"{page}:{above + 1}: the comment before a Python block is not a marker: {lines[above].strip()}"
                      f" (known: {', '.join(f'<!-- {m} -->' for m in MARKS)})")
  if mark == "no-run" and not why:
    raise MarkerError(f"{page}:{above + 1}: <!-- no-run --> needs its reason: <!-- no-run: why it cannot run -->")
  return mark, why


def all_blocks() -> list[Block]:
  blocks = []
  for page in pages():
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
      blocks += code_blocks(f.read(), page)
  return blocks


# The axpy example of the README and of getting started: y = 3 x + 1, and the custom call it lowers to.
_AXPY_AND_ITS_CUSTOM_CALL = '''
        "y": np.array_equal(np.asarray(ns["y"]), 3 * np.asarray(ns["x"]) + 1),
        "custom call": ns["custom_call"].lstrip().startswith(
                           "%0 = stablehlo.custom_call @jax_mosaic_ffi_launch_v1(%arg0, %arg1)") and
                       all(a in ns["custom_call"] for a in ("block = array<i32: 256, 1, 1>",
                           "grid = array<i32: 4096, 1, 1>", 'kernel_name = "axpy"')),
'''

# What some pages compute, checked after their blocks ran: {page: (expression over the page's namespace, giving a
# dict of booleans that must all be True)}. A page rewritten under other names updates its line here.
EXPECTED = {
    "README.md": "{" + _AXPY_AND_ITS_CUSTOM_CALL + '''
        "exported as written": ns["exported"].platforms == ("cuda",) and
                               "jax_mosaic_ffi_launch_v1" in ns["exported"].mlir_module(),
    }''',
    "docs/coming_from_jax_triton.md": '''{
        "add": np.array_equal(np.asarray(ns["z"]), np.asarray(ns["x"]) + 1),
        "grad": np.array_equal(np.asarray(ns["gx"]), np.ones(4096)) and
                np.array_equal(np.asarray(ns["gy"]), np.ones(4096)),
    }''',
    "docs/guides/getting_started.md": "{" + _AXPY_AND_ITS_CUSTOM_CALL + '''
        "y_cpu": np.array_equal(np.asarray(ns["y_cpu"]), 3 * np.asarray(ns["x"]) + 1),
    }''',
    "docs/guides/cuda_kernels.md": '''{
        "axpy": np.array_equal(np.asarray(ns["out"]), 3 * np.asarray(ns["x"])),
        "ptx and cubin": [str(t.text) for t in ns["axpy_ptx"].param_types] == ns["signature"] and
                         ns["axpy_cubin"].param_types == ns["axpy_ptx"].param_types,
        "sgd": np.allclose(ns["p"], -0.1) and np.allclose(ns["v"], 1.0),
        "count": np.asarray(ns["positives"]).tolist() == [500],
        "tma": np.array_equal(np.asarray(ns["y"]), np.full((200, 72), 3, np.float32)),
        "nvcc style": ns["softmax_rows"].param_types is not None,
    }''',
    "docs/guides/triton_kernels.md": '''{
        "add": np.array_equal(np.asarray(ns["z"]), np.asarray(ns["x"]) + 1),
        "decorated": np.asarray(ns["s"]).tolist() == [5000.0],
        "descriptors": np.array_equal(np.asarray(ns["c"]), np.full((256, 384), 512, np.float16)),
        "triton_call": np.allclose(np.asarray(ns["doubled"]), 2.5 * np.asarray(ns["x"])),
    }''',
    "docs/guides/transformations.md": '''{
        "vmap": np.array_equal(np.asarray(ns["scaled"]), np.full((7, 1000), 3, np.float32)),
        "grads": np.allclose(ns["dx"], 12 * np.asarray(ns["x"]), rtol=1e-6) and
                 np.allclose(ns["dy"], 6 * np.asarray(ns["x"]), rtol=1e-6),
        "jvp": np.array_equal(np.asarray(ns["t"]), np.full(ns["n"], 2, np.float32)),
        "sharded": np.array_equal(np.asarray(ns["ys"]), 3 * np.asarray(ns["x"])),
        "y_cpu": np.array_equal(np.asarray(ns["y_cpu"]), 3 * np.asarray(ns["x"]) + 1),
        "exported for cuda": ns["exported"].platforms == ("cuda",),
        "symbolic": np.array_equal(np.asarray(ns["z"]), 3 * np.asarray(ns["x"])[:1000]) and
                    str(ns["exported_any_size"].out_avals[0]) == "float32[m]",
    }''',
    "docs/guides/autotuning.md": '''{
        "y": np.array_equal(np.asarray(ns["y"]), 2 * np.asarray(ns["x"])),
        "the first config, untimed, where there is no GPU": ns["report"]["config"] == {"BLOCK": 128, "ITEMS": 1}
            if ns["jax"].default_backend() == "cpu" else len(ns["report"]["timed"]) == 3,
        "tuning file": __import__("json").load(open("tuning.json"))["format"] == "jax_mosaic_ffi tuning",
    }''',
    "docs/guides/collectives.md": '''{
        "all_reduce lowers": "jax_mosaic_ffi_collective_v1" in ns["lowered"].as_text(),
        "a collective kernel": "@jax_mosaic_ffi_collective_v1" in ns["custom_call"] and
                               "uses_xla_collective_metadata = true" in ns["custom_call"],
        "an NVSHMEM kernel": "jax_mosaic_ffi_nvshmem_v1" in ns["lowered_nvshmem"].as_text(),
    }''',
    "docs/guides/errors.md": '''{
        "the mistake's message": "scalars[1] is a Python int, whose width the kernel's parameter cannot be guessed"
                                 in ns["message"] and "mosaic_kernel 'scale' at " in ns["message"],
    }''',
    "docs/index.md": '''{"y": np.array_equal(np.asarray(ns["y"]), 3 * np.asarray(ns["x"]) + 1)}''',
}

RUN_PAGE = '''
    import json, os, sys, traceback
    import numpy as np
    page, blocks, expected = json.loads(open(sys.argv[1]).read())
    ns = {"__name__": "__main__"}
    for block in blocks:
      # A file per block, its code on the page's line numbers: tracebacks and inspect.getsource see the page.
      path = os.path.join(os.getcwd(), page.replace("/", "-") + f"-line{block['line']}.py")
      with open(path, "w") as f:
        f.write("\\n" * (block["line"] - 1) + block["code"])
      try:
        exec(compile(open(path).read(), path, "exec"), ns)
      except BaseException:
        sys.stderr.write(f"\\n{page}: the block at line {block['line']} failed:\\n{traceback.format_exc()}")
        sys.exit(1)
    results = {k: bool(v) for k, v in eval(expected, {"np": np, "ns": ns}).items()} if expected else {}
    print(json.dumps(results))
'''


# Optional packages a page may import (the extras scripts/test.sh installs): without one, its page is skipped, saying
# which, as the tests of that front end skip.
_OPTIONAL = {"triton": "triton", "cutlass": "nvidia-cutlass-dsl (the cute extra)"}
_IMPORTS = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.MULTILINE)


def _missing_packages(blocks: list[Block]) -> list[str]:
  wanted = {m for b in blocks for m in _IMPORTS.findall(b.code)} & set(_OPTIONAL)
  missing = [_OPTIONAL[m] for m in sorted(wanted) if importlib.util.find_spec(m) is None]
  # cuTile's top-level name is cuda's (cuda-bindings, always here): its own package is asked for by name.
  if any(re.search(r"^\s*import cuda\.tile\b", b.code, re.MULTILINE) for b in blocks) and \
      importlib.util.find_spec("cuda.tile") is None:
    missing.append("cuda-tile (the cutile extra)")
  # NVSHMEM is no import: a kernel that includes <nvshmem.h>, or a transport="nvshmem" collective, needs the extra.
  if any("nvshmem" in b.code for b in blocks) and nvshmem_package.find() is None:
    missing.append("nvidia-nvshmem-cu13 (the nvshmem extra)")
  return missing


def _runnable_pages() -> list[str]:
  return sorted({b.page for b in all_blocks() if b.mark != "no-run"})


@pytest.mark.parametrize("page", _runnable_pages())
def test_the_code_blocks_of_the_page_run(page, tmp_path):
  """The page's blocks, in order, in one namespace: GPU-marked ones too where jax has a GPU."""
  has_gpu = conftest._cuda_devices()[0] > 0
  blocks = [b for b in all_blocks() if b.page == page]
  runs = [b for b in blocks if b.mark is None or (b.mark == "gpu" and has_gpu)]
  missing = _missing_packages(runs)
  if missing:
    pytest.skip(f"{page} needs what is not installed here: {', '.join(missing)}")
  script = tmp_path / "blocks.json"
  script.write_text(json.dumps([page, [dataclasses.asdict(b) for b in runs], EXPECTED.get(page)]))
  work = tmp_path / "work"
  work.mkdir()
  results = fresh_process.run(RUN_PAGE, script, cwd=work,
                              env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert results == dict.fromkeys(results, True), f"{page}: these results are wrong: " + ", ".join(
      k for k, v in results.items() if not v)


RUN_DOCSTRINGS = '''
    import doctest, io, json
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    import jax_mosaic_ffi.jax_triton as jt
    objects = [(name, getattr(jmf, name)) for name in jmf.__all__]
    objects += [("jax_triton", jt)] + [(f"jax_triton.{name}", getattr(jt, name)) for name in jt.__all__]
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report, ran = io.StringIO(), set()
    for name, obj in objects:
      for test in finder.find(obj, name, globs={"jax": jax, "jnp": jnp, "np": np, "jmf": jmf, "jt": jt}):
        if test.examples and test.name not in ran:
          ran.add(test.name)
          runner.run(test, out=report.write)
    failed, attempted = runner.summarize(verbose=False)
    print(json.dumps({"failed": failed, "attempted": attempted, "ran": sorted(ran), "report": report.getvalue()}))
'''


def test_the_docstring_examples_run(tmp_path):
  """Every ``>>>`` example of a public name's docstring (the reference's pages) runs and prints what it shows:
  on the CPU through the fallbacks, the kernels too where there is a GPU."""
  result = fresh_process.run(RUN_DOCSTRINGS, cwd=tmp_path,
                             env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert result["failed"] == 0, result["report"]
  assert {"mosaic_kernel", "cuda_kernel", "differentiable", "autotune", "jax_triton.strides_from_shape"} <= set(
      result["ran"]), result["ran"]


def test_a_page_that_needs_nvshmem_skips_without_it(monkeypatch):
  # `pip install '.[test]'` has no NVSHMEM: the collectives guide's NVSHMEM kernel cannot compile there, so its
  # page is skipped, saying why, as the Triton and CuTe DSL pages are without theirs.
  blocks = [b for b in all_blocks() if b.page == "docs/guides/collectives.md"]
  monkeypatch.setattr(nvshmem_package, "find", lambda: None)
  assert _missing_packages(blocks) == ["nvidia-nvshmem-cu13 (the nvshmem extra)"]
  assert _missing_packages([b for b in all_blocks() if b.page == "docs/guides/autotuning.md"]) == []


def undefined_names(code: str) -> set[str]:
  """The names ``code`` uses that nothing in it defines (an import, an assignment, a def, a parameter...) and
  that are not builtins: a coarse check that ignores scopes, which is what a missing import needs."""
  defined, loaded = set(dir(builtins)) | {"__file__", "__name__"}, set()
  for node in ast.walk(ast.parse(code)):
    if isinstance(node, ast.Name):
      (loaded if isinstance(node.ctx, ast.Load) else defined).add(node.id)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      defined |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      defined.add(node.name)
    elif isinstance(node, ast.arg):
      defined.add(node.arg)
    elif isinstance(node, ast.ExceptHandler) and node.name:
      defined.add(node.name)
  return loaded - defined


def test_a_block_that_imports_jax_runs_alone():
  """A block that imports jax starts a program, and a reader copies it whole: every name it uses is its own (the
  blocks after it on the page may use its names). The pages run in one namespace, which would hide a missing
  import; this finds it."""
  starts = [b for b in all_blocks()
            if any(isinstance(node, ast.Import) and any(a.name == "jax" for a in node.names)
                   for node in ast.parse(b.code).body)]
  assert len(starts) >= 10, [b.where for b in starts]
  missing = {b.where: sorted(undefined_names(b.code)) for b in starts if undefined_names(b.code)}
  assert not missing, f"blocks that start a program but use names they do not define: {missing}"


def test_the_self_containment_check_finds_a_missing_import():
  assert undefined_names("import jax\ndef f(x, *, y=1):\n  return jt.triton_call(x, y) + [z for z in x]") == {"jt"}


def test_code_block_markers():
  """Every marker is one this test knows, every no-run says why; the blocks not run on the CPU are listed."""
  blocks = all_blocks()  # raises MarkerError on an unknown marker
  assert blocks, "no Python code block found: has the README moved?"
  assert set(EXPECTED) <= set(_runnable_pages()), "EXPECTED names a page without runnable blocks"
  marked = [b for b in blocks if b.mark]
  if marked:
    counts = ", ".join(f"{sum(b.mark == m for b in marked)} {m}" for m in MARKS)
    warnings.warn(f"{len(marked)} of {len(blocks)} Python code blocks of the docs are not run on the CPU ({counts}): "
                  + "; ".join(f"{b.where} {b.mark}{': ' + b.why if b.why else ''}" for b in marked), stacklevel=1)


_NEEDS_GPU = re.compile(r"needs a GPU", re.IGNORECASE)


def visible_note(lines: list[str], fence_index: int) -> str:
  """What the page shows just above a marked fence: the paragraph, or the whole ``:::`` admonition, before the
  marker comment."""
  above = fence_index - 1
  while above >= 0 and (not lines[above].strip() or _COMMENT.match(lines[above].strip())):
    above -= 1
  end = above
  if above >= 0 and lines[above].strip() == ":::":   # an admonition: up to its opening fence
    while above > 0 and not lines[above - 1].lstrip().startswith(":::{"):
      above -= 1
    return "\n".join(lines[above:end])
  while above > 0 and lines[above - 1].strip():
    above -= 1
  return "\n".join(lines[above:end + 1])


def test_a_gpu_block_says_so_on_the_page():
  """The `<!-- gpu -->` comment shows nothing: a reader on the site would take the block for one that runs
  anywhere. Each has a note above it that the page renders."""
  silent = []
  for page in pages():
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
      lines = f.read().split("\n")
    for block in code_blocks("\n".join(lines), page):
      if block.mark == "gpu" and not _NEEDS_GPU.search(visible_note(lines, block.line - 2)):
        silent.append(block.where)
  assert not silent, f"blocks marked <!-- gpu --> without a visible note that they need a GPU: {silent}"


def test_the_visible_note_is_the_paragraph_or_admonition_above_the_marker():
  page = "Text.\n\nThis needs a GPU,\nsaid here:\n\n<!-- gpu -->\n```python\nb = 1\n```\n"
  assert visible_note(page.split("\n"), 6) == "This needs a GPU,\nsaid here:"
  page = ":::{note}\nIt needs a GPU.\n\nReally.\n:::\n\n<!-- gpu -->\n```python\nb = 1\n```\n"
  assert visible_note(page.split("\n"), 7) == "It needs a GPU.\n\nReally."


PAGE = '''\
Text.

```python
a = 1
```

<!-- gpu -->
```python
b = a + 1
```

- a list item:

  <!-- no-run: needs c -->
  ```python
  if True:
    d = c
  ```

````markdown
```python
not_a_block()
```
````

```bash
echo not python
```
'''


def test_code_blocks_are_found_with_their_markers_lines_and_indentation():
  blocks = code_blocks(PAGE, "page.md")
  assert [(b.line, b.code.strip(), b.mark, b.why) for b in blocks] == [
      (4, "a = 1", None, ""),
      (9, "b = a + 1", "gpu", ""),
      (16, "if True:\n  d = c", "no-run", "needs c"),
  ]


@pytest.mark.parametrize("comment", ["<!-- no run: typo -->", "<!-- gpu-only -->", "<!-- no-run -->"])
def test_a_misspelt_marker_or_a_no_run_without_reason_is_an_error(comment):
  with pytest.raises(MarkerError, match="page.md:1"):
    code_blocks(f"{comment}\n```python\nx = 1\n```\n", "page.md")


def test_a_page_that_imports_a_missing_optional_package_says_which(monkeypatch):
  monkeypatch.setitem(_OPTIONAL, "no_such_package_jmf", "no-such-package (an extra)")
  assert _missing_packages([Block("p.md", 1, "import json\nfrom no_such_package_jmf import x\n")]) == [
      "no-such-package (an extra)"]
  assert _missing_packages([Block("p.md", 1, "import json\n")]) == []
