"""The serialized module: both parsers agree, and bad bytes never crash."""

import struct
import zlib

import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.module_format import Arch, Image, ImageKind, ParsedModule

import cute_objects
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
  newer[8:12] = (module_format.FORMAT_VERSION + 1).to_bytes(4, "little")
  with pytest.raises(ValueError, match=f"version {module_format.FORMAT_VERSION + 1} is newer"):
    _core.parse_module(bytes(newer))
  never = bytearray(data)
  never[8:12] = (0).to_bytes(4, "little")
  with pytest.raises(ValueError, match="version 0 was never written"):
    _core.parse_module(bytes(never))


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


# --- compressed images -------------------------------------------------------------------------------------

_PTX = b"".join(b".reg .f32 %%f%d;\nadd.f32 %%f%d, %%f%d, 0f3F800000;\n" % (i, i, i) for i in range(400))


def _compressible():
  return ParsedModule("add", (Image(ImageKind.CUBIN, Arch(90), b"\x7fELF" + bytes(300)),
                              Image(ImageKind.PTX, Arch(90), b".version 8.0\n.target sm_90\n" + _PTX),
                              Image(ImageKind.CUBIN, Arch(80), b"\x7fELF-tiny")))


def _headers(data: bytes) -> list[dict]:
  """Where each image's encoding, size and payload sit in `data` (module_format's layout)."""
  (symbol_length,) = struct.unpack_from("<I", data, 20)
  offset, out = 24 + symbol_length, []
  for _ in range(struct.unpack_from("<I", data, 16)[0]):
    encoding, size = struct.unpack_from("<IQ", data, offset + 12)
    out.append({"encoding_at": offset + 12, "encoding": encoding, "size_at": offset + 16, "payload": offset + 24,
                "size": size})
    offset += 24 + size
  return out


def test_images_are_compressed_where_that_makes_them_smaller():
  module = _compressible()
  data, plain = module_format.serialize(module), module_format.serialize(module, compress=False)
  assert [h["encoding"] for h in _headers(data)] == [module_format.ENCODING_ZLIB] * 2 + [0]
  assert [h["encoding"] for h in _headers(plain)] == [0, 0, 0]
  assert len(data) < len(plain) / 4
  assert module_format.parse(data) == module_format.parse(plain) == module
  symbol, images, flags = _core.parse_module(data)
  assert [d for *_, d in images] == [i.data for i in module.images]


def test_a_compiled_kernel_travels_compressed(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.SUM, "block_sum")
  raw = sum(len(image.data) for image in kernel.images)
  assert all(h["encoding"] == module_format.ENCODING_ZLIB for h in _headers(kernel.module))
  assert len(kernel.module) < raw / 2
  assert module_format.parse(kernel.module) == kernel.parsed


def test_format_1_modules_still_parse():
  """Artifacts exported before compression: version 1, every encoding field 0."""
  module = _compressible()
  old = bytearray(module_format.serialize(module, compress=False))
  old[8:12] = (1).to_bytes(4, "little")
  assert module_format.parse(bytes(old)) == module
  header = _headers(bytes(old))[0]
  old[header["encoding_at"]:header["encoding_at"] + 4] = module_format.ENCODING_ZLIB.to_bytes(4, "little")
  with pytest.raises(ValueError, match="image 0 has a nonzero reserved field"):
    _core.parse_module(bytes(old))


def _with_payload(data: bytes, index: int, payload: bytes, encoding: int | None = None) -> bytes:
  header = _headers(data)[index]
  out = bytearray(data[:header["payload"]]) + payload + data[header["payload"] + header["size"]:]
  out[header["size_at"]:header["size_at"] + 8] = len(payload).to_bytes(8, "little")
  if encoding is not None:
    out[header["encoding_at"]:header["encoding_at"] + 4] = encoding.to_bytes(4, "little")
  return bytes(out)


@pytest.mark.parametrize("case, match", [
    ("declares more", "inflates to 2.* bytes, not the 2.* it declares"),
    ("declares less", "inflates to more than the"),
    ("declares one less", "inflates to 2.* bytes, not the 2.* it declares"),
    ("declares zero", "declares 0 bytes"),
    ("past deflate's ratio", "declares 1099511627776 bytes inflated from"),
    ("no stream", "declares 2.* bytes inflated from 0"),
    ("too short for its size", "too short to say its inflated size"),
    ("cut short", "not a complete zlib stream"),
    ("checksum broken", "not a complete zlib stream"),
    ("bytes after the stream", "3 bytes follow the end of its zlib stream"),
    ("unknown encoding", "image 1 has unknown encoding 7"),
    ("inflates to a broken image", "image 0 is declared a cubin but is not an ELF file"),
])
def test_compressed_images_that_lie_are_refused(case, match):
  data = module_format.serialize(_compressible())
  ptx = _compressible().images[1].data
  stream = zlib.compress(ptx)
  size = struct.pack("<Q", len(ptx))
  crafted = {
      "declares more": lambda: _with_payload(data, 1, struct.pack("<Q", len(ptx) + 1) + stream),
      "declares less": lambda: _with_payload(data, 1, struct.pack("<Q", len(ptx) - 100) + stream),
      "declares one less": lambda: _with_payload(data, 1, struct.pack("<Q", len(ptx) - 1) + stream),
      "declares zero": lambda: _with_payload(data, 1, struct.pack("<Q", 0) + stream),
      "past deflate's ratio": lambda: _with_payload(data, 1, struct.pack("<Q", 1 << 40) + stream),
      "no stream": lambda: _with_payload(data, 1, size),
      "too short for its size": lambda: _with_payload(data, 1, size[:5]),
      "cut short": lambda: _with_payload(data, 1, size + stream[:-9]),
      "checksum broken": lambda: _with_payload(data, 1, size + stream[:-1] + bytes([stream[-1] ^ 1])),
      "bytes after the stream": lambda: _with_payload(data, 1, size + stream + b"abc"),
      "unknown encoding": lambda: _with_payload(data, 1, size + stream, encoding=7),
      "inflates to a broken image": lambda: _with_payload(
          data, 0, struct.pack("<Q", 304) + zlib.compress(b"\x00ELF" + bytes(300))),
  }[case]()
  with pytest.raises(ValueError, match=match):
    _core.parse_module(crafted)
  with pytest.raises(module_format.ModuleFormatError):
    module_format.parse(crafted)


def test_bit_flips_in_compressed_images_never_crash_the_parser(rng):
  data = module_format.serialize(_compressible())
  start = _headers(data)[0]["payload"]
  accepted = 0
  for _ in range(2000):
    mutated = bytearray(data)
    for position in rng.integers(start, len(mutated), size=rng.integers(1, 3)):
      mutated[position] = int(rng.integers(0, 256))
    try:
      _core.parse_module(bytes(mutated))
      accepted += bytes(mutated) == data
    except ValueError:
      pass
  assert accepted < 2000  # the flips reached the parser as changes, and it refused the bad ones


def test_a_compressed_cute_object_keeps_its_release_and_host_arguments(tmp_path):
  kinds = (module_format.HOST_ARG_POINTER, module_format.HOST_ARG_INT64)
  # An object with the entry points the parser asks of one (tests/cute_objects.py), and 4000 bytes after it.
  elf = cute_objects.gcc_object(tmp_path, cute_objects.IMPOSTOR) + bytes(4000)
  obj = Image(ImageKind.CUTE, Arch(90, "a"), elf, "4.8.1", kinds)
  module = ParsedModule("jmf_cute", (obj,))
  data = module_format.serialize(module)
  assert _headers(data)[0]["encoding"] == module_format.ENCODING_ZLIB and len(data) < len(elf) // 2
  assert module_format.parse(data) == module
  symbol, ((kind, arch, suffix, blob, release, arg_kinds),), flags = _core.parse_module(data)
  assert (blob, release, tuple(arg_kinds)) == (obj.data, "4.8.1", kinds)


# --- which image a GPU loads (runtime/kernel_cache.cc: SelectImage, docs/contract.md) -------------------------

def _pick(images, arch):
  module = ParsedModule("k", tuple(Image(ImageKind.CUBIN if kind == "cubin" else ImageKind.PTX, Arch.parse(sm),
                                         b"\x7fELF" if kind == "cubin" else b".version 8.0\n") for kind, sm in images))
  index = _core._testing.select_image(module_format.serialize(module), arch)
  return None if index < 0 else images[index]


@pytest.mark.parametrize("images, arch, picked", [
    # An exact cubin first, whatever its suffix.
    ([("cubin", "sm_80"), ("cubin", "sm_90a"), ("ptx", "sm_80")], 90, ("cubin", "sm_90a")),
    # Else a generic cubin of the same major version, the newest below the GPU's.
    ([("cubin", "sm_80"), ("cubin", "sm_86"), ("ptx", "sm_80")], 89, ("cubin", "sm_86")),
    # A family cubin runs on later minor versions of its major one (sm_100f on sm_103), not on another major.
    ([("cubin", "sm_100f"), ("ptx", "sm_90")], 103, ("cubin", "sm_100f")),
    ([("cubin", "sm_100f"), ("ptx", "sm_90")], 120, ("ptx", "sm_90")),
    # An arch-specific cubin runs on its own arch only: sm_90a is no cubin for sm_100, whose driver JITs PTX.
    ([("cubin", "sm_90a"), ("ptx", "sm_80")], 100, ("ptx", "sm_80")),
    # Generic PTX for any later arch (the newest that fits), family PTX within its major, arch-specific for its own.
    ([("ptx", "sm_70"), ("ptx", "sm_80"), ("ptx", "sm_120")], 100, ("ptx", "sm_80")),
    ([("ptx", "sm_100f")], 103, ("ptx", "sm_100f")),
    ([("ptx", "sm_100f")], 120, None),
    ([("ptx", "sm_90a")], 90, ("ptx", "sm_90a")),
    ([("ptx", "sm_90a")], 100, None),
    ([("cubin", "sm_90"), ("cubin", "sm_100")], 80, None),
])
def test_each_gpu_loads_the_image_the_contract_names(images, arch, picked):
  assert _pick(images, arch) == picked
  # `pack check` asks the same rule from the images a pack's manifest names, without the module's bytes.
  kinds = [(ImageKind.CUBIN if kind == "cubin" else ImageKind.PTX, Arch.parse(sm)) for kind, sm in images]
  index = module_format.served_image(kinds, arch)
  assert (None if index is None else images[index]) == picked


@pytest.mark.parametrize("images, arch, picked", [
    # A CuTe DSL module: its own arch, or a generic or family build of its major version; an 'a' one elsewhere never.
    ([("cute", "sm_100a"), ("cute", "sm_90a")], 100, 0),
    ([("cute", "sm_100a")], 103, None),
    ([("cute", "sm_100")], 103, 0),
    ([("cute", "sm_100f")], 103, 0),
    ([("cute", "sm_100f")], 120, None),
])
def test_a_cute_dsl_module_is_served_by_its_own_rule(images, arch, picked):
  assert module_format.served_image([(ImageKind.CUTE, Arch.parse(sm)) for _, sm in images], arch) == picked
  assert [module_format.parse_image_name(module_format.image_name(ImageKind.CUTE, Arch.parse(sm)))
          for _, sm in images] == [(ImageKind.CUTE, Arch.parse(sm)) for _, sm in images]
