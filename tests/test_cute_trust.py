"""What the runtime trusts of a CuTe DSL object, checked without a GPU (docs/threat_model.md, "CuTe DSL objects").

A CuTe DSL object is native x86-64 code that NVIDIA's runtime links into the process at instantiate. Before it
may: the module's symbol must be ours, the object an x86-64 ELF relocatable with a sane section and symbol table,
defining the entry points the runtime looks up by that prefix (a missing one aborts the process in the runtime);
the call's kernel_hash must be the module's sha256 (checked once per module, in the runtime's cache); and with
JAX_MOSAIC_FFI_HOST_CODE=lowered, the kernel must be one this process lowered. The checks run here through the
runtime's own code (the parser, its kernel cache, its policy); tests/test_cute_gpu.py feeds the same objects
through jitted programs on a GPU.
"""

import hashlib
import struct

import jax
import jax.numpy as jnp
import pytest

import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)
import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.native import core

import cute_kernels as K
import cute_objects as objects
from hlo_inspect import custom_calls

REFUSED = "CuTe DSL object 0 is refused before NVIDIA's runtime would link it into this process: "


def refusal(obj: bytes, prefix: str = "jmf_cute") -> str:
  with pytest.raises(ValueError) as refused:
    core.check_cute_object(obj, prefix)
  return str(refused.value)


def test_a_real_object_passes_and_plain_or_damaged_ones_are_refused_by_name(tmp_path):
  real = objects.real_object()
  core.check_cute_object(real, "jmf_cute")
  assert core.CUTE_PREFIX == "jmf_cute"
  missing_init = ("it does not define '_mlir_jmf_cute_cuda_init', which NVIDIA's runtime looks up (without it the "
                  "runtime aborts the process)")
  assert refusal(objects.gcc_object(tmp_path)) == missing_init
  assert refusal(objects.zeroed_body(real)).startswith("symbol ") or refusal(objects.zeroed_body(real)) == missing_init
  assert refusal(objects.zeroed_sections(real)) == "its object format version is ''; the runtime reads 1.0 and 1.1"
  for name in ("jmf_cute_kernel_info", "jmf_cute_function_name", "jmf_cute_version", "_mlir_jmf_cute_cuda_init",
               "_mlir_jmf_cute_cuda_load_to_device"):
    assert refusal(objects.renamed(real, name)).startswith(f"it does not define '{name}'"), name
  assert refusal(real, "other_prefix") == missing_init.replace("jmf_cute", "other_prefix")
  # In a module, the parser (Python's and instantiate's) refuses each before anything else sees it.
  with pytest.raises(module_format.ModuleFormatError, match="^malformed kernel module: " + REFUSED + "it does not"):
    module_format.parse(objects.module(objects.gcc_object(tmp_path)))
  with pytest.raises(module_format.ModuleFormatError, match="in a module whose symbol is 'mine'; CuTe DSL modules "
                                                            "are jax_mosaic_ffi's, of symbol 'jmf_cute'"):
    module_format.parse(objects.module(real, symbol="mine"))
  assert module_format.parse(objects.module(real)).images[0].data == real


def edited(obj: bytes, offset: int, fmt: str, value) -> bytes:
  out = bytearray(obj)
  struct.pack_into(fmt, out, offset, value)
  return bytes(out)


def test_every_header_field_and_offset_is_bounded():
  real = objects.real_object()
  shoff, shnum = struct.unpack_from("<Q", real, 40)[0], struct.unpack_from("<H", real, 60)[0]
  cases = {
      "it is not an ELF file": real[:63],
      "it is not a 64-bit little-endian ELF file of version 1": edited(real, 4, "<B", 1),
      "it is not an x86-64 relocatable object (ELF type 2, machine 62)": edited(real, 16, "<H", 2),
      "it is not an x86-64 relocatable object (ELF type 1, machine 183)": edited(real, 18, "<H", 183),
      "its ELF header is not a relocatable object's": edited(real, 58, "<H", 40),
      "its section table (": edited(real, 40, "<Q", len(real)),
      "its section table (65535 sections": edited(real, 60, "<H", 65535),
  }
  # Each section's offset and size, one at a time, beyond the file.
  for i in range(1, shnum):
    cases[f"section {i} "] = edited(real, shoff + 64 * i + 32, "<Q", 1 << 62)
  for expected, obj in cases.items():
    if expected.startswith("section "):
      kind, = struct.unpack_from("<I", real, shoff + 64 * int(expected.split()[1]) + 4)
      if kind == 8:  # NOBITS: no bytes in the file to bound
        continue
    assert refusal(obj).startswith(expected), (expected, refusal(obj))
  # Cut anywhere: refused, never read past the end.
  for cut in range(0, len(real), 97):
    refusal(real[:cut])


def test_the_kernel_table_and_the_host_function_name_are_what_the_runtime_reads(tmp_path):
  real = objects.real_object()
  info = real.index(b'{"kernel_cutlass')
  length = real.index(b"\0", info) - info

  def table(text: str) -> bytes:  # the object with another kernel table of the same length
    return real[:info] + text.ljust(length).encode() + real[info + length:]

  core.check_cute_object(table('{"k": {"9": 50, "10": -1}, "k2": {}}'), "jmf_cute")  # what the runtime reads
  for broken in ('["k"]', '{"k": 1}', '{"k": {"nine": 5}}', '{"k": {"9": "50"}}', '{"k": {"9": 12345678901}}',
                 '{"k": {"9": 5}', '{"k": {}} {}', '{"\\u006b": {}}', "{}" + "\t" * 3 + "x"):
    assert "kernel table jmf_cute_kernel_info is not what the runtime reads" in refusal(table(broken)), broken
  host = real.rindex(b"_mlir_jmf_cute__mlir_ciface_", 0, info)  # the host function's name, in the data
  other = real[:host] + b"X" + real[host + 1:]
  assert "host function's name 'Xmlir_jmf_cute__mlir_ciface_" in refusal(other)
  version = real.index(b"1.1\0")
  assert refusal(real[:version] + b"9.9" + real[version + 3:]) == ("its object format version is '9.9'; the "
                                                                    "runtime reads 1.0 and 1.1")
  # A C object with every entry point passes: what the code does is not checkable, which is the trust model.
  core.check_cute_object(objects.gcc_object(tmp_path, objects.IMPOSTOR), "jmf_cute")


def test_the_runtime_checks_kernel_hash_against_the_module_once(tmp_path):
  jmf.clear_kernel_cache()
  # Modules of every length modulo 64 (sha256's padding takes one or two blocks): the runtime's sha256 is hashlib's.
  for n in range(0, 200, 3):
    cubin = module_format.Image(module_format.ImageKind.CUBIN, module_format.Arch(90), b"\x7fELF" + bytes(n))
    data = module_format.serialize(module_format.ParsedModule(f"k{n}", (cubin,)), compress=False)
    assert core._testing.parse_kernel(hashlib.sha256(data).digest(), data) == f"k{n}"
    wrong = bytearray(hashlib.sha256(data + b"x").digest())
    with pytest.raises(ValueError, match=r"kernel_hash is not the sha256 of the module the call carries \(\d+ bytes"
                                         r"\): the program was edited after it was lowered"):
      core._testing.parse_kernel(bytes(wrong), data)
  # Parsed once under its hash, the module is not hashed again: a call of that hash gets what was checked.
  real = objects.module(objects.real_object())
  digest = hashlib.sha256(real).digest()
  before = core.cache_stats()
  assert core._testing.parse_kernel(digest, real) == "jmf_cute"
  assert core._testing.parse_kernel(digest, b"anything else") == "jmf_cute"
  after = core.cache_stats()
  assert after["module_parses"] - before["module_parses"] == 1
  assert after["parse_cache_hits"] - before["parse_cache_hits"] == 1
  jmf.clear_kernel_cache()


def test_host_code_is_run_only_where_this_process_lowered_it_when_asked(monkeypatch):
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  (cc,) = custom_calls(jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=x)).trace(x)
                       .lower(lowering_platforms=("cuda",)))
  lowered = cc["config"]["kernel_hash"]
  foreign = objects.kernel_hash(objects.module(objects.real_object(), version="4.8.0"))
  assert core.host_code_lowered(lowered) and not core.host_code_lowered(foreign)
  monkeypatch.delenv("JAX_MOSAIC_FFI_HOST_CODE", raising=False)
  assert core._testing.host_code_policy(foreign) == ""  # the default: any (an exported program runs anywhere)
  monkeypatch.setenv("JAX_MOSAIC_FFI_HOST_CODE", "any")
  assert core._testing.host_code_policy(foreign) == ""
  monkeypatch.setenv("JAX_MOSAIC_FFI_HOST_CODE", "lowered")
  assert core._testing.host_code_policy(lowered) == ""
  refused = core._testing.host_code_policy(foreign)
  assert refused.startswith(f"HostCodeRefused: the kernel's CuTe DSL object (kernel hash {foreign.hex()[:16]}...) "
                            "was not lowered by this process, and JAX_MOSAIC_FFI_HOST_CODE=lowered runs only host "
                            "code this process made"), refused
  monkeypatch.setenv("JAX_MOSAIC_FFI_HOST_CODE", "lowerd")
  assert "JAX_MOSAIC_FFI_HOST_CODE=lowerd is neither 'any' nor 'lowered'" in core._testing.host_code_policy(lowered)


def test_flipped_bytes_of_a_real_object_are_checked_within_bounds(rng):
  real = bytearray(objects.real_object())
  refused = 0
  for _ in range(3000):
    obj = bytearray(real)
    for at in rng.integers(0, len(obj), size=int(rng.integers(1, 4))):
      obj[at] = int(rng.integers(0, 256))
    try:
      core.check_cute_object(bytes(obj), "jmf_cute")
    except ValueError as e:
      refused += 1
      assert str(e).isprintable() and len(str(e)) < 2000
  assert refused > 0
