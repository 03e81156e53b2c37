"""The docs site's Sphinx configuration. `bash scripts/docs.sh` builds it (docs/contributing/docs.md says how, and
why Sphinx).

The pages are Markdown (MyST). The API reference (docs/reference/) is generated from the docstrings: autodoc
imports the package, which needs no GPU (the venv's editable install has the compiled extension).
"""

import jax_mosaic_ffi

project = "jax_mosaic_ffi"
author = "jax_mosaic_ffi maintainers"
copyright = "jax_mosaic_ffi maintainers"
release = version = jax_mosaic_ffi.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_copybutton",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
templates_path = ["_templates"]
# Only pages are sources: the docs/*.png figures are referenced by them.
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]

# MyST: `:::` fences for directives in Markdown that GitHub shows plainly, definition lists, and anchors for
# headings down to ### so that `[text](contract.md#a-heading)` resolves, and a wrong anchor is a build warning
# (an error: scripts/docs.sh builds with -W).
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The reference: one page per public name (docs/reference/index.md lists them; tests/test_docs.py checks that the
# list is jax_mosaic_ffi.__all__), written by autosummary at each build into docs/reference/generated/.
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "member-order": "bysource"}
# `mosaic_kernel(kernel, ...)`, not `jax_mosaic_ffi.mosaic_kernel(kernel, ...)`: the page says where it lives.
add_module_names = False
# Types of parameters go into their descriptions, where the docstring has one; signatures stay short.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
# The docstrings are Google style (Args:, Returns:, Raises:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# "Attributes:" sections as one compact list (a dataclass's twenty counters read as a table, not twenty entries
# in the page's table of contents).
napoleon_use_ivar = True
# The docstrings write `cuda_kernel` for a name of ours: a link where Sphinx knows the name, code otherwise.
default_role = "py:obj"

html_theme = "furo"
html_title = "jax_mosaic_ffi"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "source_edit_link": None,
    "navigation_with_keys": True,
}
html_show_sphinx = False
html_copy_source = False
pygments_style = "friendly"
pygments_dark_style = "monokai"

# Prompts and output are not copied with the code.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True


def setup(app):
  """Napoleon reads the first line of a property's or attribute's docstring as ``type: description``, which our prose
  ("The serialized module: the bytes the custom call carries.") is not: those docstrings skip napoleon."""
  originals = {}

  def keep(app, what, name, obj, options, lines):
    if what in ("property", "attribute", "data"):
      originals[name] = list(lines)

  def restore(app, what, name, obj, options, lines):
    if name in originals:
      lines[:] = originals.pop(name)

  app.connect("autodoc-process-docstring", keep, priority=100)  # before napoleon (500)
  app.connect("autodoc-process-docstring", restore, priority=900)
