#!/usr/bin/env bash
# Builds the docs site into build/docs/html (open build/docs/html/index.html) and checks it: Sphinx with warnings
# as errors (a broken cross-reference, a heading anchor that does not exist, a page in no toctree, a docstring
# that does not parse), then every relative link and anchor of the built HTML (scripts/check_docs_links.py).
# Sets up the venv as scripts/test.sh does, with the `docs` extra; docs/contributing/docs.md says more.
#
#   JMF_DOCS_OUT  where to build (default build/docs)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/setup_env.sh" docs
cd "$repo"
out="${JMF_DOCS_OUT:-$repo/build/docs}"
# autosummary writes a page per public name here at each build: a name no longer listed leaves no page behind.
rm -rf docs/reference/generated "$out/html"
# No GPU is needed: autodoc imports the package, which opens libcuda only when a kernel runs.
JAX_PLATFORMS=cpu "$venv/bin/python" -m sphinx -b html -W --keep-going -q -d "$out/doctrees" docs "$out/html"
"$venv/bin/python" scripts/check_docs_links.py "$out/html"
echo "docs: built and checked, $out/html/index.html"
