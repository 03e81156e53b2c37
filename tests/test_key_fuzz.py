"""The edit fuzzer: every kind of edit a user makes between two runs (a method's body, a JIT function an instance
holds, a field, a module global, a closure cell, a default, an enum's value, a class's base, a setting, and
controls that change nothing the kernel reads), to a program of each front end (tests/key_fuzz.py), with the key
audit on. In this process (memory cache) and across processes (a warm disk cache, memory empty): no hit may serve a
kernel made from other IR (KeyAuditError), an edit that changes the kernel must change the key, and a control must
keep it (a warm cache still hits). A second corpus (tests/key_fuzz_proof.py), per wing, reads through the patterns
earlier readers keyed by text, by a trusted name or not at all (they must be read, keeping the fast key) and
through what no key holds (the environment, computed names: only that kernel goes to its IR key). The table of
what was tried ends the test run's output."""

import json
import os

import pytest

from jax_mosaic_ffi.cute.compiler import keys as cute_keys
from jax_mosaic_ffi.triton.compiler import keys

import fresh_process
import key_fuzz
import key_fuzz_proof

PROGRAMS = {**key_fuzz.PROGRAMS, **key_fuzz_proof.PROGRAMS}

WARM = '''
  import json, sys
  sys.dont_write_bytecode = True
  import key_fuzz, key_fuzz_proof
  folder, wing, names = sys.argv[1], sys.argv[2], sys.argv[3:]
  program = {**key_fuzz.PROGRAMS, **key_fuzz_proof.PROGRAMS}[wing]
  found = key_fuzz.warm_run(folder, program, names) if names else key_fuzz.lower(folder, program, None)
  print(json.dumps(found))
'''


def _requirements(wing: str) -> None:
  if wing in ("triton", "gluon"):
    from triton_required import import_triton
    import_triton()
  if wing == "cute":
    import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)


def _lower_with(folder, program, edit, monkeypatch):
  with monkeypatch.context() as m:
    for name, value in (edit.env if edit else ()):
      m.setenv(name, value)
    return key_fuzz.lower(str(folder), program, edit)


@pytest.mark.parametrize("wing", sorted(PROGRAMS))
def test_every_edit_that_changes_the_kernel_changes_its_key(wing, tmp_path, monkeypatch, record_property):
  _requirements(PROGRAMS[wing].wing)
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "1")
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path / "memory-run-cache"))
  monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
  monkeypatch.setattr("sys.dont_write_bytecode", True)  # each version is read from its text, never a stale .pyc
  program = PROGRAMS[wing]
  folder = tmp_path / "program"
  folder.mkdir()
  rows = []

  # In this process: each edit against the program as it was, from the memory cache.
  base = _lower_with(folder, program, None, monkeypatch)
  assert base["compiled"]
  for edit in program.edits:
    edited = _lower_with(folder, program, edit, monkeypatch)
    rows.append(key_fuzz.row(program, edit, _lower_with(folder, program, None, monkeypatch), edited, "memory"))

  # Across processes: the program compiled in one, each edit lowered in another from the warm disk cache (a
  # setting is the environment of a process of its own).
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "disk-run-cache"), "PYTHONDONTWRITEBYTECODE": "1"}
  cold = fresh_process.run(WARM, folder, wing, env=env).result
  assert cold["compiled"]
  # Controls first: an edited header's compile takes its kernel's entry (one per key, its headers checked on use),
  # so the program as it was would miss after it, rightly.
  plain = sorted((e for e in program.edits if not e.env), key=lambda e: e.changes_kernel)
  found = fresh_process.run(WARM, folder, wing, *(e.name for e in plain), env=env).result
  for edit in program.edits:
    if edit.env:
      (result,) = fresh_process.run(WARM, folder, wing, edit.name, env={**env, **dict(edit.env)}).result
    else:
      result = found[plain.index(edit)]
    rows.append(key_fuzz.row(program, edit, cold, result, "disk"))

  record_property("key_fuzz", json.dumps(rows))
  problems = [f"{r['where']}: {r['edit']}: {'; '.join(r['problems'])}" for r in rows if r["problems"]]
  assert not problems, "\n".join(problems)
  kinds = {r["kind"] for r in rows}
  assert "control" in kinds and len(kinds) >= 4, kinds
  assert os.environ["JAX_MOSAIC_FFI_KEY_AUDIT"] == "1"


@pytest.mark.parametrize("wing", sorted(w for w in key_fuzz_proof.PROGRAMS if not w.startswith("cuda")))
def test_what_the_reader_reads_keeps_its_fast_key_and_only_the_rest_goes_to_the_ir(wing, tmp_path, monkeypatch):
  """The patterns the reader must read are read (the kernel keeps its key without a trace or TTIR: the warm
  start), and those it cannot follow make only that kernel's key the IR's."""
  program = PROGRAMS[wing]
  _requirements(program.wing)
  monkeypatch.setattr("sys.dont_write_bytecode", True)
  module = key_fuzz.load(str(tmp_path), program, None)
  if program.wing == "cute":
    key = cute_keys.fingerprint(module.launcher)
  else:
    key = keys.constexpr_key(module.kernel)
  assert (key is not None) == wing.endswith("_reads"), wing


SET_ORDERED = '''
  import json, sys
  sys.dont_write_bytecode = True
  import jax, jax.numpy as jnp
  import jax_mosaic_ffi as jmf
  import cute_kernels as K
  from hlo_inspect import custom_calls
  # A table built from a set of names: its order is the set's, which string hashes make differ per process.
  table = {name: float(len(name)) for name in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}}
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  call = lambda x: jmf.mosaic_kernel(jmf.cute_kernel(K.add_entry_of, table=table, index="gamma",
                                                     targets=("sm_90a",)), lambda x: x)(x)
  (cc,) = custom_calls(jax.jit(call).trace(x).lower(lowering_platforms=("cuda",)))
  s = jmf.kernel_cache_stats()
  print(json.dumps({"order": list(table), "compiles": s.compiles.get("cute", 0), "pack_hits": s.pack_hits}))
'''


def test_a_dict_built_from_a_set_keys_alike_in_every_process(tmp_path):
  # D24: its order differs per process (PYTHONHASHSEED), and nothing of the kernel depends on it: one compile for
  # four processes with a warm disk cache, and a pack recorded in one serves the others in the strict mode.
  import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)
  from jax_mosaic_ffi.base import pack_file
  from jax_mosaic_ffi.pack import build as pack_build
  from jax_mosaic_ffi.pack import recordings
  cache = str(tmp_path / "cache")
  runs = [fresh_process.run(SET_ORDERED, env={"JAX_MOSAIC_FFI_CACHE_DIR": cache, "PYTHONHASHSEED": str(seed)}).result
          for seed in (1, 2, 3, 4)]
  assert len({tuple(r["order"]) for r in runs}) > 1, runs  # the order differed between the processes
  assert [r["compiles"] for r in runs] == [1, 0, 0, 0], runs
  # A pack recorded by one process serves processes of other orders, strictly (a compile would fail them).
  fresh_process.run(SET_ORDERED, env={"JAX_MOSAIC_FFI_CACHE_DIR": "off", "PYTHONHASHSEED": "5",
                                      "JAX_MOSAIC_FFI_PACK_RECORD": str(tmp_path / "recording")})
  built = pack_build.build(recordings.read(str(tmp_path / "recording")))
  pack = str(tmp_path / "set.jmfpack")
  pack_file.write(pack, built.entries, built.created, built.notes)
  # (Without the audit, which proves a pack's entry by compiling it again.)
  served = [fresh_process.run(SET_ORDERED, env={"JAX_MOSAIC_FFI_CACHE_DIR": "off", "PYTHONHASHSEED": str(seed),
                                                "JAX_MOSAIC_FFI_PACKS": pack, "JAX_MOSAIC_FFI_PACKS_STRICT": "1",
                                                "JAX_MOSAIC_FFI_KEY_AUDIT": "0"}).result
            for seed in (6, 7, 8)]
  assert [(r["compiles"], r["pack_hits"]) for r in served] == [(0, 1)] * 3, served
