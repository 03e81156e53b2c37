"""python -m jax_mosaic_ffi.pack: make, inspect and combine kernel packs (docs/guides/deploying.md).

    record OUT --arch sm_90,sm_100a [--tuning FILE ...] [--alias-winners TARGET=SOURCE,...] [--keep-going]
           -- python train_step.py ...
    build OUT RECORDING... [--tuning FILE ...] [--alias-winners TARGET=SOURCE,...]
    list PACK [--json]
    check PACK --fleet sm_90,sm_100,sm_103 [--gpus "NVIDIA H200,NVIDIA B200"] [--environment] [-- python serve.py]
    merge OUT PACK PACK...
    prune OUT PACK --arch sm_90,...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from jax_mosaic_ffi import api
from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.errors import PackError
from jax_mosaic_ffi.base.module_format import Arch
from jax_mosaic_ffi.pack import build as build_lib
from jax_mosaic_ffi.pack import contents
from jax_mosaic_ffi.pack import fleet
from jax_mosaic_ffi.pack import merge
from jax_mosaic_ffi.pack import recordings
from jax_mosaic_ffi.transforms import tuning_files


def _archs(text: str) -> list[Arch]:
  archs = []
  for part in filter(None, (p.strip() for p in text.split(","))):
    try:
      archs.append(Arch.parse(part))
    except ValueError as e:
      raise SystemExit(f"--arch: {e}") from None
  if not archs:
    raise SystemExit("--arch names at least one GPU arch: --arch sm_90,sm_100")
  return archs


def _tuning(paths) -> list:
  found = []
  for path in paths or ():
    try:
      env, timings = tuning_files.read_file(path)
    except ValueError as e:
      raise SystemExit(f"--tuning {path} cannot be used: {e}") from None
    found.append((path, env, timings))
  return found


def _built(recording: recordings.Recording, args) -> build_lib.Built:
  """The pack of ``recording`` with the tuning files and winner aliases ``args`` names."""
  try:
    return build_lib.build(recording, _tuning(args.tuning), build_lib.parse_aliases(args.alias_winners or ()))
  except ValueError as e:
    raise SystemExit(f"--alias-winners: {e}") from None


def _write(out: str, built: build_lib.Built) -> None:
  digest = pack_file.write(out, built.entries, built.created, built.notes)
  kinds = {k: sum(e.kind == k for e in built.entries) for k in pack_file.KINDS}
  print(f"wrote {out}: {kinds['compile']} compiles, {kinds['specialization']} Triton specializations, "
        f"{kinds['tuning']} autotuning timings ({len(built.notes['winners'])} winners); sha256 {digest}")
  for name, title in (("untuned", "without a winner"), ("refused", "refused")):
    for note in built.notes.get(name, ()):
      what = (f"{contents.shown(note.get('front_end'))} '{contents.shown(note.get('kernel'))}' for "
              f"{contents.shown(note.get('targets'))}" if name == "refused" else
              f"autotuned {contents.shown(note.get('name'))} {contents.shown(note.get('shapes'))} on "
              f"{contents.shown(note.get('device') or note.get('recorded_for'))}")
      print(f"  {title}: {what}: {contents.shown(contents.first_line(note.get('why') or note.get('error')))}")
  for note in built.notes.get("winners", ()):
    if note.get("aliased_from"):  # asked for, and said: a winner measured on another model
      print(f"  aliased: autotuned {contents.shown(note.get('name'))} {contents.shown(note.get('shapes'))} on "
            f"{contents.shown(note.get('device'))} takes the winner measured on "
            f"{contents.shown(note['aliased_from'])}")


def _program(command: list[str]) -> list[str]:
  """The program to record: ``python`` (or ``python3``) is this interpreter, the venv the command runs in, not the
  first on PATH (which may be another venv's, without the program's packages or this one)."""
  return [sys.executable, *command[1:]] if command[0] in ("python", "python3") else command


def _environment() -> dict[str, list[str]]:
  """The keyed settings this environment sets, by front end as its entries name it (each front end's
  ``settings``: Triton's only where Triton is installed)."""
  return {name: found for front_end in api.FRONT_ENDS for name, found in front_end.settings().items()}


def _run(command: list[str], target: str, run_dir: str, recording: recordings.Recording,
         packs: str | None = None) -> int:
  """Runs ``command`` on the CPU as a GPU of ``target`` builds, recording every compile it uses into ``recording``
  (with ``packs`` in use, if given); returns its exit status."""
  # Its kernels compile when their calls are traced, for this arch's GPUs.
  env = dict(os.environ, **{flags.PACK_RECORD: run_dir, flags.TARGETS: target, "JAX_PLATFORMS": "cpu"})
  env.pop(flags.PACKS_STRICT, None)
  if packs is not None:
    env[flags.PACKS] = packs
  code = subprocess.run(command, env=env).returncode
  if os.path.isdir(run_dir):
    recordings.read(run_dir, recording)
  return code


def _program_misses(path: str, pack: pack_file.Pack, capabilities: list[int], command: list[str]) -> list[str]:
  """Every compile the program uses on each GPU of the fleet that ``pack`` does not hold, in one run per GPU."""
  misses = []
  folder = tempfile.mkdtemp(prefix="jmf-pack-check-")
  try:
    for capability in capabilities:
      # Run as a node of that GPU runs: keyed by its arch, the store reaching the targets that serve it.
      print(f"running for sm_{capability}: {' '.join(command)}", flush=True)
      recording = recordings.Recording()
      code = _run(command, f"sm_{capability}", os.path.join(folder, f"sm_{capability}"), recording,
                  packs=os.path.abspath(path))
      misses += [f"sm_{capability}: the program exited with status {code}"] if code != 0 else []
      misses += [f"sm_{capability}: {miss}" for miss in fleet.misses(pack, recording)]
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  return misses


def record(args) -> int:
  if not args.command:
    raise SystemExit("record runs a program: put it after --, e.g. ... --arch sm_90 -- python train_step.py")
  _built(recordings.Recording(), args)  # the tuning files and aliases checked before anything runs
  command = _program(args.command)
  folder = tempfile.mkdtemp(prefix="jmf-pack-record-")
  failed = []
  try:
    recording = recordings.Recording()
    for arch in _archs(args.arch):
      # A family target is kept (nodes set it as their targets); sm_90a is recorded as its GPU (sm_90) would build.
      gpu = arch.sm if arch.suffix == "f" else f"sm_{arch.number}"
      note = f" (kernels without targets= are built as on a {gpu} GPU)" if arch.suffix == "a" else ""
      print(f"recording for {gpu}{note}: {' '.join(args.command)}", flush=True)
      code = _run(command, gpu, os.path.join(folder, gpu), recording)
      if code != 0:
        failed.append(gpu)
        print(f"{gpu}: the program exited with status {code}; what it compiled before is recorded, the rest is not",
              file=sys.stderr)
    if not recording.entries and not recording.failed:
      print(f"error: {' '.join(command)} compiled no kernel for {', '.join(a.sm for a in _archs(args.arch))}, so "
            f"no pack was written: run the program that calls your kernels (its jitted steps must run or lower)",
            file=sys.stderr)
      return 1
    _write(args.out, _built(recording, args))
  finally:
    if args.keep_recording:
      print(f"the recording is in {folder}")
    else:
      shutil.rmtree(folder, ignore_errors=True)
  return 1 if failed and not args.keep_going else 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jax_mosaic_ffi.pack", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="action", required=True)
  rec = sub.add_parser("record", usage="%(prog)s OUT --arch ARCHS [--tuning FILE ...] -- PROGRAM [ARGS ...]",
                       help="run a program once per arch (on the CPU), recording every kernel it compiles, and build "
                            "the pack")
  rec.add_argument("out", help="the pack to write (model.jmfpack)")
  rec.add_argument("--arch", required=True, help="the GPUs to build for, comma-separated: sm_90,sm_100a,sm_120")
  rec.add_argument("--tuning", action="append", help="a tuning file (jmf.save_tuning) measured on one GPU model: its "
                                                      "winners go into the pack; repeat for each model")
  rec.add_argument("--alias-winners", action="append",
                   help="GPU models that take another model's winners, asked for by name (never done otherwise): "
                        "TARGET=SOURCE, comma-separated, e.g. \"NVIDIA H100 PCIe=NVIDIA H100 80GB HBM3\"; "
                        "MODEL@10.3=SOURCE for a model of another compute capability that runs a family target")
  rec.add_argument("--keep-going", action="store_true", help="exit 0 even where the program failed for an arch")
  rec.add_argument("--keep-recording", action="store_true", help="keep the recording folder and print where it is")
  bld = sub.add_parser("build", help=f"build a pack from folders recorded with {flags.PACK_RECORD}=DIR")
  bld.add_argument("out")
  bld.add_argument("recordings", nargs="+")
  bld.add_argument("--tuning", action="append")
  bld.add_argument("--alias-winners", action="append", help="as record's")
  lst = sub.add_parser("list", help="what a pack holds")
  lst.add_argument("pack")
  lst.add_argument("--json", action="store_true")
  chk = sub.add_parser("check", usage="%(prog)s PACK --fleet ARCHS [--gpus MODELS] [--environment] "
                                      "[-- PROGRAM [ARGS ...]]",
                       help="how each GPU of a fleet would be served (no GPU needed): exit 1 on anything a node would "
                            "compile, JIT or time; run it in CI. With a program after --, every compile it uses on "
                            "each GPU that the pack lacks, in one go")
  chk.add_argument("pack")
  chk.add_argument("--fleet", required=True, help="the fleet's GPU archs, comma-separated: sm_90,sm_100,sm_103")
  chk.add_argument("--gpus", default="", help="the fleet's GPU models as jax names them (device_kind), "
                                              "comma-separated: every autotuned call needs a winner for each")
  chk.add_argument("--environment", action="store_true", help="compare the keyed settings of this environment (run "
                   "it with the nodes' environment) with those the pack's kernels were compiled under")
  mrg = sub.add_parser("merge", help="packs into one")
  mrg.add_argument("out")
  mrg.add_argument("packs", nargs="+")
  prn = sub.add_parser("prune", help="keep only the entries for some archs")
  prn.add_argument("out")
  prn.add_argument("pack")
  prn.add_argument("--arch", required=True, help="the GPUs to keep, comma-separated")
  argv = list(sys.argv[1:] if argv is None else argv)
  command = argv[argv.index("--") + 1:] if "--" in argv else []  # record's program, after --
  args = parser.parse_args(argv[:len(argv) - len(command) - 1] if "--" in argv else argv)
  args.command = command
  try:
    if args.action == "record":
      return record(args)
    if args.action == "build":
      recording = recordings.Recording()
      for folder in args.recordings:
        recordings.read(folder, recording)
      _write(args.out, _built(recording, args))
    elif args.action == "list":
      pack = pack_file.read(args.pack)
      print(json.dumps(contents.as_json(pack), indent=1) if args.json else contents.listing(pack))
    elif args.action == "check":
      try:
        capabilities = fleet.parse_fleet(args.fleet)
      except ValueError as e:
        raise SystemExit(f"--fleet: {e}") from None
      pack = pack_file.read(args.pack)
      report, problems = fleet.check(pack, capabilities, [g.strip() for g in args.gpus.split(",") if g.strip()],
                                     _environment() if args.environment else None)
      misses = _program_misses(args.pack, pack, capabilities, _program(args.command)) if args.command else []
      print("\n".join([report, *(f"  PROBLEM: {miss}" for miss in misses)]))
      if args.command:
        print(f"{len(misses)} compile{'s' if len(misses) != 1 else ''} of {' '.join(args.command)} not in the pack")
      return 1 if problems or misses else 0
    elif args.action == "merge":
      found = merge.merged([pack_file.read(p) for p in args.packs])
      _write(args.out, build_lib.Built(found.entries, found.notes, found.created))
      for conflict in found.conflicts:
        print(f"  conflict: {conflict}")
    else:
      entries, notes, created = contents.pruned(pack_file.read(args.pack), [a.sm for a in _archs(args.arch)])
      _write(args.out, build_lib.Built(entries, notes, created))
    sys.stdout.flush()  # here, where a reader that stopped (BrokenPipeError) is caught
  except PackError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except BrokenPipeError:  # the reader stopped (list --json | head): nothing more to say, and no traceback
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
