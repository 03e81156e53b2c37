"""The serialized module: both parsers agree, and bad bytes never crash."""

import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.module_format import Arch, Image, ImageKind, ParsedModule

import kernel_sources


def _module():
  return ParsedModule("_Z3fooPf", (Image(ImageKind.CUBIN, Arch(90), b"\x7fELF" + bytes(range(200))),
                             Image(ImageKind.CUBIN, Arch(90, "a"), b"\x7fELF-a"),
                             Image(ImageKind.PTX, Arch(80), b".version 8.0\n.target sm_80\n")))


def test_round_trip_through_python_and_the_cpp_parser():
  module = _module()
  data = module_format.serialize(module)
  assert module_format.parse(data) == module
  symbol, images, flags = _core.parse_module(data)
  assert symbol == module.symbol
  assert [(k, a, s, d) for k, a, s, d in images] == [
      (1, 90, 0, module.images[0].data), (1, 90, 1, b"\x7fELF-a"), (2, 80, 0, module.images[2].data)]


def test_a_compiled_kernel_round_trips(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  symbol, images, flags = _core.parse_module(kernel.module)
  assert symbol == "add"
  assert [d for *_, d in images] == [i.data for i in kernel.images]


@pytest.mark.parametrize("cut", [0, 7, 8, 12, 23, 24, 26, 30, 50, -1])
def test_every_truncation_is_refused_by_both_parsers(cut):
  data = module_format.serialize(_module())
  truncated = data[:cut] if cut >= 0 else data[:-1]
  with pytest.raises(ValueError):
    module_format.parse(truncated)
  with pytest.raises(ValueError):
    _core.parse_module(truncated)


def test_lengths_past_the_end_and_trailing_bytes_are_refused():
  data = bytearray(module_format.serialize(_module()))
  huge_symbol = bytearray(data)
  huge_symbol[20:24] = (2**32 - 1).to_bytes(4, "little")
  with pytest.raises(ValueError, match="symbol"):
    _core.parse_module(bytes(huge_symbol))
  huge_image = bytearray(data)
  offset = 24 + len("_Z3fooPf") + 16
  huge_image[offset:offset + 8] = (2**63).to_bytes(8, "little")
  with pytest.raises(ValueError, match="image 0"):
    _core.parse_module(bytes(huge_image))
  with pytest.raises(ValueError, match="trailing"):
    _core.parse_module(bytes(data) + b"x")
  newer = bytearray(data)
  newer[8:12] = (2).to_bytes(4, "little")
  with pytest.raises(ValueError, match="version 2"):
    _core.parse_module(bytes(newer))


def test_random_garbage_and_bit_flips_never_crash_the_parser(rng):
  data = module_format.serialize(_module())
  for _ in range(2000):
    mutated = bytearray(data)
    for position in rng.integers(0, len(mutated), size=rng.integers(1, 4)):
      mutated[position] = int(rng.integers(0, 256))
    try:
      _core.parse_module(bytes(mutated))
    except ValueError:
      pass
  for _ in range(500):
    garbage = b"JMFFIMOD" + rng.integers(0, 256, size=rng.integers(0, 64), dtype=np.uint8).tobytes()
    with pytest.raises(ValueError):
      _core.parse_module(garbage)
