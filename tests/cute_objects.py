"""CuTe DSL objects for the trust tests (tests/test_cute_trust.py, tests/test_cute_gpu.py): a real one, compiled
here, and what a damaged or hostile artifact carries instead: a plain `gcc -c` object, the real one with its body
zeroed or an entry point renamed, and modules holding any of them, written here without the package's writer
(which would refuse them, as the runtime's parser does)."""

import functools
import hashlib
import os
import struct
import subprocess

import pytest

from jax_mosaic_ffi.cute.compiler import package as cute_package

PREFIX = "jmf_cute"


@functools.cache
def real_object() -> bytes:
  """add_one's object, as dump_to_object made it for sm_90a."""
  import jax
  import jax.numpy as jnp
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.base import module_format
  import cute_kernels as K
  from hlo_inspect import custom_calls
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  saved = os.environ.get("JAX_MOSAIC_FFI_CACHE_DIR")
  os.environ["JAX_MOSAIC_FFI_CACHE_DIR"] = "off"  # compiled here, never read from or left in a disk cache
  try:
    (cc,) = custom_calls(jax.jit(jmf.cute_call(K.add_one, output_shape_dtype=x)).trace(x)
                         .lower(lowering_platforms=("cuda",)))
  finally:
    if saved is None:
      del os.environ["JAX_MOSAIC_FFI_CACHE_DIR"]
    else:
      os.environ["JAX_MOSAIC_FFI_CACHE_DIR"] = saved
  (image,) = module_format.parse(cc["config"]["module"]).images
  return image.data


def gcc_object(folder, source: str = "int add(int a, int b) { return a + b; }\n") -> bytes:
  """A plain C object, as `gcc -c` makes it: an x86-64 relocatable like the DSL's, without its entry points."""
  if os.environ.get("JMF_WITHOUT_COMPILER"):  # CI's step that proves the wheel builds nothing hides gcc
    pytest.skip("no C compiler here (scripts/without_compiler.sh) to make a plain object with")
  c, o = folder / "plain.c", folder / "plain.o"
  c.write_text(source)
  subprocess.run(["gcc", "-c", "-O1", str(c), "-o", str(o)], check=True)
  return o.read_bytes()


# A C object that defines every entry point the runtime looks up, with well-formed strings: the check cannot tell
# it from the DSL's (what its code does is the trust model: JAX_MOSAIC_FFI_HOST_CODE=lowered refuses it).
IMPOSTOR = r"""
void jmf_cute_cuda_init(void) {}
void _mlir_jmf_cute_cuda_init(void) {}
void jmf_cute_cuda_load_to_device(void) {}
void _mlir_jmf_cute_cuda_load_to_device(void) {}
void _mlir_jmf_cute__mlir_ciface_entry(void) {}
const char jmf_cute_function_name[] = "_mlir_jmf_cute__mlir_ciface_entry";
const char jmf_cute_kernel_info[] = "{\"k\": {\"9\": 50}}";
const char jmf_cute_version[] = "1.1";
"""


def _section_table(obj: bytes) -> tuple[int, int]:
  (shoff,) = struct.unpack_from("<Q", obj, 40)
  (shnum,) = struct.unpack_from("<H", obj, 60)
  return shoff, shnum


def zeroed_body(obj: bytes) -> bytes:
  """Every byte between the ELF header and the section table zeroed: the sections' contents, symbols included."""
  shoff, _ = _section_table(obj)
  return obj[:64] + bytes(shoff - 64) + obj[shoff:]


def zeroed_sections(obj: bytes, types=(1,)) -> bytes:
  """The contents of the sections of these types zeroed (1: code and data), the symbol table left whole."""
  shoff, shnum = _section_table(obj)
  out = bytearray(obj)
  for i in range(shnum):
    kind, = struct.unpack_from("<I", obj, shoff + 64 * i + 4)
    offset, size = struct.unpack_from("<QQ", obj, shoff + 64 * i + 24)
    if kind in types:
      out[offset:offset + size] = bytes(size)
  return bytes(out)


def renamed(obj: bytes, name: str) -> bytes:
  """The symbol ``name`` renamed (its last letter changed) in the string table: the object no longer defines it."""
  old = b"\0" + name.encode() + b"\0"
  assert obj.count(old) == 1, name
  return obj.replace(old, old[:-2] + bytes([old[-2] ^ 1]) + b"\0")


def module(obj: bytes, symbol: str = PREFIX, version: str | None = None, kinds=(1, 2, 1, 2), arch=90,
           suffix=1) -> bytes:
  """A module of one CuTe DSL image holding ``obj``, stored: the format of base/module_format.py, written here so
  that nothing checks it before the runtime does."""
  version = (version or cute_package.runtime().release).encode()
  payload = b"".join([struct.pack("<I", len(version)), version, struct.pack("<I", len(kinds)),
                      struct.pack(f"<{len(kinds)}I", *kinds), obj])
  name = symbol.encode()
  return b"".join([struct.pack("<8sIIII", b"JMFFIMOD", 2, 0, 1, len(name)), name,
                   struct.pack("<IIIIQ", 3, arch, suffix, 0, len(payload)), payload])


def kernel_hash(data: bytes) -> bytes:
  return hashlib.sha256(data).digest()
