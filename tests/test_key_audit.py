"""The key audit (JAX_MOSAIC_FFI_KEY_AUDIT=1, jax_mosaic_ffi/store/key_audit.py): a cache hit whose kernel was
compiled from other IR than the call makes is refused by name, in memory and on disk, for every front end. Each test
breaks a key on purpose (one of ours, made lossy as the old ones were) and shows that the audit catches the stale
kernel it would serve; and that a proven hit is counted, an unwitnessed entry is compiled again, and a bad setting
is an error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.errors import KeyAuditError
from jax_mosaic_ffi.pack import build as pack_build
from jax_mosaic_ffi.store import compile_cache
from jax_mosaic_ffi.pack import recordings
from jax_mosaic_ffi.store import pack_record
from jax_mosaic_ffi.store import packs

import fresh_process
import kernel_sources
from hlo_inspect import lower

X = jax.ShapeDtypeStruct((4096,), jnp.float32)


@pytest.fixture(autouse=True)
def audited(monkeypatch, isolated_disk_cache):
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "1")


def triton_call(table):
  from triton_required import import_triton
  import_triton()
  import triton_sources as ts
  return lambda x: jmf.triton_call(x, kernel=ts.add_entry_of, out_type=x, n=x.size, grid=(16,), TABLE=table,
                                   BLOCK=256)


def test_a_lossy_triton_key_is_caught_in_memory(monkeypatch):
  lower(triton_call(np.full(2000, 0.5)), X)
  from jax_mosaic_ffi.triton.compiler import keys as triton_keys
  keyed = triton_keys.constexpr_key
  # A key that reads an array by its shape only: the bug class of the repr keys.
  monkeypatch.setattr(triton_keys, "constexpr_key",
                      lambda v: keyed(v.shape) if isinstance(v, np.ndarray) else keyed(v))
  lower(triton_call(np.full(2000, 0.5)), X)  # its first entry, made under the lossy key
  before = compile_cache.stats().audits
  lower(triton_call(np.full(2000, 0.5)), X)
  assert compile_cache.stats().audits == before + 1  # a proven hit
  with pytest.raises(KeyAuditError, match=r"(?s)triton_kernel 'add_entry_of'.*memory entry.*another Triton "
                                          r"specialization.*first difference"):
    lower(triton_call(np.full(2000, 0.625)), X)


def cute_call(alpha):
  import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)
  import cute_kernels
  return lambda a: jmf.mosaic_kernel(jmf.cute_kernel(cute_kernels.axpy, alpha=alpha, targets=("sm_90a",)),
                                     lambda a, b: a)(a, a)


def test_a_lossy_cute_key_is_caught(monkeypatch):
  from jax_mosaic_ffi.cute.compiler import plan
  monkeypatch.setattr(plan.cute_keys, "exact_key", lambda v, **kw: b"every constexpr alike")
  a = jax.ShapeDtypeStruct((16, 8), jnp.float32)
  lower(cute_call(2.0), a)
  with pytest.raises(KeyAuditError, match=r"(?s)cute_kernel 'axpy'.*another CuTe DSL MLIR.*3\.0"):
    lower(cute_call(3.0), a)


def cuda_call(source):
  kernel = jmf.cuda_kernel(source, "add")
  return lambda x: jmf.mosaic_kernel(kernel, lambda a, b: a, grid=(16,), block=(256,),
                                     scalars=(np.int32(4096),))(x, x)


def test_a_lossy_nvrtc_key_is_caught(monkeypatch):
  from jax_mosaic_ffi.cuda.nvrtc import compiler
  keyed = compiler.cache_key
  monkeypatch.setattr(compiler, "cache_key", lambda source, *a, **k: keyed("any source", *a, **k))
  lower(cuda_call(kernel_sources.ADD), X)
  with pytest.raises(KeyAuditError, match=r"(?s)cuda_kernel 'add'.*another PTX.*this call"):
    cuda_call(kernel_sources.ADD.replace("a[i] + b[i]", "a[i] - b[i]"))


LOSSY_ON_DISK = '''
  import sys
  import numpy as np
  from jax_mosaic_ffi.triton.compiler import keys as triton_keys
  keyed = triton_keys.constexpr_key
  triton_keys.constexpr_key = lambda v: keyed(v.shape) if isinstance(v, np.ndarray) else keyed(v)
  import test_key_audit as t
  from hlo_inspect import lower
  lower(t.triton_call(np.full(2000, float(sys.argv[1]))), t.X)
  print("{}")
'''


def test_a_lossy_key_is_caught_on_disk_in_another_process():
  import triton_required
  triton_required.import_triton()
  fresh_process.run(LOSSY_ON_DISK, "0.5")
  stale = fresh_process.run(LOSSY_ON_DISK, "0.625", check=False)
  assert stale.returncode != 0 and "KeyAuditError" in stale.stderr and "disk entry" in stale.stderr, \
      stale.stderr[-3000:]


def test_an_entry_made_without_the_audit_is_compiled_again_under_it(monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "0")
  lower(triton_call(np.full(2000, 0.5)), X)
  jmf.clear_kernel_cache()  # memory only: the disk entry stays, without a witness
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "1")
  before = compile_cache.stats()
  lower(triton_call(np.full(2000, 0.5)), X)
  after = compile_cache.stats()
  assert after.compiles["triton"] == before.compiles["triton"] + 1 and after.audits == before.audits
  jmf.clear_kernel_cache()
  lower(triton_call(np.full(2000, 0.5)), X)  # its disk entry now has a witness
  final = compile_cache.stats()
  assert final.audits == after.audits + 1 and final.compiles["triton"] == after.compiles["triton"]


@pytest.fixture
def strict_pack(tmp_path, monkeypatch):
  """``make()`` recorded into a pack (the caches emptied after), which is then in use in strict mode."""
  for name in (packs.PACKS_ENV, packs.STRICT_ENV, pack_record.ENV):
    monkeypatch.delenv(name, raising=False)
  packs.forget()

  def use(make):
    monkeypatch.setenv(pack_record.ENV, str(tmp_path / "recording"))
    make()
    monkeypatch.delenv(pack_record.ENV)
    built = pack_build.build(recordings.read(str(tmp_path / "recording")))
    path = str(tmp_path / "recorded.jmfpack")
    pack_file.write(path, built.entries, built.created, built.notes)
    jmf.clear_kernel_cache(disk=True)  # the witnesses too: the pack's entries have none here
    monkeypatch.setenv(packs.PACKS_ENV, path)
    monkeypatch.setenv(packs.STRICT_ENV, "1")

  yield use
  packs.forget()


def test_the_audit_proves_a_pack_entry_in_strict_mode(strict_pack):
  # The audit compiles an entry without a witness again to prove it; a pack's entries have none, and strict mode
  # refused that compile as if the kernel were missing from the pack (NotInPacks for a kernel the pack holds).
  strict_pack(lambda: lower(triton_call(np.full(2000, 0.5)), X))
  before = compile_cache.stats()
  lower(triton_call(np.full(2000, 0.5)), X)  # in the pack: compiled again as the audit's proof, and witnessed
  after = compile_cache.stats()
  assert after.compiles["triton"] == before.compiles["triton"] + 1
  jmf.clear_kernel_cache()
  lower(triton_call(np.full(2000, 0.5)), X)  # the pack's entry, proven by the witness the proof left
  final = compile_cache.stats()
  assert final.pack_hits == after.pack_hits + 1 and final.audits == after.audits + 1
  assert final.compiles["triton"] == after.compiles["triton"]
  with pytest.raises(jmf.NotInPacks, match="'add_entry_of' at "):  # not in the pack: still refused
    lower(triton_call(np.full(2000, 0.625)), X)


def test_a_bad_audit_setting_is_an_error(monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "sometimes")
  with pytest.raises(ValueError, match="JAX_MOSAIC_FFI_KEY_AUDIT='sometimes'.*set it to 1"):
    jmf.cuda_kernel(kernel_sources.ADD, "add")
