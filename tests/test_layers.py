"""The layer rule's contract (pyproject.toml, import-linter) covers the whole package: every subpackage and
top-level module of jax_mosaic_ffi is in one of its layers, so a new folder cannot sit outside the rule unchecked."""

import pathlib
import tomllib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jax_mosaic_ffi"
PYPROJECT = PACKAGE.parent / "pyproject.toml"
# Not code that imports: the package's own __init__ (it re-exports every layer), its version, the C++ headers.
OUTSIDE = {"__init__", "_version", "include"}


def layers() -> list[set[str]]:
  contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
  (contract,) = [c for c in contracts if c["type"] == "layers"]
  return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def test_every_subpackage_and_module_is_in_one_layer():
  parts = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py")} | {"include"}
  placed = [name for layer in layers() for name in layer]
  assert len(placed) == len(set(placed)), f"a name in two layers: {placed}"
  missing = sorted(parts - set(placed) - OUTSIDE)
  assert not missing, (f"{missing} in no layer of pyproject.toml's import-linter contract: put each in the layer "
                       "its imports allow (CONTRIBUTING.md, the layer rule)")
  assert not set(placed) - parts, f"layers name what is not there: {sorted(set(placed) - parts)}"


def _imports(path: pathlib.Path) -> set[str]:
  import ast
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    elif isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
  return found


def test_the_rooms_below_call_import_nothing_of_call_above_them():
  """call/peers/ (the Python side of csrc/peers/) and call/comparison/ stand on base alone: the rest of call/ calls
  into them, never the other way round, so each can be read (and replaced) by itself."""
  for room in ("peers", "comparison"):
    folder = PACKAGE / "call" / room
    for module in folder.glob("*.py"):
      above = sorted(name for name in _imports(module) if name.startswith("jax_mosaic_ffi.call")
                     and not name.startswith(f"jax_mosaic_ffi.call.{room}"))
      assert not above, f"{module.relative_to(PACKAGE.parent)} imports {above}, outside call/{room}/"


# Each wing's compiler room, and the wing it stands under (gluon's room builds on Triton's, so Triton's launch half
# is off its limits too).
COMPILER_ROOMS = {"cuda.nvrtc": ("cuda",), "triton.compiler": ("triton",), "cute.compiler": ("cute",),
                  "gluon.compiler": ("gluon", "triton"), "cutile.compiler": ("cutile",)}


def _launch_half(wing: str) -> set[str]:
  """The modules of a wing outside any compiler room: its launch half."""
  folder = PACKAGE / wing
  rooms = {room.split(".", 1)[1] for room in COMPILER_ROOMS if room.startswith(wing + ".")}
  found = {f"jax_mosaic_ffi.{wing}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
  found |= {f"jax_mosaic_ffi.{wing}.{p.name}" for p in folder.iterdir()
            if p.is_dir() and (p / "__init__.py").exists() and p.name not in rooms}
  return found


def test_every_compiler_room_is_kept_off_its_wings_launch_half():
  """pyproject.toml's forbidden contract of each compiler room names every module of its wing's launch half (a
  module added there is covered by adding it to the list), and call, transforms and api: the room turns a kernel
  into a Kernel on toolchain and base alone (CONTRIBUTING.md, "One floor plan for every wing")."""
  contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
  for room, wings in COMPILER_ROOMS.items():
    assert (PACKAGE / room.replace(".", "/") / "__init__.py").exists(), f"no compiler room {room}"
    (contract,) = [c for c in contracts if c["type"] == "forbidden"
                   and c["source_modules"] == [f"jax_mosaic_ffi.{room}"]]
    wanted = set().union(*(_launch_half(w) for w in wings)) | {
        f"jax_mosaic_ffi.{name}" for name in ("call", "transforms", "api")}
    missing = sorted(wanted - set(contract["forbidden_modules"]))
    assert not missing, f"pyproject.toml: the contract of {room} does not forbid {missing}"
