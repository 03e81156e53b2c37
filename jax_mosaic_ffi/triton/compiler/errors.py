"""What a Triton (or Gluon) compile that did not give a kernel says, each naming the kernel, its config and target:
`failed` (Triton's own failure), `refused` (what it gave that we cannot launch), `timed_out` (past
``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``), `died` (its process crashed) and `too_large` (a tensor over the target's
bound, bounds.py)."""

from __future__ import annotations

from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import CompileError, CompileTimeout
from jax_mosaic_ffi.triton.compiler import stages as triton_stages
from jax_mosaic_ffi.triton.compiler import bounds
from jax_mosaic_ffi.triton.compiler import error_lines
from jax_mosaic_ffi.triton.compiler.languages import Language
from jax_mosaic_ffi.triton.compiler.options import TritonOptions


def config_text(signature, constexprs, options: TritonOptions) -> str:
  """A Triton compile's config, as a failure names it: each option once (a constexpr parameter named like a launch
  option, as Gluon's ``num_warps: gl.constexpr``, holds the option's value and is named with the options)."""
  meta = options.meta()
  launch = ", ".join(f"{k}={v}" for k, v in meta.items())
  values = ", ".join(f"{k}={v!r}" for k, v in [*options.backend_options, *constexprs.items()]
                     if k not in meta or repr(meta[k]) != repr(v))
  return f"{launch}{', ' + values if values else ''}; signature ({', '.join(map(str, signature))})"


def failed(fn, target, config: str, language: Language, e: Exception, diagnostics: str = "") -> CompileError:
  """Triton's own failure: its message (and what its passes printed, `diagnostics`), for this config, with the
  lines of the user's file it names (error_lines.py) and the language's advice."""
  log = f"{type(e).__name__}: {e}".rstrip()
  if diagnostics.strip():
    log += f"\n{diagnostics.rstrip()}"
  return CompileError(fn.__name__, log, "", "", compiler="Triton",
                      what=f"kernel '{fn.__name__}' for {target.sm} with {config}{_called_at()}",
                      advice=language.advice(e), excerpts=error_lines.excerpts(fn, e, log))


def refused(fn, log: str) -> CompileError:
  """What a Triton compile gave that we cannot launch."""
  return CompileError(fn.__name__, log, "", "", compiler="Triton", what=f"kernel '{fn.__name__}'{_called_at()}")


def timed_out(fn, targets, config: str, language: Language, bound: float, stage: str) -> CompileTimeout:
  """A compile stopped at its deadline, its process killed; ``stage``: the last one it reported (stages.py)."""
  log = (f"the compile ran past {compile_timeout.describe(bound)} seconds in "
         f"{triton_stages.described(stage, language.name)}, and its process was killed")
  return CompileTimeout(fn.__name__, log, "", "", compiler="Triton",
                        what=f"kernel '{fn.__name__}' for {_targets(targets)} with {config}{_called_at()}",
                        advice=("a compile's time grows with the elements each thread holds and with the code "
                                "unrolled (tl.static_range): use smaller blocks (the constexprs that size them), "
                                "more num_warps or a loop that is not unrolled; or raise "
                                f"{compile_timeout.ENV} (0: no bound)"))


def died(fn, targets, config: str, language: Language, how: str, stage: str) -> CompileError:
  """A compile whose process ended without an answer (a crash of Triton's native code), in ``stage``."""
  return CompileError(fn.__name__, f"the compile's process ended ({how}) in "
                      f"{triton_stages.described(stage, language.name)}, without a result; this process is "
                      "unharmed", "", "", compiler="Triton",
                      what=f"kernel '{fn.__name__}' for {_targets(targets)} with {config}{_called_at()}",
                      advice=f"a crash of {language.name}'s compiler (or of code the kernel's trace ran): report it "
                             f"to {language.name} with the kernel and this config")


def _called_at() -> str:
  """The user's line that made the kernel (or called it, for a kernel compiled where a call is traced), as CuTe
  DSL's compile errors name it."""
  return f" (called at {source_location.current()})"


def _targets(targets) -> str:
  return ", ".join(t.sm for t in targets)


def too_large(fn, target, config: str, language: Language,
              oversized: bounds.OversizedTensor) -> bounds.TensorTooLarge:
  """A kernel refused before Triton's stages ran: a tensor over the target's bound."""
  tensor, bound = oversized.tensor, oversized.bound
  smem = bound // 1024 // bounds.HEADROOM - bounds.REGISTER_FILE_KIB
  message = (f"{language.maker} '{fn.__name__}' for {target.sm} with {config}{_called_at()}: its tensor "
             f"{tensor.describe()} is more than a CTA can hold on {target.sm}, at most {bound // 1024} KiB a tensor "
             f"(twice an SM's {bounds.REGISTER_FILE_KIB} KiB of registers and {smem} KiB of shared memory). It was "
             "refused before compiling, as ptxas would work on it for minutes: use smaller blocks (the constexprs that "
             "size this tensor), looping over the rest in the kernel or launching more programs")
  return bounds.TensorTooLarge(fn.__name__, message, tensor, bound)
