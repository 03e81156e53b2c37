"""Kernels that call NVSHMEM: compiled and linked without a GPU; the NVSHMEM job started by the runtime on one.

CPU: the compile (relocatable code, NVSHMEM's device library linked by nvJitLink), the module's flag, the
cache key, the lowering to an NVSHMEM call, jax.export, and the refusals. GPU (one PE per process): puts to
itself, a barrier and a signal wait, the NVSHMEM all-reduce, and two processes on one GPU where NVSHMEM
accepts them. NVSHMEM is the `nvshmem` extra (`pip install 'jax_mosaic_ffi[nvshmem]'`); without it these
tests skip saying so.
"""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi import _core
from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import nvshmem_package
from jax_mosaic_ffi.call.peers import nvshmem as nvshmem_start
from jax_mosaic_ffi.cuda.nvrtc import compiler

import fresh_process
import kernel_sources
from hlo_inspect import custom_calls

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvshmem_worker.py")
CPU = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
GPU = {"CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

requires_nvshmem = pytest.mark.skipif(
    nvshmem_package.find() is None,
    reason=f"NVSHMEM is not installed ({nvshmem_package.INSTALL_HINT}); CI installs it")

PUT_SOURCE = r'''
#include <nvshmem.h>
#include <nvshmemx.h>

// Each PE writes x + its PE number into `out` on the PE after it (itself, with one PE): an int put per
// element, then the whole block with putmem into `copy`; quiet, then a barrier, so every put has landed.
extern "C" __global__ void put_ring(const int* x, int* out, int* copy, long long n) {
  const int me = nvshmem_my_pe(), next = (me + 1) % nvshmem_n_pes();
  if (threadIdx.x == 0) nvshmem_barrier_all();  // every PE is in its kernel: its buffers are staged
  __syncthreads();
  for (long long i = threadIdx.x; i < n; i += blockDim.x) nvshmem_int_p(out + i, x[i] + me, next);
  if (threadIdx.x == 0) nvshmem_putmem(copy, x, n * sizeof(int), next);
  nvshmem_quiet();
  __syncthreads();
  if (threadIdx.x == 0) nvshmem_barrier_all();
}
'''

SIGNAL_SOURCE = r'''
#include <nvshmem.h>
#include <nvshmemx.h>

// Thread 0 puts `value` into `data` on the next PE with a signal, then waits for the one its previous PE
// sends it; `out` gets what arrived and the signal's value.
extern "C" __global__ void signal_ring(const long long* value, long long* data, uint64_t* signal,
                                       long long* out) {
  if (threadIdx.x != 0) return;
  const int me = nvshmem_my_pe(), next = (me + 1) % nvshmem_n_pes();
  nvshmem_barrier_all();  // every PE staged its buffers
  nvshmem_longlong_put_signal(data, value, 1, signal, 7, NVSHMEM_SIGNAL_SET, next);
  nvshmem_signal_wait_until(signal, NVSHMEM_CMP_EQ, 7);
  out[0] = data[0];
  out[1] = (long long)nvshmem_signal_fetch(signal);
  nvshmem_barrier_all();
}
'''


@pytest.fixture(scope="module")
def nvshmem_cache(tmp_path_factory):
  """One disk cache for the module: an NVSHMEM compile takes tens of seconds (its headers are large)."""
  with pytest.MonkeyPatch.context() as m:
    m.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path_factory.mktemp("nvshmem-cache")))
    yield


@pytest.fixture(scope="module")
def put_kernel(nvshmem_cache):
  return jmf.cuda_kernel(PUT_SOURCE, "put_ring")


# --- compile and link (CPU) ----------------------------------------------------------------------------------


@requires_nvshmem
def test_an_nvshmem_kernel_compiles_and_links_without_a_gpu(put_kernel):
  kernel = put_kernel
  assert kernel.uses_nvshmem
  assert kernel.parsed.flags & module_format.FLAG_NVSHMEM
  # Linked cubins only: relocatable PTX cannot be loaded on its own.
  assert [(i.kind, i.arch.sm) for i in kernel.images] == [(module_format.ImageKind.CUBIN, "sm_90")]
  cubin = kernel.images[0].data
  assert cubin[:4] == b"\x7fELF"
  # The device library is in: NVSHMEM's device state, which nvshmemx_cumodule_init fills in at run time.
  assert b"nvshmemi_device_state_d" in cubin
  assert kernel.param_sizes == (8, 8, 8, 8)  # read from the PTX before the link
  assert not kernel.pdl_safe  # launched cooperatively instead
  # The runtime's parser reads the flag back.
  assert module_format.parse(kernel.module).nvshmem


@pytest.fixture(scope="module")
def signal_kernel(nvshmem_cache):
  return jmf.cuda_kernel(SIGNAL_SOURCE, "signal_ring")


@requires_nvshmem
def test_a_kernel_calling_put_signal_links(signal_kernel):
  # NVRTC's uint64_t is `unsigned long long`, the library's `unsigned long`: the call is renamed to link.
  assert signal_kernel.uses_nvshmem and signal_kernel.param_sizes == (8, 8, 8, 8)
  assert b"nvshmemi_transfer_put_signal" in signal_kernel.images[0].data


@requires_nvshmem
def test_declared_nvshmem_links_a_kernel_without_the_include(nvshmem_cache):
  source = 'extern "C" __global__ void plain(int* out) { out[threadIdx.x] = 1; }'
  declared = jmf.cuda_kernel(source, "plain", nvshmem=True)
  detected = jmf.cuda_kernel(source, "plain")
  assert declared.uses_nvshmem and not detected.uses_nvshmem
  assert declared.hash != detected.hash
  assert [i.kind for i in detected.images] == [module_format.ImageKind.CUBIN, module_format.ImageKind.PTX]


def test_the_include_is_detected_in_the_source_and_in_headers():
  from jax_mosaic_ffi.cuda.kernel import includes_nvshmem
  assert includes_nvshmem("#include <nvshmem.h>\n", None)
  assert includes_nvshmem('  #  include "nvshmemx.h"\n', None)
  assert includes_nvshmem('#include "mine.h"\n', {"mine.h": "#include <nvshmemx.h>\n"})
  assert not includes_nvshmem("// #include <nvshmem.h> is a comment here\n", None)
  assert not includes_nvshmem("#include <nvshmem_host.h>\n", None)


@requires_nvshmem
def test_the_cache_key_covers_the_nvshmem_release():
  args = ("src", "k", (), {}, (module_format.Arch(90),), "nvrtc")
  package = nvshmem_package.find()
  plain = compiler.cache_key(*args)
  linked = compiler.cache_key(*args, nvshmem=package.identity)
  other = compiler.cache_key(*args, nvshmem=package.identity.replace("nvshmem3.", "nvshmem9."))
  assert len({plain, linked, other}) == 3
  assert package.identity.startswith("nvshmem" + ".".join(map(str, package.version)) + ":")


def test_a_missing_nvshmem_is_a_clear_error(monkeypatch):
  monkeypatch.setattr(nvshmem_package, "find", lambda: None)
  with pytest.raises(jmf.NvshmemUnavailable) as e:
    jmf.cuda_kernel("#include <nvshmem.h>\n" 'extern "C" __global__ void k() {}', "k")
  assert str(e.value) == ("cuda_kernel 'k' needs NVSHMEM 3.x, which is not installed: pip install "
                          "'jax_mosaic_ffi[nvshmem]' (the nvidia-nvshmem-cu13 wheel)")


def test_an_nvshmem_too_new_to_link_is_a_clear_error(monkeypatch, tmp_path):
  # 3.8's libnvshmem_device.a lacks the transfer code (it moved to per-architecture bitcode).
  newer = nvshmem_package.NvshmemPackage(tmp_path, tmp_path / "libnvshmem_device.a",
                                         tmp_path / "libnvshmem_host.so.3", (3, 8, 0))
  monkeypatch.setattr(nvshmem_package, "find", lambda: newer)
  with pytest.raises(jmf.NvshmemUnavailable) as e:
    jmf.cuda_kernel("#include <nvshmem.h>\n" 'extern "C" __global__ void k() {}', "k")
  assert str(e.value) == (
      "cuda_kernel 'k' needs NVSHMEM 3.4 to 3.7; 3.8.0 is installed, whose device library no longer holds the "
      "transfer code kernels link against: pip install 'nvidia-nvshmem-cu13>=3.4,<3.8'")


def test_nvshmem_must_be_a_bool_or_none():
  with pytest.raises(TypeError, match=r"cuda_kernel: nvshmem must be True, False or None"):
    jmf.cuda_kernel('extern "C" __global__ void k() {}', "k", nvshmem="yes")


# --- the module format and the contract (CPU) -----------------------------------------------------------------


def test_the_module_flag_is_known_and_bits_beyond_are_refused():
  assert module_format.FLAG_NVSHMEM == 2 == _core.LIMITS["module_flag_nvshmem"]
  image = module_format.Image(module_format.ImageKind.CUBIN, module_format.Arch(90), b"\x7fELF" + b"\0" * 60)
  data = module_format.serialize(module_format.ParsedModule("k", (image,), module_format.FLAG_NVSHMEM))
  assert module_format.parse(data).nvshmem
  unknown = bytearray(data)
  unknown[12:16] = (module_format.FLAG_NVSHMEM | 4).to_bytes(4, "little")
  with pytest.raises(module_format.ModuleFormatError, match="unknown flags 6; upgrade jax_mosaic_ffi"):
    module_format.parse(bytes(unknown))


def _attributes(**extra):
  base = {"kernel_hash": b"\0" * 32, "kernel_name": "k", "call_site": "t.py:1", "grid": [1, 1, 1],
          "block": [32, 1, 1], "cluster": [1, 1, 1], "num_inputs": 1, "num_outputs": 1, "param_order": [0, 1]}
  return {**base, **extra}


def test_the_contract_checks_nvshmem_symmetric():
  assert _core.validate_launch(_attributes(nvshmem_symmetric="1,0"), False)["num_buffers"] == 2
  cases = {
      "1": "nvshmem_symmetric has 1 flags for 2 buffers",
      "1,x": "nvshmem_symmetric must be 0/1 flags, got '1,x'",
  }
  for flags, message in cases.items():
    with pytest.raises(ValueError, match=re.escape(message)):
      _core.validate_launch(_attributes(nvshmem_symmetric=flags), False)
  with pytest.raises(ValueError, match="nvshmem_symmetric is for the plain target"):
    _core.validate_launch(_attributes(nvshmem_symmetric="1,1", uses_xla_collective_metadata=True,
                                      xla_replica_ids="0"), True)
  with pytest.raises(ValueError, match=re.escape("a kernel that uses NVSHMEM cannot be batched (vmap)")):
    _core.validate_launch(_attributes(nvshmem_symmetric="1,1", batch_size=2, batch_strides=[4, 4]), False)


# --- lowering (CPU) --------------------------------------------------------------------------------------------


def one_device_mesh():
  return Mesh(np.array(jax.devices("cpu")[:1]), ("x",))


def lower_on_mesh(fn, x):
  f = jax.shard_map(fn, mesh=one_device_mesh(), in_specs=P("x"), out_specs=P("x"))
  return jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))


def put_call(kernel, **collective):
  return jmf.mosaic_kernel(kernel, (jax.ShapeDtypeStruct((256,), jnp.int32),) * 2, grid=1, block=128,
                           scalars=(np.int64(256),), collective=jmf.Collective("x", transport="nvshmem", **collective))


@requires_nvshmem
def test_an_nvshmem_call_lowers_to_the_plain_target_with_its_symmetric_buffers(put_kernel):
  x = jax.ShapeDtypeStruct((256,), jnp.int32)
  (cc,) = custom_calls(lower_on_mesh(lambda v: put_call(put_kernel)(v), x))
  config = cc["config"]
  assert cc["target"] == contract.NVSHMEM_TARGET == "jax_mosaic_ffi_nvshmem_v1"
  assert config["uses_xla_collective_metadata"] is False
  assert config["nvshmem_symmetric"] == b"1,1,1"  # every buffer, by default
  assert config["uses_pdl"] is False
  assert "xla_replica_ids" not in config
  (cc,) = custom_calls(lower_on_mesh(lambda v: put_call(put_kernel, symmetric=(False, True, True))(v), x))
  assert cc["config"]["nvshmem_symmetric"] == b"0,1,1"


@requires_nvshmem
def test_the_nvshmem_all_reduce_lowers(nvshmem_cache):
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  (cc,) = custom_calls(lower_on_mesh(functools.partial(jmf.ops.all_reduce, axis_name="x", transport="nvshmem"), x))
  assert cc["target"] == contract.NVSHMEM_TARGET
  assert cc["config"]["nvshmem_symmetric"] == b"1,0"
  assert cc["config"]["kernel_name"] == b"nvshmem_all_reduce_f32"
  for name in ("nvshmem_all_reduce_i32", "nvshmem_all_gather_f32"):  # the other ready-made ones link too
    assert jmf.ops.collectives.kernel(name).uses_nvshmem


@requires_nvshmem
def test_an_nvshmem_kernel_outside_an_nvshmem_collective_is_refused(put_kernel):
  out = (jax.ShapeDtypeStruct((256,), jnp.int32),) * 2
  with pytest.raises(jmf.LaunchError) as e:
    jmf.mosaic_kernel(put_kernel, out, grid=1, block=128, scalars=(np.int64(256),))
  assert re.fullmatch(
      r"mosaic_kernel 'put_ring' at .*test_nvshmem\.py:\d+ \(.*\): the kernel uses NVSHMEM, so it must run as an "
      r"NVSHMEM collective: pass collective=jmf\.Collective\(axis, transport='nvshmem'\) and call it inside "
      r"shard_map", str(e.value)), str(e.value)
  with pytest.raises(jmf.LaunchError, match=r"inside shard_map \(it has transport='ipc'\)"):
    jmf.mosaic_kernel(put_kernel, out, grid=1, block=128, scalars=(np.int64(256),), collective=jmf.Collective("x"))
  with pytest.raises(jmf.LaunchError, match="launched cooperatively .* leave uses_pdl unset"):
    jmf.mosaic_kernel(put_kernel, out, grid=1, block=128, scalars=(np.int64(256),), uses_pdl=True,
                      collective=jmf.Collective("x", transport="nvshmem"))
  with pytest.raises(jmf.LaunchError, match="input_output_aliases is not supported with transport='nvshmem'"):
    jmf.mosaic_kernel(put_kernel, out, grid=1, block=128, scalars=(np.int64(256),), input_output_aliases={0: 0},
                      collective=jmf.Collective("x", transport="nvshmem"))


def test_a_collective_transport_is_checked():
  assert jmf.Collective("x", transport="nvshmem").nvshmem
  with pytest.raises(ValueError, match=r"Collective transport must be one of 'ipc', 'nvshmem', got 'mpi'"):
    jmf.Collective("x", transport="mpi")


@requires_nvshmem
def test_an_nvshmem_call_on_a_mesh_of_several_devices_of_one_process_is_refused(put_kernel):
  mesh = Mesh(np.array(jax.devices("cpu")[:2]), ("x",))
  f = jax.shard_map(lambda v: put_call(put_kernel)(v), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  with pytest.raises(jmf.LaunchError, match=re.escape(
      "with transport='nvshmem' the devices along ('x',) must be one per process, in process order (NVSHMEM's PEs "
      "are the 1 processes of the job); this clique's devices are in processes [0, 0]")):
    jax.jit(f).trace(jax.ShapeDtypeStruct((512,), jnp.int32)).lower(lowering_platforms=("cuda",))


@requires_nvshmem
def test_an_nvshmem_call_exports_and_round_trips(put_kernel):
  f = jax.shard_map(lambda v: put_call(put_kernel)(v), mesh=one_device_mesh(), in_specs=P("x"), out_specs=P("x"))
  exported = jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(
      jax.ShapeDtypeStruct((256,), jnp.int32))
  again = jax.export.deserialize(exported.serialize())
  text = again.mlir_module()
  assert contract.NVSHMEM_TARGET in text and "nvshmem_symmetric" in text


# --- the start's policy (CPU) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [("", 1 << 30), ("2G", 2 << 30), ("512m", 512 << 20),
                                            ("1048576", 1 << 20), ("4GiB", 4 << 30)])
def test_the_heap_size_setting_is_read_as_nvshmem_reads_it(monkeypatch, text, expected):
  monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", text)
  assert nvshmem_start.heap_bytes() == expected


@pytest.mark.parametrize("text, message", [
    ("lots", "NVSHMEM_SYMMETRIC_SIZE='lots' is not a size: write bytes, or a number with K, M, G or T (e.g. 2G)"),
    ("1K", "NVSHMEM_SYMMETRIC_SIZE='1K' (1024 bytes) is out of range: the symmetric heap must be between 1M and 1T "
           "bytes per PE; symmetric buffers of every NVSHMEM call must fit in it"),
])
def test_a_bad_heap_size_is_a_clear_error(monkeypatch, text, message):
  monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", text)
  with pytest.raises(ValueError) as e:
    nvshmem_start.heap_bytes()
  assert str(e.value) == message


def test_the_host_library_opens_and_gives_a_unique_id_without_a_gpu():
  """Every entry point the runtime needs resolves in the installed libnvshmem_host.so.3 (dlopen'ed, never
  linked), and PE 0's part of the bootstrap works anywhere. In a fresh process: the library stays loaded."""
  script = """
  import json
  from jax_mosaic_ffi import _core
  from jax_mosaic_ffi.base import nvshmem_package
  out = {}
  try:
    _core.nvshmem_unique_id("/nonexistent/libnvshmem_host.so.3")
  except RuntimeError as e:
    out["missing"] = str(e)
  library = str(nvshmem_package.find().host_library)
  ids = [_core.nvshmem_unique_id(library) for _ in range(2)]
  out["sizes"] = [len(i) for i in ids]
  out["version"] = int.from_bytes(ids[0][:4], "little")
  out["distinct"] = ids[0] != ids[1]
  try:
    _core.nvshmem_unique_id(library + ".other")
  except RuntimeError as e:
    out["other"] = str(e).replace(library, "LIB")
  out["job"] = _core.nvshmem_job()
  print(json.dumps(out))
  """
  if nvshmem_package.find() is None:
    pytest.skip(f"NVSHMEM is not installed ({nvshmem_package.INSTALL_HINT}); CI installs it")
  r = fresh_process.run(script, env=CPU).result
  assert r["missing"].startswith("NVSHMEM's host library (/nonexistent/libnvshmem_host.so.3) could not be loaded: "), r
  assert r["sizes"] == [128, 128] and r["distinct"], r
  assert r["version"] == (1 << 16) + 128, r
  assert r["other"] == ("NVSHMEM's host library is already loaded from LIB; it cannot be loaded again from "
                        "LIB.other"), r
  assert r["job"]["started"] is False, r


def test_a_process_without_exactly_one_gpu_is_no_pe():
  count = len([d for d in jax.local_devices() if d.platform == "gpu"])
  if count == 1:
    pytest.skip("this process has one GPU: it is a PE")
  with pytest.raises(jmf.NvshmemUnavailable) as e:
    nvshmem_start.job_layout(0)
  assert str(e.value) == (
      f"NVSHMEM runs one PE per process, bound to one GPU, and this process has {count} GPUs in jax. Start one "
      "process per GPU (jax.distributed.initialize(..., local_device_ids=[i]) or CUDA_VISIBLE_DEVICES)")


def test_nothing_is_started_on_a_cpu_machine():
  assert nvshmem_start.job()["started"] is False


def test_a_peer_that_never_starts_is_named():
  r = fresh_process.run_together("agree:absent", script=WORKER, env=CPU)[0].result
  assert r["error"].startswith(
      "TimeoutError: t: PE 0 waited 2 s for PE 1 (process 1 of the jax.distributed job) to start NVSHMEM; it never "
      "did. Did that process die, or does it not run this program? (JAX_MOSAIC_FFI_PEER_TIMEOUT_S sets the "
      "timeout)"), r
  assert r["seconds"] >= 1.5, r  # it waited for the timeout (how much longer depends on the machine's load)


def test_peers_that_disagree_are_refused():
  results = [f.result for f in fresh_process.run_together("agree:disagree", script=WORKER, env=CPU)]
  assert results[0]["error"] == (
      "RuntimeError: t: PE 1 starts NVSHMEM with 'nvshmem=3.4.5;heap=2147483648;npes=2' and PE 0 with "
      "'nvshmem=3.4.5;heap=1073741824;npes=2'; every process must have the same NVSHMEM release and "
      "NVSHMEM_SYMMETRIC_SIZE"), results
  assert results[1]["error"].startswith("RuntimeError: t: PE 0 starts NVSHMEM with 'nvshmem=3.4.5;heap=1073741824"), \
      results


def test_a_late_pe_fails_that_start_at_once_and_the_next_start_meets():
  # PE 0 gives up its first start after 4 s; PE 1 arrives then. Each attempt ends in one verdict, so PE 1 fails
  # that attempt at once (instead of waiting out its timeout, a hang guard, for a unique id PE 0 will never publish)
  # and both meet at the next.
  first, late = (f.result["outcomes"] for f in fresh_process.run_together("late", script=WORKER, env=CPU))
  assert first[0]["error"].startswith("TimeoutError: t: PE 0 waited 4 s for PE 1"), first
  assert late[0]["error"].startswith("RuntimeError: t: PE 0 (after waiting 4 s) gave up on this NVSHMEM start "
                                     "before PE 1 joined it"), late
  assert late[0]["seconds"] < fresh_process.INNER_GUARD_S / 10, late
  assert len(first) == len(late) == 2 and first[1].get("id") and first[1]["id"] == late[1].get("id"), (first, late)


def test_a_key_another_process_set_is_named():
  r = fresh_process.run_together("taken", script=WORKER, env=CPU)[0].result
  assert r["error"].startswith("RuntimeError: t: the key 'jax_mosaic_ffi/nvshmem/1/joined/0' is already set in the "
                               "jax.distributed key-value store"), r
  assert "ALREADY_EXISTS" not in r["error"], r


def test_peers_that_agree_go_on():
  assert [f.result for f in fresh_process.run_together("agree:ok", script=WORKER, env=CPU)] == \
      [{"ok": True}, {"ok": True}]


# --- on the GPU: one process, one PE ---------------------------------------------------------------------------


def gpu_mesh():
  return Mesh(np.array(jax.devices("cuda")[:1]), ("x",))


def run_on_gpu(fn, *args, outs=1):
  out_specs = P("x") if outs == 1 else (P("x"),) * outs
  f = jax.shard_map(fn, mesh=gpu_mesh(), in_specs=(P("x"),) * len(args), out_specs=out_specs)
  return jax.jit(f)(*args)


@pytest.mark.gpu
@requires_nvshmem
def test_one_pe_puts_to_itself(put_kernel, rng):
  x = rng.integers(-1000, 1000, 256).astype(np.int32)
  # One executable, alive through the checks below: its module and buffers go when it does.
  f = jax.jit(jax.shard_map(lambda v: put_call(put_kernel)(v), mesh=gpu_mesh(), in_specs=(P("x"),),
                            out_specs=(P("x"), P("x"))))
  for _ in range(2):  # the second call reuses the call site's symmetric buffers
    out, copy = f(x)
    np.testing.assert_array_equal(np.asarray(out), x)  # x + PE 0, put by nvshmem_int_p
    np.testing.assert_array_equal(np.asarray(copy), x)  # by nvshmem_putmem
    x = x + 1
  job = nvshmem_start.job()
  assert job["started"] and (job["pe"], job["npes"], job["device"]) == (0, 1, 0), job
  assert job["registered_modules"] >= 1 and job["symmetric_buffers"] >= 3, job


@pytest.mark.gpu
@requires_nvshmem
def test_one_pe_barrier_and_signal_wait(signal_kernel, rng):
  kernel = signal_kernel
  value = rng.integers(1, 1 << 40, 1).astype(np.int64)
  call = jmf.mosaic_kernel(
      kernel, (jax.ShapeDtypeStruct((2,), jnp.uint32), jax.ShapeDtypeStruct((2,), jnp.uint32),
               jax.ShapeDtypeStruct((4,), jnp.uint32)),
      grid=1, block=32, zero_outputs=(1,),  # the signal starts at 0 on the heap too
      collective=jmf.Collective("x", symmetric=(False, True, True, False), transport="nvshmem"))
  as_words = value.view(np.uint32)  # 64-bit values as pairs of u32: no jax x64 needed
  data, signal, out = run_on_gpu(lambda v: call(v), as_words, outs=3)
  out = np.asarray(out).view(np.int64)
  assert out[0] == value[0]  # what arrived with the signal
  assert out[1] == 7  # the signal's value
  assert np.asarray(signal).view(np.uint64)[0] == 7
  assert np.asarray(data).view(np.int64)[0] == value[0]


@pytest.mark.gpu
@requires_nvshmem
def test_the_nvshmem_all_reduce_of_one_pe_is_its_input(nvshmem_cache, rng):
  for dtype in (np.float32, np.int32):
    x = (rng.standard_normal(10_000) * 100).astype(dtype)
    out = run_on_gpu(functools.partial(jmf.ops.all_reduce, axis_name="x", transport="nvshmem"), x)
    np.testing.assert_array_equal(np.asarray(out), x)
  x = rng.standard_normal(3000).astype(np.float32)
  gathered = run_on_gpu(lambda v: jmf.ops.all_gather(v, axis_name="x", axis_size=1, transport="nvshmem"), x)
  np.testing.assert_array_equal(np.asarray(gathered), x[None])


# The affine TMA kernel of test_tma.py as an NVSHMEM kernel: its buffers are staged onto the symmetric heap, so its
# descriptors must describe the heap's copies, which it reads and writes, not XLA's buffers (described, a TMA store
# would land in XLA's output and the unwritten copy be copied over it).
TMA_AFFINE_SOURCE = "#include <nvshmem.h>\n" + kernel_sources.TMA_AFFINE


@pytest.mark.gpu
@requires_nvshmem
def test_tensor_maps_describe_the_buffers_staged_on_the_symmetric_heap(nvshmem_cache, rng):
  kernel = jmf.cuda_kernel(TMA_AFFINE_SOURCE, "tma_affine")
  tile = dict(box=(32, 32), swizzle=128)
  call = jmf.mosaic_kernel(
      kernel, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda x: (jmf.cdiv(x.shape[1], 32), jmf.cdiv(x.shape[0], 32)), block=128,
      scalars=(np.float32(2.0), np.float32(1.0)),
      param_order=(jmf.TensorMap("in0", **tile), jmf.TensorMap("out0", **tile), "scalar0", "scalar1"),
      collective=jmf.Collective("x", transport="nvshmem"))
  x = rng.standard_normal((96, 64)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(run_on_gpu(lambda v: call(v), x)), 2 * x + 1, rtol=1e-6)


@pytest.mark.gpu
@requires_nvshmem
def test_an_exported_nvshmem_call_starts_nvshmem_in_a_fresh_process(put_kernel, tmp_path, rng):
  f = jax.shard_map(lambda v: put_call(put_kernel)(v), mesh=gpu_mesh(), in_specs=P("x"), out_specs=(P("x"), P("x")))
  exported = jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=jmf.export_disabled_checks())(
      jax.ShapeDtypeStruct((256,), jnp.int32))
  (tmp_path / "put.jax_export").write_bytes(exported.serialize())
  x = rng.integers(-1000, 1000, 256).astype(np.int32)
  np.save(tmp_path / "x.npy", x)
  script = """
  import json, sys
  import jax, numpy as np
  import jax_mosaic_ffi as jmf
  from jax_mosaic_ffi.call.peers import nvshmem
  call = jax.export.deserialize(open(sys.argv[1] + "/put.jax_export", "rb").read())
  jmf.register()  # a process that only deserializes registers the targets itself (docs/guides/transformations.md)
  out, copy = call.call(np.load(sys.argv[1] + "/x.npy"))
  print(json.dumps({"out": np.asarray(out).tolist(), "copy": np.asarray(copy).tolist(), "job": nvshmem.job(),
                    "compiles": jmf.kernel_cache_stats().compiles["nvrtc"]}))
  """
  r = fresh_process.run(script, str(tmp_path)).result
  assert r["out"] == x.tolist() and r["copy"] == x.tolist(), r
  assert r["job"]["started"] and r["job"]["npes"] == 1, r
  assert r["compiles"] == 0, r  # the artifact carries the linked cubin


@pytest.mark.gpu
@requires_nvshmem
def test_a_grid_too_large_for_a_cooperative_launch_is_explained(put_kernel):
  call = jmf.mosaic_kernel(put_kernel, (jax.ShapeDtypeStruct((256,), jnp.int32),) * 2, grid=1 << 20, block=1024,
                           scalars=(np.int64(256),), collective=jmf.Collective("x", transport="nvshmem"))
  with pytest.raises(Exception) as e:
    jax.block_until_ready(run_on_gpu(lambda v: call(v), np.zeros(256, np.int32), outs=2))
  assert "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE" in str(e.value), str(e.value)
  assert "A kernel that uses NVSHMEM is launched cooperatively (as nvshmemx_collective_launch does): every block " \
         "must be resident on the GPU at once; use a smaller grid" in str(e.value), str(e.value)


@pytest.mark.gpu
@requires_nvshmem
def test_a_heap_too_small_is_a_clear_error():
  script = """
  import functools, json
  import jax, numpy as np
  from jax.sharding import Mesh, PartitionSpec as P
  import jax_mosaic_ffi as jmf
  mesh = Mesh(np.array(jax.devices("cuda")[:1]), ("x",))
  f = jax.jit(jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x", transport="nvshmem"), mesh=mesh,
                            in_specs=P("x"), out_specs=P("x")))
  try:
    f(np.ones(1 << 28, np.float32)).block_until_ready()
    print(json.dumps({"error": None}))
  except Exception as e:
    print(json.dumps({"error": str(e)}))
  """
  # NVSHMEM grows its heap through CUDA's virtual memory API unless told not to, and rounds the size it is given
  # up (measured on the H200: a 64 MiB buffer fits a "32M" heap even without growth): ask for 1 GiB.
  r = fresh_process.run(script, env={"NVSHMEM_SYMMETRIC_SIZE": "32M", "NVSHMEM_DISABLE_CUDA_VMM": "1"}).result
  assert "NVSHMEM's symmetric heap has no room for 1073741824 more bytes (0 bytes in 0 buffers already held by " \
         "jax_mosaic_ffi). Set NVSHMEM_SYMMETRIC_SIZE larger" in (r["error"] or ""), r


# --- on the GPU: two processes, one GPU ------------------------------------------------------------------------


def _mps(action: str, directory: str) -> None:
  import subprocess
  env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": directory, "CUDA_MPS_LOG_DIRECTORY": directory}
  if action == "start":
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=fresh_process.HANG_GUARD_S)
  else:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, timeout=fresh_process.HANG_GUARD_S)


@pytest.mark.gpu
@requires_nvshmem
@pytest.mark.parametrize("mps", [False, True], ids=["plain", "mps"])
def test_two_processes_on_one_gpu(tmp_path, mps):
  """Two PEs on the one GPU: NVSHMEM may refuse; then the test skips with exactly what it said."""
  import shutil
  env = {**GPU, "NVSHMEM_SYMMETRIC_SIZE": "256M", "JAX_MOSAIC_FFI_PEER_TIMEOUT_S": "60"}
  if mps:
    if shutil.which("nvidia-cuda-mps-control") is None:
      pytest.skip("nvidia-cuda-mps-control is not on this machine")
    env.update(CUDA_MPS_PIPE_DIRECTORY=str(tmp_path), CUDA_MPS_LOG_DIRECTORY=str(tmp_path))
    _mps("start", str(tmp_path))
  try:
    # NVSHMEM may hang starting two PEs on one GPU, which this test expects and skips on: its timeout is that hang's,
    # not a hang guard, and a start that is only slow (a loaded machine) skips the same way, never fails.
    finished = fresh_process.run_together("gpu", 1234, script=WORKER, env=env, timeout=150)
  except AssertionError as e:  # a hang inside NVSHMEM's start: what rank 0 printed is what there is to say
    pytest.skip(f"NVSHMEM did not finish starting two PEs on one GPU{' under MPS' if mps else ''}: {e}")
  finally:
    if mps:
      _mps("stop", str(tmp_path))
  results = []
  for rank, f in enumerate(finished):
    try:
      results.append(f.result)
    except (AssertionError, ValueError):
      results.append({"refused": f"rank {rank} exited with {f.returncode} and no result"})
    results[-1]["stderr"] = f.stderr[-1500:]
  refused = [r for r in results if "refused" in r or "crash" in r]
  if refused:
    said = "; ".join(f"{r.get('refused') or r.get('crash')} | stderr: {r['stderr']}" for r in refused)
    pytest.skip(f"NVSHMEM did not run two PEs on one GPU{' under MPS' if mps else ''}: {said}")
  for r in results:
    assert r["max_error"] < 1e-5, r
    assert r["job"]["npes"] == 2, r
