"""cutlass_call's ``input_output_aliases``, read into the flat buffer aliases of one `mosaic_kernel` call.

As cutlass_call takes them: an int maps a whole top-level input to a whole top-level output (pytrees of the same
structure, aliased leaf by leaf); a JAX key path maps one tensor leaf, the input's rooted at the tuple of
positional arguments and the output's at the outer output sequence (so paths usually start with
``SequenceKey(i)``). Aliased leaves need the same shape and dtype (and, checked with the specs in cute/launch.py, the
same physical layout); no input or output is aliased twice. The launcher does not get the aliased outputs: a
top-level output aliased by index is left out of its outputs, a leaf aliased by path is None there.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Mapping

import jax

from jax_mosaic_ffi.base.errors import LaunchError

KeyPath = tuple
_KEY_ENTRIES = (jax.tree_util.SequenceKey, jax.tree_util.DictKey, jax.tree_util.GetAttrKey,
                jax.tree_util.FlattenedIndexKey)
_SHOWN_PATHS = 8  # how many of a pytree's paths a message lists


def _ref(value, name: str) -> int | KeyPath:
  if not isinstance(value, bool):
    try:
      index = operator.index(value)
    except TypeError:
      pass
    else:
      if index < 0:
        raise ValueError(f"cute_call: input_output_aliases {name} must be nonnegative; got {index}")
      return index
  if not isinstance(value, tuple):
    raise TypeError(f"cute_call: input_output_aliases {name} must be an integer or a JAX KeyPath, got {value!r}")
  if not all(isinstance(entry, _KEY_ENTRIES) for entry in value):
    raise TypeError(f"cute_call: input_output_aliases {name} {value!r}: a KeyPath's entries must be JAX key entries "
                    "(jax.tree_util.SequenceKey, DictKey, GetAttrKey, FlattenedIndexKey)")
  return value


def normalize(aliases: Mapping[Any, Any] | None) -> tuple[tuple[int | KeyPath, int | KeyPath], ...]:
  """The ``(input, output)`` pairs, checked as cutlass_call checks them when the call is made."""
  if aliases is None:
    return ()
  if not isinstance(aliases, Mapping):
    raise TypeError("cute_call: input_output_aliases must be a mapping")
  pairs, outputs = [], set()
  for i, o in aliases.items():
    i, o = _ref(i, "input"), _ref(o, "output")
    if isinstance(i, int) != isinstance(o, int):
      raise TypeError("cute_call: input_output_aliases must map an integer to an integer or a JAX KeyPath to a JAX "
                      f"KeyPath; got {_text(i)}: {_text(o)}")
    if o in outputs:
      raise ValueError(f"cute_call: input_output_aliases maps several inputs to output {_text(o)}")
    outputs.add(o)
    pairs.append((i, o))
  return tuple(pairs)


def _text(ref) -> str:
  return str(ref) if isinstance(ref, int) else jax.tree_util.keystr(ref)


@dataclasses.dataclass(frozen=True)
class Resolved:
  """The aliases of one call: ``flat`` maps an input (by index among the present tensors) to an output (by leaf
  index), as `mosaic_kernel`'s ``input_output_aliases``; ``launcher_outputs`` is the outputs' pytree as the
  launcher gets it."""

  flat: dict[int, int]
  launcher_outputs: tuple


def _leaves(tree) -> list[tuple[KeyPath, Any, int | None]]:
  """(path, leaf, index among the non-None leaves or None) per leaf, None leaves included."""
  out, k = [], 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]:
    out.append((path, leaf, None if leaf is None else k))
    k += leaf is not None
  return out


def _no_path(kind: str, path: KeyPath, leaves, where: str) -> LaunchError:
  known = [jax.tree_util.keystr(p) for p, _, _ in leaves]
  shown = ", ".join(known[:_SHOWN_PATHS]) + (", ..." if len(known) > _SHOWN_PATHS else "")
  return LaunchError(f"{where}: input_output_aliases {kind} path {jax.tree_util.keystr(path)} names no tensor leaf "
                     f"of the {kind}s; their leaves are at {shown or 'no path'}. A path starts with the "
                     f"{'positional argument' if kind == 'input' else 'output'}'s SequenceKey")


def resolve(pairs, args: tuple, outputs: tuple, where: str) -> Resolved:
  """``pairs`` (from `normalize`) for these positional arguments and outer output sequence."""
  in_leaves, out_leaves = _leaves(args), _leaves(outputs)
  flat: dict[int, int] = {}
  aliased_outputs: set[int] = set()
  dropped: set[int] = set()      # top-level outputs aliased by index
  nulled: set[KeyPath] = set()   # output leaves aliased by path

  def alias(i_leaf, o_leaf, label: str) -> None:
    (_, a, i), (_, b, o) = i_leaf, o_leaf
    if i in flat:
      raise LaunchError(f"{where}: input_output_aliases {label} reuses an input buffer already aliased")
    if o in aliased_outputs:
      raise LaunchError(f"{where}: input_output_aliases {label} reuses an output buffer already aliased")
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
      raise LaunchError(f"{where}: input_output_aliases {label} aliases an input of {a.dtype}{list(a.shape)} "
                        f"with an output of {b.dtype}{list(b.shape)}; aliased buffers need the same shape and dtype")
    flat[i] = o
    aliased_outputs.add(o)

  for i, o in pairs:
    if isinstance(i, int):
      if i >= len(args) or o >= len(outputs):
        raise LaunchError(f"{where}: input_output_aliases {i}: {o} is outside the {len(args)} inputs and "
                          f"{len(outputs)} outputs")
      in_tree, out_tree = jax.tree_util.tree_structure(args[i]), jax.tree_util.tree_structure(outputs[o])
      if in_tree != out_tree:
        raise LaunchError(f"{where}: input_output_aliases {i}: {o} must map pytrees of the same structure; input "
                          f"{i} is {in_tree} and output {o} is {out_tree}. Alias single leaves by key path instead")
      ins = [leaf for leaf in in_leaves if leaf[0][0] == jax.tree_util.SequenceKey(i) and leaf[1] is not None]
      outs = [leaf for leaf in out_leaves if leaf[0][0] == jax.tree_util.SequenceKey(o) and leaf[1] is not None]
      for k, (a, b) in enumerate(zip(ins, outs)):
        alias(a, b, f"{i}: {o}" + (f" (leaf {k})" if len(ins) > 1 else ""))
      dropped.add(o)
      continue
    a = next((leaf for leaf in in_leaves if leaf[0] == i), None)
    b = next((leaf for leaf in out_leaves if leaf[0] == o), None)
    if a is None:
      raise _no_path("input", i, in_leaves, where)
    if b is None:
      raise _no_path("output", o, out_leaves, where)
    label = f"{_text(i)}: {_text(o)}"
    if (a[1] is None) != (b[1] is None):
      raise LaunchError(f"{where}: input_output_aliases {label}: one path names an absent (None) leaf and the "
                        "other a tensor; both must name tensors (or both None)")
    nulled.add(o)
    if a[1] is not None:
      alias(a, b, label)
  launcher_outputs = jax.tree_util.tree_map_with_path(lambda path, x: None if path in nulled else x, outputs,
                                                      is_leaf=lambda x: x is None)
  return Resolved(flat, tuple(x for k, x in enumerate(launcher_outputs) if k not in dropped))
