"""JAX_MOSAIC_FFI_DUMP_DIR: written safely, and never in the way of making a kernel."""

import os
import re
import shlex
import warnings

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.toolchain import dump
from jax_mosaic_ffi.base.module_format import ImageKind

import fresh_process
import kernel_sources


def put_cuobjdump_on_path(tmp_path, monkeypatch, body: str):
  """A stand-in cuobjdump, first on the PATH: a real program, run as the real one would be."""
  folder = tmp_path / "bin"
  folder.mkdir()
  tool = folder / "cuobjdump"
  tool.write_text(body)
  tool.chmod(0o755)
  monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
  return tool


def recording_cuobjdump(tmp_path, monkeypatch):
  """A cuobjdump that writes its arguments, one a line, to the returned file."""
  args = tmp_path / "cuobjdump-args"
  put_cuobjdump_on_path(tmp_path, monkeypatch,
                        f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(args))}\necho "fake SASS"\n')
  return args


def add_cubin():
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  return next(i.data for i in kernel.images if i.kind == ImageKind.CUBIN)


def test_a_symlink_at_a_dump_name_is_replaced_not_written_through(isolated_disk_cache, tmp_path, monkeypatch):
  recording_cuobjdump(tmp_path, monkeypatch)
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  stem = f"add-{kernel.hash.hex()[:8]}"
  folder = tmp_path / "dump"
  folder.mkdir()
  victim = tmp_path / "victim"
  victim.write_bytes(b"precious")
  (folder / f"{stem}.ptx").symlink_to(victim)
  (folder / f"{stem}.sm_90.cubin").symlink_to(victim)
  (folder / f"{stem}.sm_90.sass").symlink_to(tmp_path / "created-through-a-link")  # dangling
  monkeypatch.setenv(dump.DUMP_ENV, str(folder))
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  assert victim.read_bytes() == b"precious"
  assert not (tmp_path / "created-through-a-link").exists()
  images = {i.kind: i.data for i in kernel.images}
  assert not (folder / f"{stem}.ptx").is_symlink()
  assert (folder / f"{stem}.ptx").read_bytes() == images[ImageKind.PTX]
  assert (folder / f"{stem}.sm_90.cubin").read_bytes() == images[ImageKind.CUBIN]
  assert (folder / f"{stem}.sm_90.sass").read_text() == "fake SASS\n"
  assert sorted(p.name for p in folder.iterdir()) == sorted(
      [f"{stem}.ptx", f"{stem}.sm_90.cubin", f"{stem}.sm_90.sass"])  # no temp files left


def test_a_dump_folder_that_is_a_file_warns_once_and_kernels_still_work(isolated_disk_cache, tmp_path,
                                                                       monkeypatch):
  folder = tmp_path / "dump"
  folder.write_text("not a folder")
  monkeypatch.setenv(dump.DUMP_ENV, str(folder))
  with pytest.warns(RuntimeWarning, match=r"JAX_MOSAIC_FFI_DUMP_DIR=.*cannot write kernel dumps") as caught:
    kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert kernel.name == "add" and kernel.images
  assert caught[0].filename == __file__  # points at the caller, not at our internals
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # once per folder: no second warning
    jmf.cubin_kernel({"sm_90": add_cubin()}, "add")
  assert folder.read_text() == "not a folder"


@pytest.mark.parametrize("cuobjdump", ["recording", "real"])
def test_a_kernel_named_like_an_option(isolated_disk_cache, tmp_path, monkeypatch, cuobjdump):
  cubin = add_cubin()
  if cuobjdump == "recording":
    args = recording_cuobjdump(tmp_path, monkeypatch)
  elif dump._cuobjdump() is None:
    pytest.skip("no cuobjdump on the PATH, under $CUDA_HOME/bin or /usr/local/cuda/bin")
  folder = tmp_path / "dump"
  folder.mkdir()
  # A relative dump folder used to give cuobjdump a bare '-h-....cubin'.
  monkeypatch.chdir(folder)
  monkeypatch.setenv(dump.DUMP_ENV, ".")
  kernel = jmf.cubin_kernel({"sm_90": cubin}, "-h")
  stem = f"_h-{kernel.hash.hex()[:8]}"
  assert sorted(p.name for p in folder.iterdir()) == [f"{stem}.sm_90.cubin", f"{stem}.sm_90.sass"]
  sass = (folder / f"{stem}.sm_90.sass").read_text()
  if cuobjdump == "recording":
    assert args.read_text().splitlines() == ["--dump-sass", str(folder / f"{stem}.sm_90.cubin")]
  else:
    assert "Function : " in sass and "[jax_mosaic_ffi:" not in sass, sass[:500]


@pytest.mark.parametrize("name", [".hidden", "..", "a/../b", "--output=x"])
def test_dump_names_never_start_with_a_dot_or_dash_nor_leave_the_folder(isolated_disk_cache, tmp_path,
                                                                        monkeypatch, name):
  cubin = add_cubin()
  recording_cuobjdump(tmp_path, monkeypatch)
  folder = tmp_path / "dump"
  monkeypatch.setenv(dump.DUMP_ENV, str(folder))
  kernel = jmf.cubin_kernel({"sm_90": cubin}, name)
  names = sorted(p.name for p in folder.iterdir())
  assert len(names) == 2 and all(n[0] not in "-." for n in names), names
  assert names[0].endswith(f"-{kernel.hash.hex()[:8]}.sm_90.cubin")
  assert (folder / names[0]).read_bytes() == cubin


@pytest.mark.parametrize("failure", ["exits_non_zero", "hangs", "cannot_start"])
def test_a_failing_cuobjdump_does_not_stop_kernel_creation(isolated_disk_cache, tmp_path, monkeypatch,
                                                           failure):
  body = {"exits_non_zero": "#!/bin/sh\necho 'no such file' >&2\nexit 3\n",
          "hangs": "#!/bin/sh\nexec sleep 600\n",
          "cannot_start": "#!/nonexistent/interpreter\n"}[failure]
  cubin = add_cubin()
  put_cuobjdump_on_path(tmp_path, monkeypatch, body)
  # 2 s where the test is about the bound (a cuobjdump that hangs); elsewhere only a hang guard, so that a loaded
  # machine's slow start of a failing cuobjdump is not taken for a hang.
  monkeypatch.setattr(dump, "_CUOBJDUMP_TIMEOUT_S", 2 if failure == "hangs" else fresh_process.INNER_GUARD_S)
  folder = tmp_path / "dump"
  monkeypatch.setenv(dump.DUMP_ENV, str(folder))
  kernel = jmf.cubin_kernel({"sm_90": cubin}, "add")  # "hangs": stopped by the bound, not after its 600 s
  sass = (folder / f"add-{kernel.hash.hex()[:8]}.sm_90.sass").read_text()
  expected = {"exits_non_zero": r"no such file\n\n\[jax_mosaic_ffi: .* exited with status 3\]",
              "hangs": r"was stopped after 2 s", "cannot_start": "could not run"}[failure]
  assert re.search(expected, sass), sass
