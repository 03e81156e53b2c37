"""scripts/ffi_headers.py as a module for the tests: the jaxlib releases in range, their FFI headers, the manifest."""

import importlib.util
import os

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "ffi_headers.py")


def load():
  spec = importlib.util.spec_from_file_location("ffi_headers", PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
