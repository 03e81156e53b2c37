"""The docs site's machinery, without building it (CI builds it: scripts/docs.sh): the API reference lists every public
name once, each has a docstring of its own, and the link check of the built HTML finds broken links and anchors.
(The code blocks of the pages run: tests/test_docs_examples.py.)"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import types

import jax_mosaic_ffi as jmf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(REPO, "docs", "reference", "index.md")


def reference_names() -> list[str]:
  """The names the reference's autosummary tables list, in order, repeats included."""
  with open(REFERENCE, encoding="utf-8") as f:
    text = f.read()
  names = []
  for table in re.findall(r"^\.\. autosummary::\n((?:   .*\n|\n)+)", text, re.MULTILINE):
    names += [line.strip() for line in table.splitlines() if line.strip() and not line.strip().startswith(":")]
  return names


def own_docstring(obj) -> str | None:
  """The docstring written for ``obj`` itself: not one inherited from a base class, not the signature that
  dataclasses make up for a class without one, not the type's docstring showing through an instance."""
  if isinstance(obj, type):
    doc = vars(obj).get("__doc__")
    if doc and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
      return None  # dataclasses' generated "Name(field: type, ...)"
  elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
    doc = obj.__doc__
  else:
    doc = obj.__doc__ if obj.__doc__ != type(obj).__doc__ else None
  return inspect.cleandoc(doc) if doc and doc.strip() else None


def test_the_reference_lists_every_public_name_once():
  listed = reference_names()
  repeated = sorted({n for n in listed if listed.count(n) > 1})
  assert not repeated, f"docs/reference/index.md lists these more than once: {repeated}"
  missing = sorted(set(jmf.__all__) - set(listed))
  assert not missing, (f"public names (jax_mosaic_ffi.__all__) missing from the API reference: {missing}; "
                       "add each to the group of docs/reference/index.md where a reader would look for it")
  extra = sorted(set(listed) - set(jmf.__all__))
  assert not extra, f"docs/reference/index.md lists names that are not in jax_mosaic_ffi.__all__: {extra}"


def test_every_public_name_has_a_docstring_of_its_own():
  undocumented = [name for name in jmf.__all__ if not own_docstring(getattr(jmf, name))]
  # A public module's own public names too (jmf.ops.all_reduce): its reference page documents them.
  for name in jmf.__all__:
    module = getattr(jmf, name)
    if isinstance(module, types.ModuleType):
      undocumented += [f"{name}.{member}" for member in getattr(module, "__all__", ())
                       if not own_docstring(getattr(module, member))]
  assert not undocumented, f"public names without a docstring of their own: {undocumented}"


def test_own_docstring_sees_through_what_python_makes_up():
  @dataclasses.dataclass
  class Undocumented:
    x: int

  class Inheriting(ValueError):
    pass

  assert own_docstring(Undocumented) is None and own_docstring(Inheriting) is None
  assert own_docstring(types.SimpleNamespace()) is None and own_docstring(lambda: 0) is None
  assert own_docstring(jmf.Kernel) and own_docstring(jmf.mosaic_kernel_p) and own_docstring(jmf.ops)


PAGE = '''<html><body>
<h1 id="top">Title</h1><a name="old-style"></a>
<a href="#top">self</a> <a href="other.html#part">other</a> <a href="sub/">folder index</a>
<a href="https://example.org/missing.html">external, not checked</a> <img src="_static/logo.png">
{broken}
</body></html>'''


def check_links(tmp_path, broken: str) -> subprocess.CompletedProcess:
  site = tmp_path / "html"
  (site / "sub").mkdir(parents=True, exist_ok=True)
  (site / "_static").mkdir(exist_ok=True)
  (site / "_static" / "logo.png").write_bytes(b"\x89PNG")
  (site / "index.html").write_text(PAGE.format(broken=broken))
  (site / "other.html").write_text('<p id="part"><a href="index.html#old-style">back</a></p>')
  (site / "sub" / "index.html").write_text('<a href="../other.html">up</a>')
  return subprocess.run([sys.executable, os.path.join(REPO, "scripts", "check_docs_links.py"), str(site)],
                        capture_output=True, text=True)


def test_the_link_check_passes_a_site_whose_links_resolve(tmp_path):
  checked = check_links(tmp_path, "")
  assert checked.returncode == 0, checked.stderr


def test_the_link_check_names_each_broken_link_and_anchor(tmp_path):
  checked = check_links(tmp_path, '<a href="gone.html">a</a> <a href="other.html#nowhere">b</a> '
                                  '<a href="#missing">c</a> <img src="../../outside.png">')
  assert checked.returncode == 1
  assert "index.html: gone.html (no such file)" in checked.stderr
  assert "index.html: other.html#nowhere (no anchor #nowhere in other.html)" in checked.stderr
  assert "index.html: #missing (no anchor #missing in index.html)" in checked.stderr
  assert "index.html: ../../outside.png (outside the site)" in checked.stderr
  assert "4 broken internal link(s)" in checked.stderr


def test_the_keyword_only_star_of_a_signature_is_not_styled_as_a_link():
  # Sphinx renders the `*` of `mosaic_kernel(kernel, out_shape, *, grid=None, ...)` as an <abbr> of the class below,
  # which browsers underline; the site's CSS takes the underline off. Where Sphinx is installed (the docs extra),
  # it must still emit that class, or the rule styles nothing.
  with open(os.path.join(REPO, "docs", "_static", "custom.css"), encoding="utf-8") as f:
    css = f.read()
  rule = re.search(r"\.sig \.keyword-only-separator abbr,\s*\.sig \.positional-only-separator abbr \{([^}]*)\}", css)
  assert rule and "text-decoration: none" in rule.group(1) and "border-bottom: none" in rule.group(1), css
  try:
    from sphinx.domains.python import _annotations
  except ImportError:
    return
  source = inspect.getsource(_annotations)
  assert "classes=['keyword-only-separator']" in source and "classes=['positional-only-separator']" in source
