"""The on-disk NVRTC cache: its key, the files a compile read, concurrency, corruption, bounds, trust."""

import hashlib
import os
import stat
import struct
import time
import warnings

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.cuda.nvrtc import compiler
from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.cuda.nvrtc import compat as nvrtc_compat
from jax_mosaic_ffi.base.module_format import Arch, ImageKind

import fresh_process
import kernel_sources


def entries(directory):
  return sorted(directory.glob("*/*.bin"))


def test_the_key_covers_everything_that_changes_the_binary():
  base = dict(source="src", name="k", options=("-DX=1",), headers={"h.h": "1"}, targets=(Arch(90),),
              compiler="nvrtc13.0")
  key = compiler.cache_key(**base)
  for change in [dict(source="src2"), dict(name="k2"), dict(options=("-DX=2",)), dict(options=()),
                 dict(headers={"h.h": "2"}), dict(headers={"g.h": "1"}), dict(targets=(Arch(80),)),
                 dict(targets=(Arch(90, "a"),)), dict(targets=(Arch(90), Arch(100))), dict(compiler="nvrtc13.1")]:
    assert compiler.cache_key(**{**base, **change}) != key, change
  assert compiler.cache_key(**base) == key
  # Parts are length-prefixed: moving text between them changes the key.
  assert compiler.cache_key(**{**base, "options": ("-DX", "=1")}) != key


def test_a_new_process_compiles_nothing(isolated_disk_cache, tmp_path):
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  script = """
      import json
      import jax_mosaic_ffi as jmf, kernel_sources
      k = jmf.cuda_kernel(kernel_sources.ADD, "add")
      s = jmf.kernel_cache_stats()
      print(json.dumps([s.compiles["nvrtc"], s.disk_hits, k.hash.hex()]))
  """
  compiles, hits, digest = fresh_process.run(script, cwd=tmp_path, env={
      "JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}).result
  assert (compiles, hits) == (0, 1)
  assert digest == jmf.cuda_kernel(kernel_sources.ADD, "add").hash.hex()


HEADER_USER = r'''
#include "value.cuh"
extern "C" __global__ void store_value(int* out) { out[0] = VALUE; }
'''
# Two constants no PTX holds by chance; a header edit from one to the other keeps its size.
V1, V2 = "6220097", "6220098"


def ptx_of(kernel) -> str:
  return next(image.data.decode() for image in kernel.parsed.images if image.kind == ImageKind.PTX)


def test_an_edited_header_from_an_include_folder_is_compiled_again_in_a_fresh_process(isolated_disk_cache, tmp_path):
  include = tmp_path / "include"
  include.mkdir()
  script = """
      import json, sys
      import jax_mosaic_ffi as jmf, test_disk_cache as t
      k = jmf.cuda_kernel(t.HEADER_USER, "store_value", options=["-I" + sys.argv[1]])
      s = jmf.kernel_cache_stats()
      print(json.dumps({"compiles": s.compiles["nvrtc"], "disk": s.disk_hits, "ptx": t.ptx_of(k)}))
  """
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}
  runs = []
  for value in (V1, V1, V2):
    (include / "value.cuh").write_text(f"#define VALUE {value}\n")
    runs.append(fresh_process.run(script, include, cwd=tmp_path, env=env).result)
  assert [(r["compiles"], r["disk"]) for r in runs] == [(1, 0), (0, 1), (1, 0)]
  assert V1 in runs[1]["ptx"]
  assert V2 in runs[2]["ptx"] and V1 not in runs[2]["ptx"]


def test_an_edited_header_is_compiled_again_in_the_same_process(isolated_disk_cache, tmp_path, monkeypatch):
  # A relative -I folder: relative to the working directory, for NVRTC and for the cache alike.
  (tmp_path / "inc").mkdir()
  header = tmp_path / "inc" / "value.cuh"
  header.write_text(f"#define VALUE {V1}\n")
  time.sleep(0.1)  # a file changed while it compiled is not cached: this one changed before
  monkeypatch.chdir(tmp_path)
  first = jmf.cuda_kernel(HEADER_USER, "store_value", options=["-Iinc"])
  assert V1 in ptx_of(first)
  before = jmf.kernel_cache_stats()
  assert jmf.cuda_kernel(HEADER_USER, "store_value", options=["-Iinc"]).compiled is first.compiled
  header.write_text(f"#define VALUE {V2}\n")
  second = jmf.cuda_kernel(HEADER_USER, "store_value", options=["-Iinc"])
  after = jmf.kernel_cache_stats()
  assert V2 in ptx_of(second)
  assert after.compiles["nvrtc"] == before.compiles["nvrtc"] + 1 and after.memory_hits == before.memory_hits + 1
  # Another folder with a header of the same name: what -Iinc means moves with the working directory.
  (tmp_path / "elsewhere" / "inc").mkdir(parents=True)
  (tmp_path / "elsewhere" / "inc" / "value.cuh").write_text(f"#define VALUE {V1}\n")
  monkeypatch.chdir(tmp_path / "elsewhere")
  assert V1 in ptx_of(jmf.cuda_kernel(HEADER_USER, "store_value", options=["-Iinc"]))


SHADOWED = r'''
#include "params.h"
extern "C" __global__ void store_value(int* out) { out[0] = VALUE; }
'''
NESTED = r'''
#include <outer.h>
extern "C" __global__ void store_value(int* out) { out[0] = VALUE; }
'''
V3 = "6220099"


@pytest.mark.parametrize("where", ["an earlier -I folder", "the working directory", "the including header's folder"])
def test_a_header_that_later_shadows_the_one_compiled_is_compiled_again_in_a_fresh_process(
    isolated_disk_cache, tmp_path, where):
  # NVRTC searches a quoted #include in the includer's folder (the working directory for the source itself), then
  # in each -I folder in order: a header made later at any of those places is the one a compile would read.
  for folder in ("a", "b"):
    (tmp_path / folder).mkdir()
  if where == "the including header's folder":  # b/outer.h includes "value.h", found in a; then b/value.h appears
    (tmp_path / "b" / "outer.h").write_text('#include "value.h"\n#define VALUE VALUE_OF_HEADER\n')
    (tmp_path / "a" / "value.h").write_text(f"#define VALUE_OF_HEADER {V1}\n")
    source, shadow = "NESTED", tmp_path / "b" / "value.h"
  else:
    (tmp_path / "b" / "params.h").write_text(f"#define VALUE {V1}\n")
    source = "SHADOWED"
    shadow = tmp_path / ("a" if where == "an earlier -I folder" else ".") / "params.h"
  script = f"""
      import json
      import jax_mosaic_ffi as jmf, test_disk_cache as t
      k = jmf.cuda_kernel(t.{source}, "store_value", options=("-I a", "-I b"))
      s = jmf.kernel_cache_stats()
      print(json.dumps({{"compiles": s.compiles["nvrtc"], "disk": s.disk_hits, "ptx": t.ptx_of(k)}}))
  """
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}
  runs = [fresh_process.run(script, cwd=tmp_path, env=env).result for _ in range(2)]
  shadow.write_text(f"#define VALUE{'_OF_HEADER' if source == 'NESTED' else ''} {V2}\n")
  runs.append(fresh_process.run(script, cwd=tmp_path, env=env).result)
  assert [(r["compiles"], r["disk"]) for r in runs] == [(1, 0), (0, 1), (1, 0)], where
  assert V1 in runs[1]["ptx"]
  assert V2 in runs[2]["ptx"] and V1 not in runs[2]["ptx"], where


def test_a_header_that_shadows_the_one_compiled_is_compiled_again_in_the_same_process(
    isolated_disk_cache, tmp_path, monkeypatch):
  for folder in ("a", "b"):
    (tmp_path / folder).mkdir()
  (tmp_path / "b" / "params.h").write_text(f"#define VALUE {V1}\n")
  time.sleep(0.1)  # a file changed while it compiled is not cached: this one changed before
  monkeypatch.chdir(tmp_path)
  assert V1 in ptx_of(jmf.cuda_kernel(SHADOWED, "store_value", options=["-Ia", "-Ib"]))
  before = jmf.kernel_cache_stats()
  assert V1 in ptx_of(jmf.cuda_kernel(SHADOWED, "store_value", options=["-Ia", "-Ib"]))
  assert jmf.kernel_cache_stats().memory_hits == before.memory_hits + 1
  (tmp_path / "a" / "params.h").write_text(f"#define VALUE {V2}\n")
  assert V2 in ptx_of(jmf.cuda_kernel(SHADOWED, "store_value", options=["-Ia", "-Ib"]))
  (tmp_path / "params.h").write_text(f"#define VALUE {V3}\n")  # the working directory comes first for quotes
  assert V3 in ptx_of(jmf.cuda_kernel(SHADOWED, "store_value", options=["-Ia", "-Ib"]))
  assert jmf.kernel_cache_stats().compiles["nvrtc"] == before.compiles["nvrtc"] + 2


PROBING = r'''
#if __has_include("probe_params.h")
#include "probe_params.h"
#else
#define VALUE 6220097
#endif
extern "C" __global__ void store_value(int* out) { out[0] = VALUE; }
'''
# A probe through a macro, as CCCL's _CCCL_HAS_INCLUDE wraps __has_include, with brackets.
WRAPPED_PROBE = r'''
#include "has_include.h"
#if MY_HAS_INCLUDE(<probe_params.h>)
#include <probe_params.h>
#else
#define VALUE 6220097
#endif
extern "C" __global__ void store_value(int* out) { out[0] = VALUE; }
'''


def test_a_header_that_a_has_include_probe_finds_later_is_compiled_in(isolated_disk_cache, tmp_path, monkeypatch):
  # __has_include reads nothing, so NVRTC's trace does not show what it searched; the answer still changes the
  # code. Each change below flips or moves what the probe finds, and each is compiled again.
  for folder in ("a", "b"):
    (tmp_path / folder).mkdir()
  monkeypatch.chdir(tmp_path)
  options = ["-Ia", "-Ib"]
  assert V1 in ptx_of(jmf.cuda_kernel(PROBING, "store_value", options=options))
  before = jmf.kernel_cache_stats()
  assert V1 in ptx_of(jmf.cuda_kernel(PROBING, "store_value", options=options))
  assert jmf.kernel_cache_stats().memory_hits == before.memory_hits + 1
  steps = [("b", V2), ("a", V3), (".", "6220100")]  # the later -I folder, the earlier, then the working directory
  for folder, value in steps:
    (tmp_path / folder / "probe_params.h").write_text(f"#define VALUE {value}\n")
    assert value in ptx_of(jmf.cuda_kernel(PROBING, "store_value", options=options)), folder
  assert jmf.kernel_cache_stats().compiles["nvrtc"] == before.compiles["nvrtc"] + len(steps)
  for folder in (".", "a", "b"):  # every one gone: the probe is false again, as for the first compile
    (tmp_path / folder / "probe_params.h").unlink()
  hits = jmf.kernel_cache_stats().memory_hits
  assert V1 in ptx_of(jmf.cuda_kernel(PROBING, "store_value", options=options))
  after = jmf.kernel_cache_stats()
  # Each step's compile took the key's one entry (whatever the time between the write and the compile), so the
  # probe false again is compiled once more.
  assert (after.compiles["nvrtc"], after.memory_hits) == (before.compiles["nvrtc"] + len(steps) + 1, hits)


def test_a_probe_through_a_macro_is_followed_in_a_fresh_process(isolated_disk_cache, tmp_path):
  for folder in ("a", "b", "inc"):
    (tmp_path / folder).mkdir()
  (tmp_path / "inc" / "has_include.h").write_text("#define MY_HAS_INCLUDE(X) __has_include(X)\n")
  script = """
      import json
      import jax_mosaic_ffi as jmf, test_disk_cache as t
      k = jmf.cuda_kernel(t.WRAPPED_PROBE, "store_value", options=("-I inc", "-I a", "-I b"))
      s = jmf.kernel_cache_stats()
      print(json.dumps({"compiles": s.compiles["nvrtc"], "disk": s.disk_hits, "ptx": t.ptx_of(k)}))
  """
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}
  time.sleep(0.1)  # a file changed while it compiled is not cached: this one changed before
  runs = [fresh_process.run(script, cwd=tmp_path, env=env).result for _ in range(2)]
  (tmp_path / "b" / "probe_params.h").write_text(f"#define VALUE {V2}\n")  # the probe finds it now
  runs.append(fresh_process.run(script, cwd=tmp_path, env=env).result)
  (tmp_path / "b" / "probe_params.h").unlink()
  runs.append(fresh_process.run(script, cwd=tmp_path, env=env).result)
  assert [(r["compiles"], r["disk"]) for r in runs] == [(1, 0), (0, 1), (1, 0), (1, 0)]
  assert [next(v for v in (V1, V2) if v in r["ptx"]) for r in runs] == [V1, V1, V2, V1]


def test_probes_are_listed_up_to_the_file_they_find(tmp_path, monkeypatch):
  from jax_mosaic_ffi.cuda.nvrtc import include_search
  for folder in ("a", "b", "c"):
    (tmp_path / folder).mkdir()
  (tmp_path / "b" / "found.h").write_text("")
  (tmp_path / "a" / "folder.h").mkdir()  # a folder of a header's name is not a header: the search passes it
  (tmp_path / "c" / "wrap.h").write_text('#define HAS(x) __has_include(x)\n#if HAS("near.h")\n#endif\n')
  monkeypatch.chdir(tmp_path)
  source = ('#if __has_include(<found.h>) && __has_include("missing.h") && __has_include(<folder.h>)\n'
            '#endif\n#if __has_include("mem.h") || __has_include(MACRO_NAME)\n#endif\n')
  paths = include_search.probed([("c/wrap.h", None)], ["a", "b"], source, in_memory={"mem.h": ""})
  assert paths == ["a/found.h", "a/missing.h", "a/near.h", "b/folder.h", "b/found.h", "b/missing.h", "b/near.h",
                   "c/near.h", "missing.h"]


def test_the_packaged_and_cuda_headers_read_are_recorded(isolated_disk_cache):
  # Named by the compile's own include trace, the prelude's headers among them, CCCL's too for a kernel that
  # includes it (the prelude itself includes none of CCCL).
  kernel = jmf.cuda_kernel("#include <cuda/std/limits>\n" + kernel_sources.AXPB, "ops::axpb<float>")
  read = {path for path, digest in kernel.compiled.deps if digest is not None}
  assert {str(nvrtc_compat.PRELUDE), str(nvrtc_compat.INCLUDE_DIR / "sys" / "types.h")} <= read
  assert any(path.endswith("/cuda_fp16.h") for path in read) and any("/cuda/std/" in path for path in read)
  assert not any("/cuda/std/" in path for path, _ in jmf.cuda_kernel(kernel_sources.AXPB, "ops::axpb<float>")
                 .compiled.deps)
  assert all(digest == hashlib.sha256(open(path, "rb").read()).hexdigest() for path, digest in kernel.compiled.deps
             if digest is not None)


def test_several_processes_compiling_the_same_kernel_at_once(isolated_disk_cache, tmp_path):
  script = """
      import json
      import jax_mosaic_ffi as jmf, kernel_sources
      print(json.dumps(jmf.cuda_kernel(kernel_sources.SUM, "block_sum").hash.hex()))
  """
  children = [fresh_process.start(script, cwd=tmp_path, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)})
              for _ in range(6)]
  results = [fresh_process.finish(child).result for child in children]
  assert len(set(results)) == 1
  assert len(entries(isolated_disk_cache)) == 1
  assert not list(isolated_disk_cache.glob("*/.tmp-*"))
  jmf.clear_kernel_cache()
  before = jmf.kernel_cache_stats()
  jmf.cuda_kernel(kernel_sources.SUM, "block_sum")
  assert jmf.kernel_cache_stats().disk_hits == before.disk_hits + 1


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip_payload", "empty"])
def test_a_damaged_entry_is_rebuilt(isolated_disk_cache, damage):
  good = jmf.cuda_kernel(kernel_sources.ADD, "add")
  (path,) = entries(isolated_disk_cache)
  data = path.read_bytes()
  damaged = {"truncate": data[: len(data) // 2], "garbage": os.urandom(len(data)),
             "flip_payload": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:], "empty": b""}[damage]
  path.write_bytes(damaged)
  jmf.clear_kernel_cache()
  before = jmf.kernel_cache_stats()
  rebuilt = jmf.cuda_kernel(kernel_sources.ADD, "add")
  after = jmf.kernel_cache_stats()
  assert after.compiles["nvrtc"] == before.compiles["nvrtc"] + 1
  assert rebuilt.module == good.module
  assert path.read_bytes() == data  # rewritten whole


def test_an_entry_that_does_not_decode_is_dropped_and_rebuilt(isolated_disk_cache):
  good = jmf.cuda_kernel(kernel_sources.ADD, "add")
  (path,) = entries(isolated_disk_cache)
  data = path.read_bytes()
  payload = data[disk_cache._ENTRY_HEADER.size:]
  (length,) = struct.unpack_from("<I", payload)
  # Valid checksum, but JSON nested deeper than Python's parser recurses: RecursionError, not ValueError.
  deep = b"[" * 32000 + b"]" * 32000
  path.write_bytes(entry_bytes(struct.pack("<I", len(deep)) + deep + payload[4 + length:]))
  jmf.clear_kernel_cache()
  before = jmf.kernel_cache_stats()
  rebuilt = jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert rebuilt.module == good.module
  assert jmf.kernel_cache_stats().compiles["nvrtc"] == before.compiles["nvrtc"] + 1
  assert path.read_bytes() == data
  # A decoder that fails drops the entry, whatever it raises.
  entry_key = disk_cache.key("undecodable")
  disk_cache.store(entry_key, b"payload")
  assert disk_cache.load_decoded(entry_key, lambda data: [][1]) is None
  assert disk_cache.load(entry_key) is None


def test_the_cache_stays_within_its_bound(isolated_disk_cache, monkeypatch):
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  one_entry = entries(isolated_disk_cache)[0].stat().st_size
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_MAX_BYTES", str(int(one_entry * 2.5)))
  for i in range(5):
    jmf.cuda_kernel(kernel_sources.ADD.replace("a[i] + b[i]", f"a[i] + b[i] * {i + 2}.0f"), "add")
  total = sum(p.stat().st_size for p in entries(isolated_disk_cache))
  assert total <= one_entry * 2.5
  assert len(entries(isolated_disk_cache)) == 2


def test_foreign_files_do_not_count_toward_the_bound(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_MAX_BYTES", "100000")
  ours = [disk_cache.key("ours", str(i)) for i in range(4)]
  for entry_key in ours[:3]:
    disk_cache.store(entry_key, os.urandom(1000))
  # Named like an entry, newer than ours, larger than the bound: not ours, so not the cache's size.
  foreign = isolated_disk_cache / "ab" / f"{'ab' * 32}.bin"
  foreign.parent.mkdir()
  foreign.write_bytes(b"a large file of someone else's" * 10000)
  os.utime(foreign, (time.time() + 3600,) * 2)
  disk_cache.store(ours[3], os.urandom(1000))
  assert all(disk_cache.load(entry_key) is not None for entry_key in ours)
  assert foreign.read_bytes().startswith(b"a large file")


def test_the_cache_can_be_moved_or_turned_off(tmp_path, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", "off")
  assert disk_cache.cache_dir() is None
  jmf.clear_kernel_cache()
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path / "elsewhere"))
  assert disk_cache.cache_dir() == tmp_path / "elsewhere"
  monkeypatch.delenv("JAX_MOSAIC_FFI_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert disk_cache.cache_dir() == tmp_path / "xdg" / "jax_mosaic_ffi"


def test_a_tilde_means_the_home_folder(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", "~")
  assert disk_cache.cache_dir() == tmp_path / "home"
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", "~/kernels")
  assert disk_cache.cache_dir() == tmp_path / "home" / "kernels"
  entry_key = disk_cache.key("tilde")
  disk_cache.store(entry_key, b"payload")
  assert disk_cache.load(entry_key) == b"payload"
  assert (tmp_path / "home" / "kernels" / entry_key[:2] / f"{entry_key}.bin").is_file()
  assert not (tmp_path / "~").exists()


@pytest.mark.parametrize("value", ["1GiB", "-1", "1.5", "lots"])
def test_a_bad_size_bound_is_reported_before_compiling(isolated_disk_cache, monkeypatch, value):
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_MAX_BYTES", value)
  with pytest.raises(ValueError, match=r"JAX_MOSAIC_FFI_CACHE_MAX_BYTES=.* whole number of bytes, e\.g\."):
    disk_cache.check_settings()
  before = jmf.kernel_cache_stats().compiles["nvrtc"]
  with pytest.raises(ValueError, match="JAX_MOSAIC_FFI_CACHE_MAX_BYTES"):
    jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert jmf.kernel_cache_stats().compiles["nvrtc"] == before


@pytest.mark.parametrize("value, expected", [("", 1 << 30), ("0", 0), (" 2048 ", 2048)], ids=["unset", "0", "2048"])
def test_good_size_bounds(monkeypatch, value, expected):
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_MAX_BYTES", value)
  disk_cache.check_settings()
  assert disk_cache.max_bytes() == expected


# Keys whose first two digits name distinct folders, so each planted file has its own.
KEYS = {name: digits * 32 for name, digits in
        [("no_magic", "a1"), ("hex_less_folder", "b2"), ("wrong_folder", "c3"), ("linked_folder", "d4"),
         ("linked_entry", "e5"), ("fifo", "f6"), ("dev_zero", "07")]}


def entry_bytes(payload: bytes) -> bytes:
  """A well-formed entry, as store writes it."""
  return disk_cache._ENTRY_HEADER.pack(disk_cache._ENTRY_MAGIC, len(payload),
                                       hashlib.sha256(payload).digest()) + payload


def plant_foreign_files(cache, outside):
  """Files in and around the cache that are not its entries; returns {path: bytes} for each."""
  valid = entry_bytes(b"looks like ours")
  keys = KEYS
  files = {
      cache / "weights" / "model.bin": b"a project's model weights",
      cache / keys["no_magic"][:2] / f"{keys['no_magic']}.bin": b"our name, not our magic" * 4,
      cache / "zz" / f"{keys['hex_less_folder']}.bin": valid,
      cache / keys["no_magic"][:2] / f"{keys['wrong_folder']}.bin": valid,
      # Other processes' writes in flight: this version's temp name, and an older version's.
      cache / keys["no_magic"][:2] / ".tmp-4242-0123456789abcdef.partial": valid[:20],
      cache / keys["no_magic"][:2] / ".tmp-k3j4l5m6.bin": valid[:20],
      outside / "folder" / f"{keys['linked_folder']}.bin": valid,
      outside / "entry.bin": valid,
  }
  for path, data in files.items():
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
  (cache / keys["linked_folder"][:2]).symlink_to(outside / "folder", target_is_directory=True)
  for name in "linked_entry", "fifo", "dev_zero":
    (cache / keys[name][:2]).mkdir()
  (cache / keys["linked_entry"][:2] / f"{keys['linked_entry']}.bin").symlink_to(outside / "entry.bin")
  os.mkfifo(cache / keys["fifo"][:2] / f"{keys['fifo']}.bin")
  (cache / keys["dev_zero"][:2] / f"{keys['dev_zero']}.bin").symlink_to("/dev/zero")
  return files


def check_foreign_files(cache, files):
  for path, data in files.items():
    assert path.read_bytes() == data, path
  assert (cache / KEYS["linked_folder"][:2]).is_symlink()
  assert (cache / KEYS["linked_entry"][:2] / f"{KEYS['linked_entry']}.bin").is_symlink()
  assert stat.S_ISFIFO(os.lstat(cache / KEYS["fifo"][:2] / f"{KEYS['fifo']}.bin").st_mode)
  assert os.readlink(cache / KEYS["dev_zero"][:2] / f"{KEYS['dev_zero']}.bin") == "/dev/zero"


@pytest.mark.parametrize("how", ["evict", "clear"])
def test_only_our_own_entries_are_ever_deleted(isolated_disk_cache, tmp_path, monkeypatch, how):
  cache = isolated_disk_cache
  ours = [disk_cache.key("ours", str(i)) for i in range(4)]
  for entry_key in ours:
    disk_cache.store(entry_key, os.urandom(1000))
  files = plant_foreign_files(cache, tmp_path / "outside")
  # Our own temp file, left by a writer that died two days ago.
  stale = cache / ours[0][:2] / ".tmp-4243-fedcba9876543210.partial"
  stale.write_bytes(b"half an entry")
  os.utime(stale, (time.time() - 2 * 86400,) * 2)
  if how == "evict":
    monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_MAX_BYTES", "1")
    jmf.cuda_kernel(kernel_sources.ADD, "add")
  else:
    jmf.clear_kernel_cache(disk=True)
  for entry_key in ours:
    assert not (cache / entry_key[:2] / f"{entry_key}.bin").exists()
  assert not stale.exists()
  check_foreign_files(cache, files)


def test_foreign_files_are_misses_and_are_left_alone(isolated_disk_cache, tmp_path):
  cache = isolated_disk_cache
  files = plant_foreign_files(cache, tmp_path / "outside")
  for name in "no_magic", "hex_less_folder", "wrong_folder", "linked_folder", "linked_entry":
    assert disk_cache.load(KEYS[name]) is None, name
  check_foreign_files(cache, files)


def test_a_damaged_entry_of_ours_is_deleted_on_load(isolated_disk_cache):
  entry_key = disk_cache.key("damaged")
  disk_cache.store(entry_key, b"payload" * 100)
  path = isolated_disk_cache / entry_key[:2] / f"{entry_key}.bin"
  path.write_bytes(path.read_bytes()[:-1])
  assert disk_cache.load(entry_key) is None
  assert not path.exists()


def test_stores_do_not_write_through_symlinks(isolated_disk_cache, tmp_path):
  cache = isolated_disk_cache
  outside = tmp_path / "outside"
  outside.mkdir()
  (outside / "precious").write_bytes(b"precious")
  # A symlink in place of a two-hex folder: the store is skipped.
  folder_key = KEYS["linked_folder"]
  cache.mkdir()
  (cache / folder_key[:2]).symlink_to(outside, target_is_directory=True)
  disk_cache.store(folder_key, b"payload")
  assert sorted(p.name for p in outside.iterdir()) == ["precious"]
  assert disk_cache.load(folder_key) is None
  # A symlink at an entry's name: the entry replaces the link, not its target.
  entry_key = KEYS["linked_entry"]
  (cache / entry_key[:2]).mkdir()
  entry = cache / entry_key[:2] / f"{entry_key}.bin"
  entry.symlink_to(outside / "precious")
  disk_cache.store(entry_key, b"payload")
  assert (outside / "precious").read_bytes() == b"precious"
  assert not entry.is_symlink() and disk_cache.load(entry_key) == b"payload"


def test_special_files_at_an_entry_path_are_prompt_misses(isolated_disk_cache):
  files = plant_foreign_files(isolated_disk_cache, isolated_disk_cache.parent / "outside")
  # disk_cache alone, without jax, so the child starts at once and its memory
  # can be capped: an unbounded read of /dev/zero fails fast instead of
  # taking the machine's memory, and a FIFO that blocks runs into the timeout.
  script = """
      import importlib.util, json, resource, sys
      spec = importlib.util.spec_from_file_location("disk_cache", sys.argv[1])
      disk_cache = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(disk_cache)
      resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
      print(json.dumps([disk_cache.load(k) is None for k in sys.argv[2:]]))
  """
  result = fresh_process.run(script, disk_cache.__file__, KEYS["fifo"], KEYS["dev_zero"],
                             env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}).result
  assert result == [True, True]
  check_foreign_files(isolated_disk_cache, files)


def test_a_configured_folder_that_is_a_symlink_is_followed(tmp_path, monkeypatch):
  # The user's own choice of folder, unlike a link found below it.
  (tmp_path / "real").mkdir()
  (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path / "link"))
  entry_key = disk_cache.key("through the root link")
  disk_cache.store(entry_key, b"payload")
  assert (tmp_path / "real" / entry_key[:2] / f"{entry_key}.bin").is_file()
  assert disk_cache.load(entry_key) == b"payload"
  disk_cache.clear()
  assert disk_cache.load(entry_key) is None and (tmp_path / "link").is_symlink()


def test_a_bound_of_zero_keeps_nothing(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_MAX_BYTES", "0")
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert entries(isolated_disk_cache) == []
  # Nothing kept, so a process with an empty memory compiles again.
  jmf.clear_kernel_cache()
  before = jmf.kernel_cache_stats().compiles["nvrtc"]
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert jmf.kernel_cache_stats().compiles["nvrtc"] == before + 1
  assert entries(isolated_disk_cache) == []


@pytest.mark.parametrize("how", ["world_writable_folder", "group_writable_subfolder", "foreign_folder",
                                 "foreign_subfolder"])
def test_a_cache_folder_another_user_can_write_is_not_used(tmp_path, monkeypatch, how):
  cache = tmp_path / f"cache-{how}"
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(cache))
  jmf.clear_kernel_cache()
  jmf.cuda_kernel(kernel_sources.SUM, "block_sum")
  (other,) = entries(cache)
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  (victim,) = [p for p in entries(cache) if p != other]
  victim.write_bytes(other.read_bytes())  # another user's kernel, in a well-formed entry, under add's key
  # Tests run as root: a folder given to another uid, or opened to everyone, as a careless setup would.
  target = {"world_writable_folder": cache, "foreign_folder": cache}.get(how, victim.parent)
  if how.startswith("foreign"):
    os.chown(target, 4242, 4242)
  else:
    os.chmod(target, 0o777 if how.startswith("world") else 0o770)
  jmf.clear_kernel_cache()
  before = jmf.kernel_cache_stats()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
    again = jmf.cuda_kernel(kernel_sources.ADD.replace("a[i] + b[i]", "a[i] - b[i]"), "add")
  assert kernel.symbol == "add" and again.symbol == "add"
  after = jmf.kernel_cache_stats()
  assert after.disk_hits == before.disk_hits and after.compiles["nvrtc"] == before.compiles["nvrtc"] + 2
  refusals = [w for w in caught if issubclass(w.category, disk_cache.CacheFolderRefused)]
  assert len(refusals) == 1, [str(w.message) for w in caught]  # once per process, not per compile
  message = str(refusals[0].message)
  assert str(cache) in message and "chmod 700" in message and "JAX_MOSAIC_FFI_CACHE_DIR" in message
  assert victim.read_bytes() == other.read_bytes()  # nothing written into a folder we do not trust


def test_cache_folders_are_created_private(tmp_path, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path / "new" / "cache"))
  old = os.umask(0)
  try:
    disk_cache.store(disk_cache.key("private"), b"payload")
  finally:
    os.umask(old)
  (entry,) = entries(tmp_path / "new" / "cache")
  assert stat.S_IMODE(os.stat(tmp_path / "new" / "cache").st_mode) == 0o700
  assert stat.S_IMODE(os.stat(entry.parent).st_mode) == 0o700
  assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600


def test_a_failed_compile_hides_no_header_from_the_next_ones_record(isolated_disk_cache):
  # NVRTC's time trace, which named the headers a compile read before its include trace did, left some out in a
  # process where a compile had failed (the compile worker is replaced after a failure); the include trace does
  # not, and what a cache entry depends on must stay complete after a failure either way.
  with pytest.raises(jmf.CompileError):
    jmf.cuda_kernel('#include <cub/device/device_reduce.cuh>\nextern "C" __global__ void k(float* x) {}', "k")
  kernel = jmf.cuda_kernel(kernel_sources.AXPB, "ops::axpb<float>")
  assert str(nvrtc_compat.PRELUDE) in {path for path, digest in kernel.compiled.deps if digest is not None}
