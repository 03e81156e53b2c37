"""The front-end protocol: what a wing (cuda/, triton/, cute/) provides, as one `FrontEnd` (docs/architecture.md).

A wing provides its kernel types, its own options object (the keywords of `mosaic_kernel` it takes beyond the
shared `LaunchOptions`, as Pallas's backends take their own compiler params), the module image kinds it emits,
and a launcher that resolves one `CheckedLaunch` per traced call and binds it with `primitive.kernel_call`. It
gets the rest for free: `mosaic_kernel` picks it by kernel type (api.py's table), and the compile cache, export,
vmap, gradients, sharding, fallback, autotuning and the runtime treat its launches as every other. What its kernels
need beyond the launch, it names here too: the native libraries the runtime opens for its images
(`RuntimeLibrary`), the toolchains whose releases an autotuning timing depends on, and the keyed settings its
compiles depend on (`FrontEnd.settings`, which the pack CLI reads: it imports no wing). api.py hands this module
the front ends (`install`), and the shared layers ask it for them (`installed`): they import no wing.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.call import launch_values


@dataclasses.dataclass(frozen=True)
class RuntimeLibrary:
  """A native library, not ours, that the runtime opens to run images of some kinds (call/runtime_libraries.py).

  Registering the targets publishes where it is: a process that only deserializes a jax.export artifact lowers
  none of the kernels that need it before their instantiate. A failure to find it stops only those kernels.

  Attributes:
    name: the library's file name (its key in ``jmf.registration.status()["runtime_libraries"]``).
    description: the library, as messages name it ("NVIDIA's CuTe DSL runtime library").
    kernels: the kernels that need it, as messages name them ("CuTe DSL kernels").
    image_kinds: the module images that need it (base/module_format.py's `ImageKind`).
    publish: ``() -> None``: finds it, without importing its front end's compiler, and tells the runtime where
      it is; nothing where it is not installed (its kernels are refused where they compile); raises where
      finding it fails.
    refuse: ``(message) -> None``: tells the runtime why it could not be found, for the instantiate of a call
      that needs it.
    remedy: what to do where finding it failed, for messages.
    unavailable: the error raised at the lowering of a kernel that needs it where finding it failed.
  """

  name: str
  description: str
  kernels: str
  image_kinds: tuple[ImageKind, ...]
  publish: Callable[[], None]
  refuse: Callable[[str], None]
  remedy: str
  unavailable: type[Exception]


@dataclasses.dataclass(frozen=True)
class FrontEnd:
  """One wing, as `mosaic_kernel` sees it.

  Attributes:
    name: its kernels, as messages name them ("a Triton kernel").
    kernel_types: the types of kernel it launches (`mosaic_kernel` picks the front end of the nearest one).
    makers: the public functions that make its kernels, for messages.
    options: its options object: a frozen dataclass whose fields are the keywords of `mosaic_kernel` it takes
      beyond `LaunchOptions`, with their defaults.
    image_kinds: the module images its kernels hold (base/module_format.py's `ImageKind`): a module of its with
      another is refused at lowering (`check_images`).
    launcher: ``(kernel, out_shape, launch: LaunchOptions, options, meta=None) -> call``: the function of
      arrays that launches the kernel, resolving one `CheckedLaunch` per traced call; ``meta``: one autotuning
      config's values (the kernel's constexprs, or what its launch's callables get), None without configs.
    check_tunable: ``(kernel, made, configs) -> None``: raises ValueError, naming what to do, where
      ``configs=`` (or ``autotune_key=`` / ``autotune_default=``) cannot apply to the kernel.
    hints: for keywords of another front end that this one does not take, what to do instead (optional: any
      other is refused by name all the same).
    runtime_libraries: the native libraries the runtime opens for its images (optional).
    toolchains: ``() -> {distribution: release}``: the releases of the toolchains that compile its kernels
      ("none" where one is not installed), read without importing them: part of an autotuning timing's
      environment (optional).
    compilers: the names its compiles are counted under (``compile_cache.count_compiles``), each a key of
      `kernel_cache_stats().compiles` (optional: a wing built on another counts under that one's).
    settings: ``() -> {front end as its entries name it: ["NAME=value", ...]}``: the keyed settings of the
      environment its compiles depend on that are set here ("Triton": its knobs' variables), read without
      compiling; ``pack check --environment`` compares a node's with those a pack's entries were made under
      (optional).
  """

  name: str
  kernel_types: tuple[type, ...]
  makers: tuple[str, ...]
  options: type
  image_kinds: tuple[ImageKind, ...]
  launcher: Callable[..., Callable]
  check_tunable: Callable[[Any, str, Any], None] = lambda kernel, made, configs: None
  hints: Mapping[str, str] = dataclasses.field(default_factory=dict)
  runtime_libraries: tuple[RuntimeLibrary, ...] = ()
  toolchains: Callable[[], Mapping[str, str]] = dict
  compilers: tuple[str, ...] = ()
  settings: Callable[[], Mapping[str, list[str]]] = dict

  def options_of(self, given: Mapping[str, Any], defaults: Mapping[str, Any], made: str):
    """Its options object from `mosaic_kernel`'s front-end keywords ``given``. A keyword it does not take is
    refused by name, unless left at its default (``defaults``: each keyword's, where a front end takes it)."""
    own = {field.name for field in dataclasses.fields(self.options)}
    for name, value in given.items():
      if name not in own and not launch_values.left_out(value, defaults.get(name)):
        why = self.hints.get(name, f"it has no meaning for {self.name} yet")
        raise LaunchError(f"{made}: {self.name} takes no {name}: {why}")
    return self.options(**{name: value for name, value in given.items() if name in own})


# The front ends, as api.py installs them (its FRONT_ENDS): the shared layers read their runtime libraries and
# toolchains here, below every wing.
_installed: tuple[FrontEnd, ...] = ()
_by_type: dict[type, FrontEnd] = {}


def install(front_ends: tuple[FrontEnd, ...]) -> None:
  """Makes ``front_ends`` the ones `installed` returns: api.py calls it at import, before anything is lowered."""
  global _installed
  _installed = tuple(front_ends)
  _by_type.clear()
  _by_type.update((kernel_type, f) for f in _installed for kernel_type in f.kernel_types)


def installed() -> tuple[FrontEnd, ...]:
  """The front ends api.py installed."""
  return _installed


def of(kernel) -> FrontEnd | None:
  """The front end that launches ``kernel``: that of the nearest of its types in its class's order, or None."""
  for kernel_type in type(kernel).__mro__:
    if kernel_type in _by_type:
      return _by_type[kernel_type]
  return None


def check_images(kernel, parsed, made: str) -> None:
  """LaunchError where a compiled module holds an image kind its front end does not declare (`FrontEnd.image_kinds`):
  the runtime would run it under another front end's rules. A kernel of no front end (one the package launches
  itself) is not asked."""
  front_end = of(kernel)
  kinds = {image.kind for image in parsed.images}
  if front_end is not None and not kinds <= set(front_end.image_kinds):
    odd = ", ".join(sorted(k.name for k in kinds - set(front_end.image_kinds)))
    raise LaunchError(f"{made}: {front_end.name}'s module holds {odd} images, which its front end does not declare "
                      f"(it emits {', '.join(k.name for k in front_end.image_kinds)}): a front end's bug, not yours; "
                      "please report it")


def check_defines(kernel, made: str) -> None:
  """LaunchError where the module a call received does not define the kernel the call names (`Kernel.
  defines_its_name`): another kernel's entry served under this one's key (a peer process's) never runs."""
  if not kernel.defines_its_name():
    raise LaunchError(f"{made}: the module this call received defines '{kernel.symbol}', not the kernel "
                      f"'{kernel.name}' the call names: a cache entry of another kernel (from a peer process of the "
                      "job, or a damaged cache). Clear the caches (jmf.clear_kernel_cache(disk=True)) and run "
                      "again; please report it")
