"""`check`: a function of kernels against its reference on fresh random inputs: outputs, jit against eager, vmap
against a loop, VJP and JVP against autodiff of the reference, over several shapes and dtypes; each kernel call
against its own fallback on the inputs it got, so that a mismatch names the kernel that made it.

Each case (check_cases.py) runs these programs, each freshly traced, lowered and compiled:

  outputs      jit(fn)            under the shadow mode (call/comparison/shadow.py): each kernel call compared
               jit(reference)     the user's reference, or fn with fallbacks for kernels (reference.py)
  jit vs eager fn, eagerly        each primitive on its own
  vmap vs loop jit(vmap(fn))      against jit(fn) per element (shadow mode on: the batched calls' own rows)
  VJP, JVP     jit(vjp / jvp fn)  against autodiff of the reference (shadow mode on: backward kernels too)
  rules        each derivative rule around kernels against autodiff of its own fallbacks, when a VJP or JVP
               differs: the rule that is wrong is named

Both sides run under ``jax.default_matmul_precision("highest")``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.base.errors import ReferenceMismatch, who
from jax_mosaic_ffi.call.comparison import check_report
from jax_mosaic_ffi.call.comparison import numerics
from jax_mosaic_ffi.call.comparison import shadow
from jax_mosaic_ffi.call.comparison.check_report import CheckReport, Comparison
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p
from jax_mosaic_ffi.transforms import check_cases
from jax_mosaic_ffi.transforms import reference as reference_lib
from jax_mosaic_ffi.transforms.autodiff import mosaic_linear_p


def check(fn: Callable, *example_args, reference: Callable | None = None, cast_reference: bool = False,
          shapes: Any = "edges", dtypes=None, inputs: Callable | None = None, vmap: bool = True, eager: bool = True,
          grads: bool = True, batch: int = 3, tolerances: Mapping | None = None, rtol: float | None = None,
          atol: float | None = None, seed: int | None = None, raise_on_mismatch: bool = False) -> CheckReport:
  """Checks ``fn``, a function built from kernels, against its reference on fresh random inputs.

  The reference is each kernel's ``fallback`` (``fn`` with every kernel call replaced by its fallback), or
  ``reference``. On the example arguments' shapes and dtypes, and on edges derived from them (``shapes``), it
  compares with the tolerances of each dtype (`CheckReport`'s page lists them):

  * the outputs, and each kernel call's outputs against its own fallback on the inputs it got in the program (on a
    GPU), so that a mismatch names the kernel and its call site;
  * ``jax.jit`` against eager execution, and ``jax.vmap`` against a loop of plain calls;
  * for functions with derivatives (`differentiable`), the VJP and the JVP on random cotangents and tangents
    against autodiff of the reference: a wrong hand-written gradient shows here, and the rule that is wrong is
    named.

  On a machine without a GPU the fallbacks run in the kernels' place: nothing of the kernels is checked, and the
  report's ``status`` says ``"not checked"`` (``passed`` is False), though a reference that differs still fails::

    >>> kernel = jmf.cuda_kernel('extern "C" __global__ void twice(const float* x, float* y, int n) {'
    ...                          '  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2 * x[i]; }',
    ...                          "twice")
    >>> twice = jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256), block=256,
    ...                           scalars=lambda x: (np.int32(x.size),), fallback=lambda x: 2 * x)
    >>> report = jmf.check(twice, jnp.ones(1000))                # shapes (1000,), (999,) and (1,)
    >>> report.failures, report.status in ("passed", "not checked")   # "passed" on a GPU, "not checked" here
    ([], True)
    >>> jmf.check(twice, jnp.ones(1000), reference=lambda x: 3 * x).summary()    # doctest: +ELLIPSIS
    '... comparisons differ (seed ...); the first: outputs, out (float32[1000]) ...: ... of 1000 elements differ ...'

  Args:
    fn: a function of arrays (pytrees of them) that calls kernels (or any JAX function).
    *example_args: arrays or ``jax.ShapeDtypeStruct``: the shapes and dtypes to check; their values are not used.
    reference: a function of the same arguments returning the same outputs, of the same dtypes; by default ``fn``
      with each kernel's fallback in its place. An output whose dtype is not its reference's fails its row
      (``reference_dtype``), its values not compared: a float16 result of a float32 function has lost precision,
      an int8 one wraps where int32 does not.
    cast_reference: cast the reference's outputs to the function's dtypes before comparing (and differentiate the
      reference so cast), for a reference written in a wider type on purpose: ``jmf.check(softmax_bf16, x,
      reference=lambda x: jax.nn.softmax(x.astype(jnp.float32)), cast_reference=True)``.
    shapes: ``"edges"`` (the examples' shapes, then each size changed to one no block divides and to 1, everywhere
      it occurs), ``None`` (the examples' only), or a list of cases, each a tuple of shapes (one per array
      argument). A derived case the function refuses (an error when traced) is skipped, saying why.
    dtypes: dtypes to run every case in, the floating-point arguments cast to each (default: the examples').
    inputs: ``inputs(rng, *args)`` -> the arguments, for kernels whose inputs must satisfy something (indices in
      range); ``args`` are ShapeDtypeStructs, ``rng`` a numpy Generator. Default: normal floats, integers in [0, 8).
    vmap, eager, grads: compare under ``jax.vmap`` (a batch of ``batch``), eagerly, and the derivatives.
    tolerances: ``{dtype: (rtol, atol)}`` replacing those of the table for floating-point dtypes; ``rtol`` /
      ``atol`` replace the table's for every floating-point dtype. An element passes when ``|got - want| <= atol +
      rtol * |want|`` (its own ``want``): a kernel that accumulates (a GEMM, a reduction) states an ``atol`` of
      the size of its sums' rounding. Integers and bools are compared exactly (naming one here is an error).
    seed: of the random inputs (default: fresh; the report keeps it, to replay a failure).
    raise_on_mismatch: raise `ReferenceMismatch` (carrying the report) when a comparison fails (not when nothing
      was checked).

  Returns:
    A `CheckReport`: ``status`` (``"passed"``, ``"failed"``, ``"not checked"``), ``passed``, ``failures``, and
    ``print(report)`` for the table.
  """
  seed = int.from_bytes(os.urandom(4), "little") if seed is None else int(seed)
  rng = np.random.default_rng(seed)
  checker = _Checker(fn, reference, inputs, numerics.lookup("jmf.check", tolerances, rtol, atol), rng,
                     cast_reference=bool(cast_reference))
  rows: list[Comparison] = []
  for case in check_cases.cases(example_args, shapes, dtypes):
    rows += checker.run(case, vmap=vmap, eager=eager, grads=grads, batch=batch)
  # Kernels that never ran (their fallbacks stood in for all of them) were not checked, whatever matched.
  not_checked = shadow.unchecked_reason(set(), checker.stood_in) if checker.stood_in and not checker.ran else None
  report = CheckReport(tuple(rows), seed, not_checked)
  if raise_on_mismatch and report.failures:
    raise ReferenceMismatch(report)
  return report


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}"


def _names(tree, prefix: str) -> list[str]:
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  return [prefix] if paths == [""] else [prefix + p for p in paths]


def _highest():
  return jax.default_matmul_precision("highest")


class _Checker:
  """The programs of one check; `run` makes the rows of one case."""

  def __init__(self, fn, reference, inputs, tolerance, rng, *, cast_reference: bool = False, localize: bool = True):
    self.fn, self.user_reference, self.inputs, self.tolerance, self.rng = fn, reference, inputs, tolerance, rng
    self.cast_reference = cast_reference
    self.localize = localize  # check each derivative rule alone when a derivative differs
    # Over every program: whether a kernel call was lowered as its kernel, and those whose fallback stood in.
    self.ran, self.stood_in = False, {}

  # ------------------------------------------------------------------ running

  def _flat(self, fn, case):
    return lambda *leaves: fn(*jax.tree.unflatten(case.tree, list(leaves)))

  def _reference(self, case):
    if self.user_reference is None:
      return reference_lib.reference(self._flat(self.fn, case))
    reference = self._flat(self.user_reference, case)
    return _cast_like(reference, self._flat(self.fn, case)) if self.cast_reference else reference

  def _kernels(self, fn, args, label: str):
    """``fn`` freshly jitted (a new function: nothing cached), lowered with every kernel call checked against its
    fallback; (compiled, outputs, the kernel rows, the calls whose fallback stood in: {call: why})."""
    seen = shadow.Verification("always", "ignore", label=label, quiet=True, tolerance=self.tolerance)
    with seen, _highest():
      compiled = jax.jit(lambda *a: fn(*a)).trace(*args).lower().compile()
    out = jax.block_until_ready(compiled(*args))
    stood_in = seen.stood_in
    self.ran |= seen.kernels_ran
    self.stood_in.update(stood_in)
    return compiled, out, list(seen.report.rows), stood_in

  def _compare(self, what, case, got, want, names, kernel=None) -> list[Comparison]:
    rows = []
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    if len(got_leaves) != len(want_leaves):
      raise ValueError(f"jmf.check: {what}: the function returns {len(got_leaves)} arrays, its reference "
                       f"{len(want_leaves)}: {jax.tree.structure(got)} against {jax.tree.structure(want)}")
    for name, g, w in zip(names, got_leaves, want_leaves):
      if np.shape(g) != np.shape(w):
        raise ValueError(f"jmf.check: {what}: {name} is {list(np.shape(g))} but its reference returns "
                         f"{list(np.shape(w))}")
      dtype, reference_dtype = jnp.result_type(g), jnp.result_type(w)
      if dtype != reference_dtype:
        rows.append(check_report.differing_dtype(what, case.describe(), name, kernel, np.shape(g), dtype,
                                                 reference_dtype))
        continue
      rtol, atol = self.tolerance(dtype)
      summary = numerics.device_summary(jnp.asarray(g), jnp.asarray(w), rtol, atol)
      rows.append(check_report.compared(what, case.describe(), name, kernel, np.shape(g), dtype, rtol, atol, summary))
    return rows

  # ------------------------------------------------------------------ one case

  def run(self, case, *, vmap: bool, eager: bool, grads: bool, batch: int) -> list[Comparison]:
    fn = self._flat(self.fn, case)
    args = check_cases.make_inputs(self.rng, case, self.inputs)
    reference = self._reference(case)
    try:
      with _highest():
        want = jax.jit(reference)(*args)  # first: a kernel without a fallback is named before anything runs
      compiled, out, kernel_rows, stood_in = self._kernels(fn, args, "outputs")
    except reference_lib.MissingFallback:
      raise
    except Exception as e:
      if not case.derived:
        raise
      return [check_report.skipped("outputs", case.describe(), "", None, f"the function refuses these inputs: "
                                   f"{_first_line(e)}")]
    names = _names(out, "out")
    outputs = self._compare("outputs", case, out, want, names)
    rows = _blamed(outputs, kernel_rows)
    rows += kernel_rows or self._unchecked(fn, args, stood_in)
    if eager:
      with _highest():
        rows += self._compare("jit vs eager", case, fn(*args), out, names)
    if vmap:
      rows += self._vmap(fn, compiled, case, batch, names)
    if grads and any(r.reference_dtype is not None for r in outputs):
      # The reference's derivatives would take cotangents of its own dtypes: nothing to compare them with.
      rows.append(check_report.skipped("VJP, JVP", case.describe(), "", None, "the reference returns other dtypes "
                                       "than the function (its outputs row); cast_reference=True compares them cast"))
    elif grads:
      rows += self.derivatives(case, args, out)
    return rows

  def _unchecked(self, fn, args, stood_in: dict[str, str]) -> list[Comparison]:
    """Where a program's kernels ran without their own comparison, one row says why (empty: it calls none)."""
    kernels = [e for e in equations(jax.make_jaxpr(fn)(*args)) if e.primitive is mosaic_kernel_p]
    if not kernels:
      return []
    if stood_in:
      why = "; ".join(sorted(set(stood_in.values())))
    elif all(e.params["spec"].fallback is None for e in kernels):
      why = "the kernels have no fallbacks"
    else:  # check's programs are jitted for this one platform: of shadow.py's unchecked cases, only this is left
      why = "a kernel partitioned across devices (sharding=) runs its shards where no check can report"
    return [check_report.skipped("kernel vs fallback", check_report.describe_avals(args), "", None, why)]

  def _vmap(self, fn, compiled, case, batch: int, names) -> list[Comparison]:
    elements = [check_cases.make_inputs(self.rng, case, self.inputs) for _ in range(batch)]
    stacked = [jnp.stack(leaves) for leaves in zip(*elements)]
    try:
      _, batched, kernel_rows, _ = self._kernels(jax.vmap(fn), stacked, "vmap")
    except reference_lib.MissingFallback:
      raise
    except Exception as e:
      return [check_report.skipped("vmap vs loop", case.describe(), "", None, _first_line(e))]
    loop = [compiled(*element) for element in elements]
    looped = jax.tree.map(lambda *xs: jnp.stack(xs), *loop)
    return _blamed(self._compare("vmap vs loop", case, batched, looped, names), kernel_rows) + kernel_rows

  # ------------------------------------------------------------------ derivatives

  def derivatives(self, case, args, out) -> list[Comparison]:
    """The VJP on random cotangents and the JVP on random tangents, against autodiff of the reference; when one
    differs, each derivative rule on its own (`_rules`)."""
    fn, reference = self._flat(self.fn, case), self._reference(case)
    out_leaves, out_tree = jax.tree.flatten(out)
    floating_in = [i for i, a in enumerate(args) if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]
    floating_out = [k for k, o in enumerate(out_leaves) if jnp.issubdtype(jnp.result_type(o), jnp.inexact)]
    if not floating_in or not floating_out:
      return []
    cotangents = check_cases.random_arrays(self.rng, [out_leaves[k] for k in floating_out])
    tangents = check_cases.random_arrays(self.rng, [args[i] for i in floating_in])

    def full(values, positions, like):  # float0 zeros where a value has no derivative (integers)
      given = dict(zip(positions, values))
      return [given[k] if k in given else np.zeros(np.shape(x), jax.dtypes.float0) for k, x in enumerate(like)]

    def vjp(f):
      def derivative(x, ct):
        grads = jax.vjp(f, *x)[1](jax.tree.unflatten(out_tree, full(ct, floating_out, out_leaves)))
        return [grads[i] for i in floating_in]
      return derivative

    def jvp(f):
      def derivative(x, t):
        tangent_out = jax.tree.leaves(jax.jvp(f, tuple(x), tuple(full(t, floating_in, x)))[1])
        return [tangent_out[k] for k in floating_out]
      return derivative

    out_names = _names(out, "d out")
    rows = self._derivative("VJP", vjp, (list(args), cotangents), fn, reference, case,
                            [f"d in{i}" for i in floating_in])
    if rows[0].skipped is not None:  # no derivative at all (a bare kernel): one row says so
      return [dataclasses.replace(rows[0], what="VJP, JVP")]
    rows += self._derivative("JVP", jvp, (list(args), tangents), fn, reference, case,
                             [out_names[k] for k in floating_out])
    if self.localize and any(r.failed for r in rows if r.what in ("VJP", "JVP")):
      rows += self._rules(fn, args)
    return rows

  def _derivative(self, what, transform, operands, fn, reference, case, names) -> list[Comparison]:
    try:
      _, got, kernel_rows, _ = self._kernels(transform(fn), operands, what)
    except reference_lib.MissingFallback:
      raise
    except (TypeError, NotImplementedError) as e:  # no derivative defined: said so, not failed
      return [check_report.skipped(what, case.describe(), "", None, _first_line(e))]
    try:
      with _highest():
        want = jax.jit(transform(reference))(*operands)
    except (TypeError, NotImplementedError) as e:  # a reference JAX cannot differentiate
      return [check_report.skipped(what, case.describe(), "", None, f"the reference: {_first_line(e)}")] + kernel_rows
    return _blamed(self._compare(what, case, got, want, names), kernel_rows) + kernel_rows

  def _rules(self, fn, args) -> list[Comparison]:
    """Each derivative rule around kernels, on the operands it got (in the reference's evaluation), against autodiff
    of its own fallbacks: the rule that is wrong, by name."""
    found = []
    try:
      reference_lib.reference(fn, on_rule=lambda eqn, ops: found.append((eqn, ops)))(*args)
    except reference_lib.MissingFallback:
      return []
    rows = []
    for eqn, ops in found:
      if any(isinstance(o, jax.core.Tracer) for o in ops):
        continue  # inside a loop's body: its operands are not values here
      consts = list(ops[:eqn.params.get("num_consts", 0)])
      operands = list(ops[len(consts):])
      key = "call_jaxpr" if "call_jaxpr" in eqn.params else "fun_jaxpr"
      inner, inner_consts = reference_lib.parts(eqn.params[key])
      rule = lambda *o, eqn=eqn, consts=consts: _single(reference_lib.bind(eqn, [*consts, *o]))
      fallbacks = lambda *o, j=inner, c=inner_consts, k=consts: _single(reference_lib.evaluate(j, c, [*k, *o]))
      name = _rule_name(rule, operands, inner)
      case = check_cases.Case(tuple(jax.ShapeDtypeStruct(np.shape(o), jnp.result_type(o)) for o in operands),
                              jax.tree.structure(tuple(operands)), False)
      alone = _Checker(rule, fallbacks, None, self.tolerance, self.rng, localize=False)
      for row in alone.derivatives(case, operands, rule(*operands)):
        if row.what in ("VJP", "JVP"):
          rows.append(dataclasses.replace(row, what=f"derivative rule ({row.what})", kernel=name))
    return rows


def _blamed(rows: list[Comparison], kernel_rows: list[Comparison]) -> list[Comparison]:
  """A program's failed rows name the first of its kernel calls that differed from its own fallback."""
  blame = next((r.kernel for r in kernel_rows if r.failed), None)
  if blame is None:
    return rows
  return [dataclasses.replace(r, kernel=f"{blame} (differs from its fallback)") if r.failed else r for r in rows]


def _cast_like(reference, fn):
  """``reference`` with each output cast to the dtype of ``fn``'s output at its place (where they are as many)."""
  def cast(*args):
    want = reference(*args)
    leaves, tree = jax.tree.flatten(want)
    like = jax.tree.leaves(jax.eval_shape(fn, *args))
    if len(like) != len(leaves):  # _compare says how they differ
      return want
    return jax.tree.unflatten(tree, [jnp.asarray(w).astype(a.dtype) for w, a in zip(leaves, like)])
  return cast


def _single(outs: list):
  return outs[0] if len(outs) == 1 else tuple(outs)


def equations(jaxpr):
  inner, _ = reference_lib.parts(jaxpr)
  for eqn in inner.eqns:
    yield eqn
    for sub in reference_lib.jaxprs(eqn.params):
      yield from equations(sub)


def _rule_name(rule, operands, inner) -> str:
  """The rule as its messages name it (``jmf.differentiable('softmax')``), with the kernels it wraps."""
  kernels = [who(e.params["kernel"], e.params["spec"].call_site) for e in equations(inner)
             if e.primitive is mosaic_kernel_p]
  try:
    tangents = [jnp.zeros_like(o) for o in operands]
    traced = jax.make_jaxpr(lambda *o: jax.jvp(rule, tuple(o), tuple(tangents)))(*operands)
    names = [e.params["where"] for e in equations(traced) if e.primitive is mosaic_linear_p]
  except Exception:  # a rule jax cannot trace forward: named by its kernels alone
    names = []
  name = names[0] if names else "a custom derivative rule"
  return f"{name} around {', '.join(dict.fromkeys(kernels))}" if kernels else name
