"""Kernel packs in one process: the file's format and its refusals (tampered, truncated, foreign, not the user's),
a pack as a cache tier ahead of the disk cache, NVRTC entries' headers on another machine, the strict mode, the
default targets setting, and autotuning timings in packs. Recording programs and loading packs in fresh processes
(without NVRTC, on the GPU, from the oldest jax) is tests/test_pack_loading.py."""

import dataclasses
import json
import os
import stat

import jax
import jax.numpy as jnp
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.pack import build as pack_build
from jax_mosaic_ffi.toolchain import kernel as kernel_lib
from jax_mosaic_ffi.pack import recordings
from jax_mosaic_ffi.store import pack_record
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.transforms import autotune as autotuning
from jax_mosaic_ffi.transforms import tuning_files
from jax_mosaic_ffi.store import tuning_records

import kernel_sources
from test_autotune import add_factory

X = jax.ShapeDtypeStruct((1000,), jnp.float32)


@pytest.fixture
def clean_packs(isolated_disk_cache, monkeypatch, tmp_path):
  for name in (packs.PACKS_ENV, packs.STRICT_ENV, pack_record.ENV, kernel_lib.TARGETS_ENV):
    monkeypatch.delenv(name, raising=False)
  packs.forget()
  yield tmp_path
  packs.forget()


def _stats():
  return jmf.kernel_cache_stats()


def _recorded(folder, monkeypatch, make):
  """What ``make()`` compiles, recorded into ``folder`` and built into a pack there; the caches emptied after."""
  monkeypatch.setenv(pack_record.ENV, str(folder / "recording"))
  make()
  monkeypatch.delenv(pack_record.ENV)
  built = pack_build.build(recordings.read(str(folder / "recording")))
  path = str(folder / "recorded.jmfpack")
  pack_file.write(path, built.entries, built.created, built.notes)
  jmf.clear_kernel_cache(disk=True)
  return path, built


def _entry(key="ab" * 32, payload=b"kernel bytes", kind="compile"):
  return pack_file.Entry(key, kind, payload, {"kernel": "k", "targets": ["sm_90"]})


def test_a_pack_reads_back_whole(clean_packs):
  path = str(clean_packs / "a.jmfpack")
  digest = pack_file.write(path, [_entry(), _entry("cd" * 32, b"")], {"jax": jax.__version__},
                           {"untuned": [{"name": "f", "why": "no file"}]})
  pack = pack_file.read(path)
  assert pack.digest == digest and set(pack.entries) == {"ab" * 32, "cd" * 32}
  assert pack.entries["ab" * 32].payload == b"kernel bytes" and pack.notes["untuned"][0]["why"] == "no file"
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
  # Written as version 3 (an NVRTC compile's headers in the pack's table); versions 1 and 2 still read
  # (tests/test_pack_loading.py loads one made under the oldest jax; test_a_version_2_pack_is_still_read).
  with open(path, "rb") as f:
    assert f.read(12)[8:] == (3).to_bytes(4, "little")


def test_a_pack_is_in_memory_once_while_it_is_read(clean_packs):
  # Each process (one per GPU) reads the pack: the file is read in pieces into its digest, and only the entries'
  # own bytes are held (it was read whole, copied whole for its digest, then copied per entry; then read into one
  # buffer and copied per entry: twice its size).
  import tracemalloc
  path = str(clean_packs / "large.jmfpack")
  payloads = [os.urandom(4 << 20) for _ in range(4)]
  pack_file.write(path, [_entry(f"{n:064x}", p) for n, p in enumerate(payloads)], {})
  size = os.path.getsize(path)
  tracemalloc.start()
  try:
    pack = pack_file.read(path)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert [e.payload for e in pack.entries.values()] == payloads
  assert peak < 1.35 * size, f"{peak / size:.2f} times the pack's size"


def _imaged(n: int, images: list[str], payload: bytes) -> pack_file.Entry:
  return pack_file.Entry(f"{n:064x}", "compile", payload, {"kernel": f"k{n}", "images": images})


def test_a_process_holds_only_the_compiles_that_load_on_its_gpus_and_verifies_all_of_them(clean_packs):
  import tracemalloc
  path = str(clean_packs / "fleet.jmfpack")
  archs = [["cubin sm_90a", "ptx sm_90a"], ["cubin sm_90"], ["cubin sm_100a"], ["cubin sm_100f"], ["cubin sm_120a"],
           ["cubin sm_120f"]]
  payloads = [os.urandom(4 << 20) for _ in archs]
  timing = pack_file.Entry("ee" * 32, "tuning", b"{}", {"device": "NVIDIA B200"})
  pack_file.write(path, [*(_imaged(n, a, p) for n, (a, p) in enumerate(zip(archs, payloads))), timing], {})
  size = os.path.getsize(path)
  tracemalloc.start()
  try:
    pack = pack_file.read(path, keep=packs._for_these_gpus((90,)))  # a process of an H100
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert {k: e.payload for k, e in pack.entries.items()} == {f"{0:064x}": payloads[0], f"{1:064x}": payloads[1],
                                                             "ee" * 32: b"{}"}
  assert pack.left_out == 4 and peak < 0.6 * size, f"{peak / size:.2f} times the pack's size"
  # A B300 (sm_103) loads the family cubin of its generation, not sm_100a's; a process without a GPU holds all.
  assert set(pack_file.read(path, keep=packs._for_these_gpus((103,))).entries) == {f"{3:064x}", "ee" * 32}
  assert packs._for_these_gpus(()) is None and len(pack_file.read(path).entries) == 7
  # An entry this process leaves out is in the digest all the same: altered, the whole pack is refused.
  with open(path, "r+b") as f:
    f.seek(size - 32 - (4 << 20) - 8)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 1]))
  with pytest.raises(jmf.PackError, match="is damaged: its digest does not match"):
    pack_file.read(path, keep=packs._for_these_gpus((90,)))


@pytest.mark.parametrize("damage, said", [
    (lambda data: data[:-1], "damaged: its digest does not match"),
    (lambda data: data[:len(data) // 2], "damaged: its digest does not match"),
    (lambda data: data[:-40] + bytes([data[-40] ^ 1]) + data[-39:], "damaged: its digest does not match"),
    (lambda data: data[:8] + (4).to_bytes(4, "little") + data[12:], "pack format version 4, and this jax_mosaic_ffi "
                                                                    "reads versions 1, 2, 3"),
    (lambda data: b"PK\x03\x04" + data[4:], "is not a jax_mosaic_ffi pack"),
])
def test_a_tampered_truncated_or_foreign_pack_is_refused_by_name(clean_packs, damage, said):
  path = str(clean_packs / "model.jmfpack")
  pack_file.write(path, [_entry()], {})
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(damage(data))
  with pytest.raises(jmf.PackError, match=said) as refused:
    jmf.load_pack(path)
  assert path in str(refused.value)
  assert packs.paths() == []  # nothing of it is used


def _rewritten(path, edit):
  """The pack at ``path`` with its manifest edited by ``edit`` and its digest made right again: what a forger who
  can write the file makes."""
  import hashlib
  import struct
  with open(path, "rb") as f:
    data = f.read()
  _, _, size = struct.unpack_from("<8sII", data)
  manifest = json.loads(data[16:16 + size])
  edit(manifest)
  text = json.dumps(manifest).encode()
  body = data[:12] + struct.pack("<I", len(text)) + text + data[16 + size:-32]
  with open(path, "wb") as f:
    f.write(body + hashlib.sha256(body).digest())


@pytest.mark.parametrize("edit, said", [
    (lambda m: m["entries"][0].update(kind="script"), "entries\\[0\\].kind is not one of"),
    (lambda m: m["entries"][0].update(size=1 << 40), "entries\\[0\\].size is not a size"),
    (lambda m: m["entries"][0].update(size=3), "its entries hold 3 bytes, and it has 12"),
    (lambda m: m["entries"][0].update(sha256="00" * 32), "entry abab.* does not match its sha256"),
    (lambda m: m["entries"][0]["about"].update(kernel="x" * 5000), "is not a string of at most 4096"),
    (lambda m: m["entries"][0]["about"].update(shell="rm"), "unknown field 'shell'"),
    (lambda m: m.update(extra=1), "unknown fields"),
    (lambda m: m["entries"].append(dict(m["entries"][0], size=0)), "is not a new key"),
])
def test_every_value_of_a_manifest_is_bounded_before_use(clean_packs, edit, said):
  path = str(clean_packs / "forged.jmfpack")
  pack_file.write(path, [_entry()], {})
  _rewritten(path, edit)
  with pytest.raises(jmf.PackError, match=said):
    pack_file.read(path)


def test_a_version_2_pack_is_still_read(clean_packs):
  path = str(clean_packs / "old.jmfpack")
  pack_file.write(path, [_entry()], {})

  def as_version_2(manifest):
    manifest["version"] = 2
  _rewritten(path, as_version_2)
  with open(path, "r+b") as f:  # the file's version too, and its digest made right again
    data = bytearray(f.read())
    data[8:12] = (2).to_bytes(4, "little")
    import hashlib
    data[-32:] = hashlib.sha256(data[:-32]).digest()
    f.seek(0)
    f.write(data)
  assert pack_file.read(path).entries["ab" * 32].payload == b"kernel bytes"


# Headers with a deep include tree (CCCL's), shared by every kernel below.
_SHARED = """#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda/std/limits>
extern "C" __global__ void scale_{n}(__half* y) {{ y[0] = __hmul(y[0], __float2half({n}.0f)); }}
"""


def test_many_nvrtc_kernels_sharing_headers_store_them_once_and_a_tampered_table_is_refused(clean_packs, monkeypatch):
  count = 6
  make = lambda: [jmf.cuda_kernel(_SHARED.format(n=n), f"scale_{n}") for n in range(count)]  # noqa: E731
  path, built = _recorded(clean_packs, monkeypatch, make)
  payloads = {e.key: e.payload for e in built.entries}
  pack = pack_file.read(path)
  assert {k: e.payload for k, e in pack.entries.items()} == payloads  # every entry as it was recorded
  with open(path, "rb") as f:
    data = f.read()
  manifest = json.loads(data[16:16 + int.from_bytes(data[12:16], "little")])
  # Every kernel read the same headers: one list of rows, each row once in the table.
  (refs,) = {tuple(row["headers"]) for row in manifest["entries"]}
  assert len(refs) > 10 and sorted(refs) == list(range(len(manifest["headers"])))
  # Each header once: the pack is far smaller than its entries' bytes (what version 2 held, plus its manifest).
  assert os.path.getsize(path) < sum(map(len, payloads.values())) / 2
  # Served as before: no compile, each header checked by the loader.
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  before = _stats()
  make()
  assert _stats().pack_hits == before.pack_hits + count
  # A header's sha256 changed in the shared table (by one who can write the pack and its digest): refused whole.
  packs.forget()
  jmf.clear_kernel_cache()
  _rewritten(path, lambda m: m["headers"][0].__setitem__(1, "0" * 64))
  with pytest.raises(jmf.PackError, match="is damaged: entry [0-9a-f]+ does not match its sha256"):
    jmf.load_pack(path)
  for edit, said in ((lambda m: m["entries"][0].__setitem__("headers", [len(m["headers"])]), "entries\\[0\\].headers"),
                     (lambda m: m["headers"].append(["", None]), "bad deps")):
    pack_file.write(path, built.entries, built.created, built.notes)
    _rewritten(path, edit)
    with pytest.raises(jmf.PackError, match=said):
      pack_file.read(path)


def _with_one_header(path: str, header_path: str) -> None:
  """A pack of one compile entry whose JSON header lists one header, factored into the pack's table."""
  import struct
  header = json.dumps({"deps": [[header_path, "0" * 64]], "name": "k"}).encode()
  payload = struct.pack("<I", len(header)) + header + b"the module"
  pack_file.write(path, [_entry(payload=payload)], {})


def test_a_small_pack_whose_entries_join_into_a_large_one_is_refused_before_it_is_joined(clean_packs):
  # One table row, of a long path, referred to 50000 times by one entry: a 150 KiB file that joins into 50 MB (one
  # of 150 KiB held 198 MiB and peaked at 751 MiB). Refused from the rows' lengths, before anything is joined.
  import tracemalloc
  path = str(clean_packs / "balloon.jmfpack")
  _with_one_header(path, "/" + "p" * 999)
  assert len(pack_file.read(path).entries) == 1
  _rewritten(path, lambda m: m["entries"][0].__setitem__("headers", [0] * 50000))
  assert os.path.getsize(path) < 200_000
  tracemalloc.start()
  try:
    with pytest.raises(jmf.PackError, match=rf"^pack {path} is refused: its entries would hold over \d+ bytes once "
                                            r"their headers are put back \(128 times its \d+ bytes"):
      pack_file.read(path)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 16 << 20, f"{peak >> 20} MiB held to refuse a pack of {os.path.getsize(path) >> 10} KiB"


def test_running_out_of_memory_reading_a_pack_is_a_pack_error_naming_it(clean_packs, monkeypatch):
  path = str(clean_packs / "tight.jmfpack")
  _with_one_header(path, "/usr/include/a.h")
  from jax_mosaic_ffi.base import pack_headers

  def exhausted(*args):
    raise MemoryError()
  monkeypatch.setattr(pack_headers, "joined", exhausted)  # as a process under a memory limit finds it
  with pytest.raises(jmf.PackError, match=rf"^pack {path} cannot be read: this process ran out of memory"):
    pack_file.read(path)


def test_a_pack_others_can_write_or_not_a_regular_file_is_refused(clean_packs):
  path = str(clean_packs / "shared.jmfpack")
  pack_file.write(path, [_entry()], {})
  os.chmod(path, 0o664)
  with pytest.raises(jmf.PackError, match="writable by its group .mode 664.*chmod go-w.*tar --no-same-owner"):
    pack_file.read(path)
  os.chmod(path, 0o644)
  folder = clean_packs / "open"
  folder.mkdir()
  os.replace(path, folder / "shared.jmfpack")
  os.chmod(folder, 0o777)
  with pytest.raises(jmf.PackError, match="its folder .*open is writable by its group and all users .mode 777"):
    pack_file.read(str(folder / "shared.jmfpack"))
  # A pack that is not there is said to be missing, whatever its folder.
  with pytest.raises(jmf.PackError, match="other.jmfpack cannot be opened .No such file or directory"):
    pack_file.read(str(folder / "other.jmfpack"))
  os.chmod(folder, 0o755)
  os.mkfifo(clean_packs / "fifo.jmfpack")
  with pytest.raises(jmf.PackError, match="not a regular file"):
    pack_file.read(str(clean_packs / "fifo.jmfpack"))
  # The name is the user's choice: a link they made to a pack is followed, and what it leads to is checked.
  os.symlink(folder / "shared.jmfpack", clean_packs / "link.jmfpack")
  assert set(pack_file.read(str(clean_packs / "link.jmfpack")).entries) == {"ab" * 32}


def test_a_pack_serves_compiles_ahead_of_the_disk_cache(clean_packs, monkeypatch):
  path, built = _recorded(clean_packs, monkeypatch, lambda: jmf.cuda_kernel(kernel_sources.ADD, "add"))
  (entry,) = built.entries
  assert entry.about["kernel"] == "add" and entry.about["targets"] == ["sm_90"]
  assert entry.about["call_sites"][0].startswith("test_packs.py:")
  before = _stats()
  monkeypatch.setenv(packs.PACKS_ENV, path)
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  after = _stats()
  assert (after.pack_hits, after.compiles["nvrtc"], after.disk_hits) == (before.pack_hits + 1, before.compiles["nvrtc"],
                                                                      before.disk_hits)
  assert kernel.images and jmf.cuda_kernel(kernel_sources.ADD, "add") is not None  # then from memory
  assert _stats().memory_hits == after.memory_hits + 1


def test_a_bad_pack_in_the_setting_fails_every_compile_naming_it(clean_packs, monkeypatch):
  monkeypatch.setenv(packs.PACKS_ENV, str(clean_packs / "missing.jmfpack"))
  for _ in range(2):
    with pytest.raises(jmf.PackError, match="missing.jmfpack cannot be opened"):
      jmf.cuda_kernel(kernel_sources.ADD, "add")


def test_strict_mode_names_the_kernel_call_site_specialization_and_command(clean_packs, monkeypatch):
  path, _ = _recorded(clean_packs, monkeypatch, lambda: jmf.cuda_kernel(kernel_sources.ADD, "add"))
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  jmf.cuda_kernel(kernel_sources.ADD, "add")  # in the pack
  before = _stats().compiles["nvrtc"]
  with pytest.raises(jmf.NotInPacks) as missing:
    jmf.cuda_kernel(kernel_sources.ADD, "add", options=["-DVARIANT=2"], targets=["sm_100a"])
  text = str(missing.value)
  assert missing.value.kernel == "add" and "CUDA C++ (NVRTC) 'add' at test_packs.py:" in text
  assert "options: -DVARIANT=2" in text and "targets: sm_100a" in text and path in text
  assert "python -m jax_mosaic_ffi.pack record new.jmfpack --arch sm_100 -- python " in text
  assert f"python -m jax_mosaic_ffi.pack merge merged.jmfpack {path} new.jmfpack" in text
  # The nearest packed compile, and what differs from it.
  assert f"nearest in the packs: {path} holds 'add' under another key (recorded for sm_90)" in text
  assert "targets: sm_90 in the pack, sm_100a here" in text and "options: -DVARIANT=2" in text
  assert _stats().compiles["nvrtc"] == before
  monkeypatch.setenv(packs.STRICT_ENV, "maybe")
  with pytest.raises(ValueError, match="JAX_MOSAIC_FFI_PACKS_STRICT='maybe' is neither on nor off"):
    jmf.cuda_kernel(kernel_sources.ADD, "add", options=["-DVARIANT=3"])


def test_a_miss_names_another_compiler_release_as_what_differs(clean_packs, monkeypatch):
  path, built = _recorded(clean_packs, monkeypatch, lambda: jmf.cuda_kernel(kernel_sources.ADD, "add"))
  (entry,) = built.entries
  older = {**entry.about, "toolchain": "nvidia-cuda-nvrtc 13.0.48"}  # as another NVRTC release keyed it
  pack_file.write(path, [pack_file.Entry("cd" * 32, entry.kind, entry.payload, older)], built.created, built.notes)
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  with pytest.raises(jmf.NotInPacks) as missing:
    jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert (f"toolchain: nvidia-cuda-nvrtc 13.0.48 in the pack, {entry.about['toolchain']} here"
          in str(missing.value)), str(missing.value)
  assert "targets:" not in str(missing.value).split("what differs:")[1]
  # A keyed setting of the environment the pack was recorded in.
  pack_file.write(path, [pack_file.Entry("cd" * 32, entry.kind, entry.payload,
                                         {**entry.about, "settings": ["CUTE_DSL_LINEINFO=1"]})], built.created)
  packs.forget()
  with pytest.raises(jmf.NotInPacks, match="what differs: settings: CUTE_DSL_LINEINFO=1 in the pack, - here"):
    jmf.cuda_kernel(kernel_sources.ADD, "add")


def test_a_strict_setting_neither_on_nor_off_fails_the_first_kernel_even_one_the_pack_holds(clean_packs, monkeypatch):
  path, _ = _recorded(clean_packs, monkeypatch, lambda: jmf.cuda_kernel(kernel_sources.ADD, "add"))
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "2")
  with pytest.raises(ValueError, match="JAX_MOSAIC_FFI_PACKS_STRICT='2' is neither on nor off"):
    jmf.cuda_kernel(kernel_sources.ADD, "add")


def test_a_ptx_kernel_is_recorded_as_refused_and_is_an_error_in_the_strict_mode(clean_packs, monkeypatch):
  made = jmf.cuda_kernel(kernel_sources.ADD, "add", targets=["sm_90"])
  ptx = next(image.data for image in made.images if image.kind.name == "PTX")
  path, built = _recorded(clean_packs, monkeypatch, lambda: jmf.ptx_kernel(ptx, "add"))
  (note,) = built.notes["refused"]
  assert note["front_end"] == "PTX" and "the driver compiles PTX on each node at its first launch" in note["error"]
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  with pytest.raises(jmf.NotInPacks, match="PTX 'add' at test_packs.py:.*forbids JIT-compiling it here") as refused:
    jmf.ptx_kernel(ptx, "add")
  assert "Ship it compiled: jmf.cubin_kernel" in str(refused.value) and "pack record" not in str(refused.value)


def test_a_header_of_the_user_that_is_not_here_is_taken_from_the_pack_one_that_differs_is_not(clean_packs,
                                                                                               monkeypatch):
  include = clean_packs / "include"
  include.mkdir()
  (include / "twice.cuh").write_text("#define TWICE(x) (2 * (x))\n")
  source = '#include "twice.cuh"\nextern "C" __global__ void twice(float* y) { y[0] = TWICE(y[0]); }\n'
  make = lambda: jmf.cuda_kernel(source, "twice", options=[f"-I{include}"])  # noqa: E731
  path, _ = _recorded(clean_packs, monkeypatch, make)
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  (include / "twice.cuh").unlink()  # a deployment ships the pack, not the sources
  before = _stats().pack_hits
  make()
  assert _stats().pack_hits == before + 1
  jmf.clear_kernel_cache()
  (include / "twice.cuh").write_text("#define TWICE(x) (3 * (x))\n")
  with pytest.raises(jmf.NotInPacks, match="twice.cuh differs here from the one the kernel was compiled with"):
    make()


def test_the_targets_setting_stands_for_the_gpus_a_machine_would_have(monkeypatch):
  monkeypatch.setenv(kernel_lib.TARGETS_ENV, "sm_100,sm_90,90")
  assert [a.sm for a in kernel_lib.default_targets()] == ["sm_90", "sm_100"]
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert sorted(i.arch.sm for i in kernel.images if i.kind.name == "CUBIN") == ["sm_100", "sm_90"]
  monkeypatch.setenv(kernel_lib.TARGETS_ENV, "sm_100a")
  with pytest.raises(ValueError, match="without a suffix: write sm_100"):
    kernel_lib.default_targets()


def test_a_compile_that_fails_while_recording_is_listed_per_kernel(clean_packs, monkeypatch):
  def make():
    jmf.cuda_kernel(kernel_sources.ADD, "add")
    with pytest.raises(jmf.CompileError):
      jmf.cuda_kernel('extern "C" __global__ void broken(float* y) { y[0] = undefined; }', "broken")

  _, built = _recorded(clean_packs, monkeypatch, make)
  (refused,) = built.notes["refused"]
  assert refused["kernel"] == "broken" and refused["recorded_for"] == ["sm_90"]
  assert refused["error"].startswith("CompileError: NVRTC could not compile kernel 'broken'")


@pytest.fixture
def tuned_pack(clean_packs, monkeypatch):
  """A pack of an autotuned call recorded where nothing is timed (every config built, the decision noted), with
  the timings of a tuning file of an H200 (written here from the recorded keys: what jmf.save_tuning writes)."""
  tuned = jmf.autotune(add_factory, configs=[{"block": 128, "work": 6}, {"block": 256, "work": 0}],
                       name="test-packs-tuned")
  monkeypatch.setenv(pack_record.ENV, str(clean_packs / "recording"))
  with pytest.warns(autotuning.AutotuneSkipped):
    tuned.best_config(X, X)
  monkeypatch.delenv(pack_record.ENV)
  recording = recordings.read(str(clean_packs / "recording"))
  (decision,) = recording.tuning
  env = tuning_records.Environment("NVIDIA H200", "9.0", "cuda-driver 13000", "0.1.0", "triton 3.9.0")
  keys = [tuning_records.TimingKey(decision["name"], row["config"], tuple(row["launches"]), decision["signature"])
          for row in decision["configs"]]
  file = clean_packs / "h200.json"
  file.write_text(json.dumps({"format": tuning_files.FILE_FORMAT, "version": tuning_files.FILE_VERSION,
                              "environment": dataclasses.asdict(env),
                              "timings": [{**dataclasses.asdict(k), "launches": list(k.launches), "us": us,
                                           "error": None} for k, us in zip(keys, (7.0, 3.0))]}))
  os.chmod(file, 0o644)
  return tuned, recording, keys, env, file


def test_a_tuning_file_per_gpu_model_gives_the_pack_its_winners(tuned_pack, clean_packs):
  tuned, recording, keys, env, file = tuned_pack
  tuning = [(str(file), *tuning_files.read_file(file))]
  built = pack_build.build(recording, tuning)
  (winner,) = built.notes["winners"]
  assert (winner["device"], winner["compute_capability"], winner["config"]) == ("NVIDIA H200", "9.0",
                                                                                keys[1].config)
  assert sum(e.kind == "tuning" for e in built.entries) == 2 and built.notes["untuned"] == []
  path = str(clean_packs / "tuned.jmfpack")
  pack_file.write(path, built.entries, built.created, built.notes)
  jmf.load_pack(path)
  # On any driver of that GPU model: the pack's timings are found without timing.
  elsewhere = dataclasses.replace(env, driver="cuda-driver 13010", jax_mosaic_ffi="0.2.0")
  assert tuning_records.lookup(elsewhere, keys[1]) == (tuning_records.Timing(3.0, None), "pack")
  other_gpu = dataclasses.replace(env, device="NVIDIA B200", compute_capability="10.0")
  assert tuning_records.lookup(other_gpu, keys[1]) is None


def test_a_winner_serves_another_gpu_model_only_where_an_alias_asks_and_says_so(tuned_pack, clean_packs):
  _, recording, keys, env, file = tuned_pack
  tuning = [(str(file), *tuning_files.read_file(file))]
  pcie = dataclasses.replace(env, device="NVIDIA H100 PCIe")
  plain = pack_build.build(recording, tuning)
  aliases = pack_build.parse_aliases(["NVIDIA H100 PCIe=NVIDIA H200"])
  built = pack_build.build(recording, tuning, aliases)
  measured, aliased = built.notes["winners"]
  assert measured["device"] == "NVIDIA H200" and "aliased_from" not in measured
  assert (aliased["device"], aliased["config"], aliased["aliased_from"]) == ("NVIDIA H100 PCIe", keys[1].config,
                                                                             "NVIDIA H200 (9.0)")
  assert built.created["aliased_winners"] == ["NVIDIA H100 PCIe=NVIDIA H200"]
  for made, served in ((plain, None), (built, (tuning_records.Timing(3.0, None), "pack"))):
    path = str(clean_packs / f"aliased-{served is not None}.jmfpack")
    pack_file.write(path, made.entries, made.created, made.notes)
    packs.forget()
    jmf.load_pack(path)
    assert tuning_records.lookup(pcie, keys[1]) == served
  # An alias to another compute capability needs kernels that run there (a family target): sm_90 ones do not.
  other_cc = pack_build.build(recording, tuning, pack_build.parse_aliases(["NVIDIA B200@10.0=NVIDIA H200"]))
  assert [w["device"] for w in other_cc.notes["winners"]] == ["NVIDIA H200"]
  with pytest.raises(ValueError, match="no tuning file given was measured on NVIDIA B200"):
    pack_build.build(recording, tuning, pack_build.parse_aliases(["NVIDIA H100 PCIe=NVIDIA B200"]))
  with pytest.raises(ValueError, match="was measured on NVIDIA H200, so its own winners are used"):
    pack_build.build(recording, tuning, pack_build.parse_aliases(["NVIDIA H200=NVIDIA H100 PCIe"]))
  for bad in ("NVIDIA H100 PCIe", "=NVIDIA H200", "NVIDIA B300@x=NVIDIA B200", "NVIDIA H200=NVIDIA H200"):
    with pytest.raises(ValueError, match="TARGET=SOURCE|to itself"):
      pack_build.parse_aliases([bad])


def test_a_call_without_timings_for_a_gpu_model_is_listed_not_defaulted(tuned_pack, clean_packs):
  _, recording, keys, env, file = tuned_pack
  document = json.loads(file.read_text())
  document["timings"] = document["timings"][:1]
  file.write_text(json.dumps(document))
  built = pack_build.build(recording, [(str(file), *tuning_files.read_file(file))])
  (untuned,) = built.notes["untuned"]
  assert untuned["device"] == "NVIDIA H200" and "has no timing of config(s) 1" in untuned["why"]
  assert built.notes["winners"] == [] and not any(e.kind == "tuning" for e in built.entries)
  (alone,) = pack_build.build(recording, []).notes["untuned"]
  assert "no tuning file measured on a GPU of compute capability 9.0" in alone["why"]


def test_strict_mode_refuses_to_time_an_autotuned_call_the_packs_have_no_winner_for(tuned_pack, clean_packs,
                                                                                    monkeypatch):
  tuned, recording, _, _, _ = tuned_pack
  built = pack_build.build(recording)
  path = str(clean_packs / "untuned.jmfpack")
  pack_file.write(path, built.entries, built.created, built.notes)
  jmf.clear_kernel_cache(disk=True)
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  monkeypatch.setenv(autotuning.CPU_ENV, "1")  # timing on the CPU: the configs' fallbacks would be timed
  before = _stats()
  again = jmf.autotune(add_factory, configs=tuned.configs, name="test-packs-tuned")
  with pytest.raises(jmf.NotInPacks, match="(?s)autotuned call 'test-packs-tuned' at test_packs.py:.*configs not "
                                           "timed on cpu"):
    again.best_config(X, X)
  after = _stats()
  # Both configs built from the pack (one kernel: the configs' threads may find it in memory once it is read).
  assert after.compiles["nvrtc"] == before.compiles["nvrtc"] and after.pack_hits > before.pack_hits
  assert after.autotune_tunings == before.autotune_tunings


def test_load_pack_puts_a_pack_first(clean_packs, monkeypatch):
  first, second = str(clean_packs / "first.jmfpack"), str(clean_packs / "second.jmfpack")
  pack_file.write(first, [_entry(payload=b"one")], {})
  pack_file.write(second, [_entry(payload=b"two")], {})
  monkeypatch.setenv(packs.PACKS_ENV, second)
  assert packs.lookup("ab" * 32, "compile").payload == b"two"
  assert jmf.load_pack(first) == 1
  assert packs.paths() == [first, second] and packs.lookup("ab" * 32, "compile").payload == b"one"
  assert packs.lookup("ab" * 32, "tuning") is None


def test_a_recording_folder_that_is_not_yours_alone_is_refused(clean_packs, monkeypatch):
  # Entries another user put there would be built into the pack as this program's own.
  shared = clean_packs / "shared"
  shared.mkdir()
  shared.chmod(0o777)
  monkeypatch.setenv(pack_record.ENV, str(shared))
  with pytest.raises(jmf.PackError, match=rf"^JAX_MOSAIC_FFI_PACK_RECORD={shared} is not a folder of yours that no "
                                          r"one else can write \(uid \d+, mode 777"):
    jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert not list(shared.iterdir())
  if os.geteuid() == 0:  # root can give it to another user: refused too
    shared.chmod(0o755)
    os.chown(shared, 12345, 12345)
    with pytest.raises(jmf.PackError, match=r"\(uid 12345, mode 755; you are uid 0\)"):
      jmf.cuda_kernel(kernel_sources.ADD.replace("add", "add_again"), "add_again")
  own = clean_packs / "own"
  monkeypatch.setenv(pack_record.ENV, str(own))
  jmf.cuda_kernel(kernel_sources.ADD.replace("add", "add_mine"), "add_mine")
  assert stat.S_IMODE(os.stat(own).st_mode) == 0o700 and list(own.iterdir())


def test_the_build_command_makes_a_pack_from_a_recorded_folder(clean_packs, monkeypatch, capsys):
  from jax_mosaic_ffi.pack import __main__ as command
  monkeypatch.setenv(pack_record.ENV, str(clean_packs / "recording"))
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  monkeypatch.delenv(pack_record.ENV)
  out = str(clean_packs / "built.jmfpack")
  assert command.main(["build", out, str(clean_packs / "recording")]) == 0
  assert "1 compiles, 0 Triton specializations, 0 autotuning timings" in capsys.readouterr().out
  assert [e.about["kernel"] for e in pack_file.read(out).entries.values()] == ["add"]
  os.chmod(clean_packs / "recording", 0o777)
  assert command.main(["build", out, str(clean_packs / "recording")]) == 2
  assert "is not a folder of yours that no one else can write" in capsys.readouterr().err
