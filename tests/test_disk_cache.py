"""The on-disk NVRTC cache: its key, concurrency, corruption and bounds."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import compiler, disk_cache
from jax_mosaic_ffi.module_format import Arch

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
  script = textwrap.dedent("""
      import json, sys
      sys.path.insert(0, sys.argv[1])
      import jax_mosaic_ffi as jmf, kernel_sources
      k = jmf.cuda_kernel(kernel_sources.ADD, "add")
      s = jmf.kernel_cache_stats()
      print(json.dumps([s.nvrtc_compiles, s.disk_hits, k.hash.hex()]))
  """)
  out = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)], cwd=tmp_path,
                       env=dict(os.environ, JAX_MOSAIC_FFI_CACHE_DIR=str(isolated_disk_cache)),
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  compiles, hits, digest = json.loads(out.stdout.strip().splitlines()[-1])
  assert (compiles, hits) == (0, 1)
  assert digest == jmf.cuda_kernel(kernel_sources.ADD, "add").hash.hex()


def test_several_processes_compiling_the_same_kernel_at_once(isolated_disk_cache, tmp_path):
  script = textwrap.dedent("""
      import sys
      sys.path.insert(0, sys.argv[1])
      import jax_mosaic_ffi as jmf, kernel_sources
      print(jmf.cuda_kernel(kernel_sources.SUM, "block_sum").hash.hex())
  """)
  env = dict(os.environ, JAX_MOSAIC_FFI_CACHE_DIR=str(isolated_disk_cache))
  procs = [subprocess.Popen([sys.executable, "-c", script, os.path.dirname(__file__)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
  results = [p.communicate(timeout=180) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err for _, err in results]
  assert len({out.strip() for out, _ in results}) == 1
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
  assert after.nvrtc_compiles == before.nvrtc_compiles + 1
  assert rebuilt.module == good.module
  assert path.read_bytes() == data  # rewritten whole


def test_the_cache_stays_within_its_bound(isolated_disk_cache, monkeypatch):
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  one_entry = entries(isolated_disk_cache)[0].stat().st_size
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_MAX_BYTES", str(int(one_entry * 2.5)))
  for i in range(5):
    jmf.cuda_kernel(kernel_sources.ADD.replace("a[i] + b[i]", f"a[i] + b[i] * {i + 2}.0f"), "add")
  total = sum(p.stat().st_size for p in entries(isolated_disk_cache))
  assert total <= one_entry * 2.5
  assert len(entries(isolated_disk_cache)) == 2


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
