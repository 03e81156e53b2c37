"""The guard of the tests of kernel libraries' own kernels (quack-kernels, flash-attn-4): they skip where the
library or torch (which both import) is not installed, and fail where one is installed but does not import (a
missing CUDA library of torch's, a bad build), which a skip would hide."""

import importlib

import pytest


def import_or_skip(module: str, package: str):
  """`module`; skips the calling test module (at its import) where `package` or torch is not installed."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    if (e.name or "").split(".")[0] not in (module.split(".")[0], "torch"):
      raise
    pytest.skip(f"{package} is not installed here ({e}); pip install {package}", allow_module_level=True)
