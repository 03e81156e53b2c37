"""Collective kernels across processes (jax.distributed, one GPU per process).

Every test runs real processes (fresh_process.run_together, tests/cross_process_worker.py).
The key-value exchange runs on CPU; the kernels need a GPU, where two
processes share the one GPU (CUDA_VISIBLE_DEVICES=0 for both): NCCL refuses
that, so nothing here uses an XLA collective.
"""

import os

import pytest

import fresh_process

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cross_process_worker.py")

CPU = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
GPU = {"CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def outcomes(*args, env):
  """Every rank's JSON result; a rank that printed none fails the test with its stderr."""
  return [f.result for f in fresh_process.run_together(*args, script=WORKER, env=env)]


def survivor(*args, env):
  """Rank 0's result, when rank 1 dies on purpose."""
  return fresh_process.run_together(*args, script=WORKER, env=env)[0].result


# --- the exchange, on CPU -------------------------------------------------------------------------

def test_exchange_trades_every_ranks_deposit_over_generations():
  for rank, r in enumerate(outcomes("exchange:ok", env=CPU)):
    assert "error" not in r, r
    assert r["values"] == [[f"deposit 0 {g}", f"deposit 1 {g}"] for g in range(3)], (rank, r)


@pytest.mark.parametrize("variant", ["absent", "exits"])
def test_exchange_times_out_naming_the_peer(variant):
  r = survivor(f"exchange:{variant}", env=CPU)
  assert r["error"].startswith("TimeoutError: k: rank 0 waited 2 s for peer rank 1 (device"), r
  assert "process 1)" in r["error"] and "JAX_MOSAIC_FFI_PEER_TIMEOUT_S" in r["error"]
  assert r["seconds"] >= 1.5, r  # it waited for the timeout (how much longer depends on the machine's load)


def test_a_late_rank_never_uses_an_exchange_its_peer_abandoned():
  first, late = (r["outcomes"] for r in outcomes("exchange:abandoned", env=CPU))
  assert first[0].startswith("TimeoutError: k: rank 0 waited 2 s for peer rank 1"), first
  # Rank 0's deposit of generation 0 is still in the store: rank 1 must not take it.
  assert late[0].startswith("RuntimeError: k: peer rank 0 (device "), late
  assert "gave up on this collective workspace exchange before rank 1 joined it" in late[0], late
  # The next attempt starts in step.
  assert first[1] == late[1] == ["deposit 0 1", "deposit 1 1"], (first, late)


def test_after_a_peer_timeout_the_ranks_meet_again_once_the_peer_is_back():
  # Rank 1 stalls before execution 2 until rank 0 has failed execution 2 (it waited 3 s for rank 1) and execution 3
  # (rank 1 is still away when it tries to meet again); rank 1 fails both at once when it comes back (its peer gave
  # up; that attempt to meet was abandoned), long before its own timeout (a hang guard). At execution 4 both meet
  # again, and go on.
  first, late = (r["outcomes"] for r in outcomes("host:meet", env=CPU))
  at_once = fresh_process.INNER_GUARD_S / 10
  assert first[:2] == late[:2] == ["ok", "ok"], (first, late)
  assert "waited 3 s for peer rank 1" in first[2]["error"] and first[2]["broken"], first
  assert "gave up waiting for rank 1" in late[2]["error"] and late[2]["seconds"] < at_once, late
  assert "meeting the peers again after a timeout" in first[3]["error"] and "never did" in first[3]["error"], first
  assert "gave up on this collective workspace exchange" in late[3]["error"] and late[3]["seconds"] < at_once, late
  assert first[4:] == late[4:] == ["ok"] * 4, (first, late)


def test_before_recovery_a_timeout_broke_the_clique_for_good():
  # What the host half did alone (arrive without meeting again): every later execution failed.
  first, late = (r["outcomes"] for r in outcomes("host:arrive", env=CPU))
  assert first[:2] == ["ok", "ok"] and all("error" in o for o in first[2:]), first
  assert "must meet again first" in first[3]["error"], first


def test_a_peer_on_another_host_is_refused():
  r = outcomes("exchange:other_host", env=CPU)[0]
  assert r["error"].startswith("RuntimeError: k: peer rank 1"), r
  assert "runs on host 'elsewhere'" in r["error"] and "one host" in r["error"]


# --- flag pages and deposits from peers, on CPU ------------------------------------------------------
# The runtime's host half (csrc/peers/host_rendezvous.cc) through its test hook, _core._HostRankForTests: the
# flag page, the checks on a peer's deposit and page, the rendezvous. Each case runs in a fresh process,
# so a crash (SIGBUS, SIGSEGV) fails the test instead of killing the suite.

HOST = """
import json, os, sys, threading
from jax_mosaic_ffi import _core
L = _core._cross_process_layout()
IDS = [10, 11]

RANKS = []

def rank(r, address=None):
  RANKS.append(_core._HostRankForTests(r, IDS, 1 << 20, 0x7f0000000000 + (r << 24) if address is None else address))
  return RANKS[-1]

def put(blob, offset, value):
  blob = bytearray(blob)
  blob[offset:offset + len(value)] = value
  return bytes(blob)

def page_path(name):
  return "/dev/shm" + name

def poke(name, offset, value):  # what a peer can do: write into a page it mapped
  fd = os.open(page_path(name), os.O_RDWR)
  os.pwrite(fd, value.to_bytes(8, "little"), offset)
  os.close(fd)

def attempt(fn):
  try:
    return {"ok": fn()}
  except Exception as err:
    return {"error": f"{type(err).__name__}: {err}"}

def craft(name, content=b"", mode=0o600, size=None):  # a page file the test plants
  path = page_path(name)
  fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
  os.write(fd, content)
  if size is not None:
    os.ftruncate(fd, size)
  os.close(fd)
  os.chmod(path, mode)
  return path

def done(result):
  for r in RANKS:  # unlinks the pages not yet unlinked
    r.close()
  print(json.dumps(result), flush=True)
"""

CPU_ONLY = {"JAX_PLATFORMS": "cpu"}


def host(script: str):
  return fresh_process.run(HOST + script, env=CPU_ONLY).result


def test_two_ranks_of_one_process_take_each_others_address_and_meet():
  r = host("""
a, b = rank(0), rank(1)
pages = [a.page_name, b.page_name]
views = [a.admit([a.deposit(), b.deposit()]), b.admit([a.deposit(), b.deposit()])]
threads = [threading.Thread(target=x.arrive, args=(10.0,)) for x in (a, b)]
[t.start() for t in threads]
[t.join() for t in threads]
done({"pages": pages, "views": views, "left": [os.path.exists(page_path(p)) for p in pages]})
""")
  assert all(__import__("re").fullmatch(r"/jmf-[0-9a-f]{32}", p) for p in r["pages"]), r
  assert r["views"] == [["self", "same process"], ["same process", "self"]], r
  assert r["left"] == [False, False], r  # unlinked once every peer has mapped them


# Each: how the deposit or its page is spoiled, and what the error says. Rank 1's deposit is genuine
# before the change; the page it names is planted under a fresh name of the runtime's form.
SPOILED = {
    "empty deposit": ("d = b''", "sent a malformed deposit: 0 bytes, not"),
    "oversized deposit": ("d = d + b'x'", "sent a malformed deposit: "),
    "page name outside /dev/shm": ("d = put(d, L['deposit_page'], b'/../../etc/passwd\\0')",
                                   "named '/../../etc/passwd' as its host flag page, which is not a page name"),
    "page name unterminated": ("d = put(d, L['deposit_page'], b'/jmf-' + b'a' * 59)", "is not a page name"),
    "0-byte page": ("craft(FAKE)", "holds 0 bytes, not 4096: refused"),
    "oversized page": ("craft(FAKE, header, size=2 * L['page_bytes'])", "holds 8192 bytes, not 4096: refused"),
    "page open to others": ("craft(FAKE, header, mode=0o644, size=L['page_bytes'])",
                            "is open to other users (mode 0644): refused"),
    "page of another user": ("craft(FAKE, header, size=L['page_bytes']); os.chown(page_path(FAKE), 65534, 65534)",
                             "belongs to uid 65534, not to this process's uid"),
    "page through a symlink": ("os.symlink(page_path(b.page_name), page_path(FAKE))", "opening peer rank 1"),
    "page made by another process": (
        "craft(FAKE, put(header, L['page_token'], bytes(16)), size=L['page_bytes'])",
        "was not made by the process that sent the deposit: refused"),
}


@pytest.mark.parametrize("case", SPOILED)
def test_a_spoiled_deposit_or_page_is_a_clean_error_naming_the_peer(case):
  if "another user" in case and os.geteuid() != 0:
    pytest.skip("needs root to plant a page owned by another user")
  spoil, message = SPOILED[case]
  r = host(f"""
a, b = rank(0), rank(1)
FAKE = "/jmf-" + os.urandom(16).hex()
with open(page_path(b.page_name), "rb") as f:
  header = f.read(64)
d = put(b.deposit(), L['deposit_page'], FAKE.encode() + b"\\0")
try:
  {spoil}
  admitted = attempt(lambda: a.admit([a.deposit(), d]))
  arrived = attempt(lambda: a.arrive(0.2)) if "ok" in admitted else None  # reads the page: a SIGBUS would kill us
finally:
  if os.path.lexists(page_path(FAKE)):
    os.unlink(page_path(FAKE))
done({{"admitted": admitted, "arrived": arrived}})
""")
  assert "error" in r["admitted"], r
  assert r["admitted"]["error"].startswith("RuntimeError: test rank 0: "), r
  assert "peer rank 1 (device 11" in r["admitted"]["error"], r
  assert message in r["admitted"]["error"], r


def test_rank_numbers_and_counts_a_peer_writes_are_bounded():
  r = host("""
a, b = rank(0), rank(1)
a.admit([a.deposit(), b.deposit()]); b.admit([a.deposit(), b.deposit()])
out = {}
# A peer that 'gave up' naming a rank far outside the clique: once an index (a heap overflow).
poke(a.page_name, L['page_arrived'], 7); poke(a.page_name, L['page_broken_by'], 1 << 40)
out["broken_by"] = attempt(lambda: a.arrive(0.5))
c, d = rank(0), rank(1)
c.admit([c.deposit(), d.deposit()])
poke(c.page_name, L['page_arrived'], 7); poke(c.page_name, L['page_broken_by'], 2)
out["broken_by_in_range"] = attempt(lambda: c.arrive(0.5))
e, f = rank(0), rank(1)
e.admit([e.deposit(), f.deposit()])
poke(f.page_name, L['page_arrived'], 1000)  # a peer far ahead of us: not in step
out["ahead"] = attempt(lambda: e.arrive(0.5))
done(out)
""")
  assert r["broken_by"]["error"].startswith("RuntimeError: test rank 0: a peer rank (the flag page names rank "
                                            "1099511627775, which is no peer of rank 0 in this clique of 2)"), r
  assert "gave up waiting for rank 0" in r["broken_by"]["error"], r
  assert "peer rank 1 (device 11, process id " in r["broken_by_in_range"]["error"], r
  assert "peer rank 1 (device 11, process id " in r["ahead"]["error"], r
  assert "claims to have reached execution 1000 while rank 0 is at 1" in r["ahead"]["error"], r


def test_a_forged_pid_or_token_never_makes_a_foreign_address_ours():
  r = host("""
a, b = rank(0), rank(1)
genuine = b.deposit()
out = {}
# Our pid but another token: another process (another pid namespace, or a liar): never the raw address.
other = os.urandom(L['token_bytes'])
FAKE = "/jmf-" + os.urandom(16).hex()
with open(page_path(b.page_name), "rb") as f:
  header = f.read(64)
craft(FAKE, put(header, L['page_token'], other), size=L['page_bytes'])
d = put(put(put(genuine, L['deposit_pid'], os.getpid().to_bytes(8, "little")), L['deposit_token'], other),
        L['deposit_page'], FAKE.encode() + b"\\0")
out["our pid"] = attempt(lambda: rank(0).admit([a.deposit(), d]))
os.unlink(page_path(FAKE))
# Our token (it travels in every deposit) but an address that is no workspace of ours.
d = put(genuine, L['deposit_address'], (0xdead0000).to_bytes(8, "little"))
out["our token"] = attempt(lambda: rank(0).admit([a.deposit(), d]))
done(out)
""")
  assert r["our pid"] == {"ok": ["self", "other process"]}, r
  assert r["our token"]["error"].startswith("RuntimeError: test rank 0: peer rank 1 (device 11, process id "), r
  assert "claims to be this process" in r["our token"]["error"] and "refused" in r["our token"]["error"], r


def test_a_stale_page_of_a_dead_process_is_removed_and_live_or_foreign_ones_kept():
  make = HOST + "r = rank(0)\nprint(r.page_name, flush=True)\n"
  dead = fresh_process.run(make + "os.kill(os.getpid(), 9)\n", env=CPU_ONLY, check=False)
  assert dead.returncode == -9, dead.stderr[-2000:]
  dead_page = "/dev/shm" + dead.stdout.split()[0]
  assert os.path.exists(dead_page)  # what a crash during set-up leaves
  live = fresh_process.start(make + "import time\ntime.sleep(60)\n", env=CPU_ONLY)
  foreign = None
  try:
    live_page = "/dev/shm" + live.stdout.readline().split()[0]
    if os.geteuid() == 0:
      foreign = "/dev/shm/jmf-" + os.urandom(16).hex()
      with open(foreign, "wb") as f:
        f.write(bytes(4096))
      os.chown(foreign, 65534, 65534)
    r = host("""
page = rank(0).page_name
done({"page": page})
""")
    assert r["page"] and not os.path.exists(dead_page)
    assert os.path.exists(live_page)  # its creator is alive and holds it
    assert foreign is None or os.path.exists(foreign)  # not ours to judge
  finally:
    live.kill()
    live.wait()
    for path in (dead_page, foreign):
      if path and os.path.exists(path):
        os.unlink(path)


def test_a_name_taken_in_advance_does_not_stop_the_next_run():
  # The names used to be jmf-<pid>-<n>: a restart with the same pid, or a local user who created the
  # name first, got "File exists" forever. Names are random now; the ones a pid suggests do not matter.
  r = host("""
taken = [page_path(f"/jmf-{os.getpid()}-{n}") for n in range(4)]
for path in taken:
  craft(path[len("/dev/shm"):])
try:
  out = attempt(lambda: rank(0).page_name)
finally:
  for path in taken:
    os.unlink(path)
done(out)
""")
  assert "ok" in r and r["ok"].startswith("/jmf-"), r


# --- kernels, two processes on one GPU --------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("xla_flags", ["", "--xla_gpu_enable_command_buffer="], ids=["cmdbuf_on", "cmdbuf_off"])
def test_all_reduce_and_all_gather_across_two_processes(xla_flags):
  seed = int.from_bytes(os.urandom(4), "little")
  results = outcomes("correct", seed, env={**GPU, "XLA_FLAGS": xla_flags})
  for r in results:
    assert "crash" not in r, r.get("crash")
    assert all(r["checks"].values()), (seed, r["checks"])
    assert r["iterations"]["wrong"] == 0, (seed, r["iterations"])
    cycles = r["cycles"]
    assert cycles["wrong"] == 0, (seed, cycles)
    # Every cycle's workspace, peer mapping and flag page is gone with its executable.
    assert cycles["after"] == cycles["before"], cycles
    assert cycles["peak"] == cycles["before"]["live_workspaces"] + 1, cycles
    assert cycles["shm_files"] == 0, cycles


@pytest.mark.gpu
@pytest.mark.exclusive
def test_a_stalled_peer_gives_an_error_naming_it_and_the_call_recovers_once_it_is_back():
  stalled = outcomes("stall", env={**GPU, "JAX_MOSAIC_FFI_PEER_TIMEOUT_S": "3"})
  waiting, sleeper = stalled
  assert "crash" not in waiting and "crash" not in sleeper, stalled
  assert waiting["ok_iterations"][:3] == [0, 1, 2] and waiting["errors"][0]["iteration"] == 3, waiting
  first = waiting["errors"][0]
  assert "waited 3 s for peer rank 1 (device " in first["error"] and "never did" in first["error"], first
  assert 2.5 < first["seconds"] < 20, first
  # The sleeper wakes to find that its peer gave up, and fails too instead of waiting in turn.
  assert sleeper["errors"][0]["iteration"] == 3 and "gave up" in sleeper["errors"][0]["error"], sleeper
  # While it slept, the waiting rank's attempt to meet again timed out; then both meet, and the same compiled
  # call works again on both (no recompile, no restart).
  assert "meeting the peers again after a timeout" in waiting["errors"][1]["error"], waiting
  assert waiting["ok_iterations"] == sleeper["ok_iterations"] == [0, 1, 2, 5, 6, 7, 8, 9], stalled


@pytest.mark.gpu
def test_a_peer_that_exits_gives_an_error_not_a_hang():
  r = survivor("exit", env={**GPU, "JAX_MOSAIC_FFI_PEER_TIMEOUT_S": "3"})
  assert "crash" not in r, r
  assert r["ok"] == 3 and r["errors"][0]["iteration"] == 3, r
  assert "peer rank 1 (device " in r["errors"][0]["error"], r
