"""What a newcomer meets in the first hour, beyond the errors: `mosaic_kernel`'s signature names the launch options
most calls give, the README says how to see a source build's steps and where the release wheel comes from, the
compatibility page's pip line names the jax pip picks, and the CHANGELOG's "Unreleased" opens with a short summary
for users, its detail folded away."""

import inspect
import pathlib
import re

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import versions

REPO = pathlib.Path(__file__).resolve().parents[1]
needs_checkout = pytest.mark.skipif(not (REPO / "pyproject.toml").exists(), reason="needs the source checkout")


def test_mosaic_kernel_names_grid_block_and_scalars_in_its_signature():
  parameters = inspect.signature(jmf.mosaic_kernel).parameters
  assert {name: (parameters[name].kind, parameters[name].default) for name in ("grid", "block", "scalars")} == {
      "grid": (inspect.Parameter.KEYWORD_ONLY, None), "block": (inspect.Parameter.KEYWORD_ONLY, None),
      "scalars": (inspect.Parameter.KEYWORD_ONLY, ())}


def test_named_launch_options_reach_the_front_end_as_before():
  import jax
  import jax.numpy as jnp
  kernel = jmf.cuda_kernel('extern "C" __global__ void fill(float* y) {}', "fill")
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((8,), jnp.float32), grid=1, block=8,
                           fallback=lambda: jnp.zeros(8, jnp.float32))
  assert call().shape == (8,)


@needs_checkout
def test_the_readme_says_how_to_see_the_build_and_where_the_wheel_comes_from():
  install = (REPO / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
  assert "pip install -v ." in install and "still running" in install
  assert re.search(r"release wheel is not on PyPI: it is the one `bash scripts/build_wheel.sh` leaves in `dist/`",
                   install), install


@needs_checkout
def test_the_compatibility_page_says_pip_picks_the_newest_tested_jax():
  page = (REPO / "docs" / "compatibility.md").read_text()
  (picks,) = re.findall(r"jax-triton==0\.4\.1` picks jax (\S+) and", page)
  assert picks == versions.TESTED[-1]


@needs_checkout
def test_the_changelogs_unreleased_opens_with_a_short_summary_and_folds_the_detail():
  changelog = (REPO / "CHANGELOG.md").read_text()
  unreleased = changelog.split("## Unreleased\n", 1)[1].split("\n## ", 1)[0]
  summary, detail = unreleased.split("### Internal and detailed changes", 1)
  assert len(summary.strip().splitlines()) <= 40, "the summary is what a user reads: keep it short"
  assert detail.strip().startswith("<details>") and detail.strip().endswith("</details>")
