"""A CuTe DSL kernel's compile options (``cute_kernel(compile_options=...)``): the ``cute.compile`` options a
launcher may pass, checked before anything compiles."""

from __future__ import annotations

import shlex

from jax_mosaic_ffi.base.errors import LaunchError

# cute.compile options a launcher may not set, each with why and what instead: the target is ours to choose per
# image (the module names it), and the runtime runs x86-64 objects of the DSL's C calling convention.
_REFUSED_OPTIONS = {
    "gpu-arch": "the targets come from targets= (each image is labelled with the arch it was compiled for)",
    "host-target": "the object must be x86-64 host code, which the runtime links into this process",
    "enable-tvm-ffi": "the runtime calls the object's host function by the DSL's own calling convention",
}


def checked_options(options, made: str) -> str | None:
  """``compile_options`` as given, or LaunchError naming one that retargets the compile. The DSL reads them with
  argparse, which takes any unambiguous prefix of a flag (``--gpu`` is ``--gpu-arch``) and ``--flag=value``."""
  if options is None:
    return None
  if not isinstance(options, str):
    raise LaunchError(f"{made}: compile_options must be a string of cute.compile options, got {options!r}")
  try:
    tokens = shlex.split(options)
  except ValueError as e:
    raise LaunchError(f"{made}: compile_options={options!r} cannot be read as options ({e})") from None
  for token in tokens:
    name = token[2:].split("=", 1)[0] if token.startswith("--") else None
    for flag, why in _REFUSED_OPTIONS.items():
      if name and flag.startswith(name):
        raise LaunchError(f"{made}: compile_options={options!r} sets --{flag}, which jax_mosaic_ffi does not "
                          f"take: {why}. Leave it out" + (" and pass targets=('sm_100a',) (or the archs you "
                                                            "need)" if flag == "gpu-arch" else ""))
  return options
