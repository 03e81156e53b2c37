"""Launch programs (contract v2): a grid and integer scalars computed by the runtime from the buffers' shapes.

`_core.validate_launch` is what XLA's instantiate stage runs on every custom
call; `_core._testing.evaluate_launch` runs the evaluator the first execution
of a v2 call site runs, on given buffer shapes. Both meet hand-written
programs here: the ones an edited artifact can carry, and the sizes that
overflow, divide by zero or leave the launch's limits.
"""

import pytest

from jax_mosaic_ffi import _core

from test_contract import attributes

CONST, DIM, ADD, MUL, FLOORDIV, MOD, MAX, MIN = range(8)
GRID, SIGNED, UNSIGNED = 0, 1, 2


def program(target, index, *code):
  return [target, index, len(code), *code]


# cdiv(in0.shape[0], 256), as jmf.cdiv lowers it
CDIV = (DIM, 0, 0, CONST, 255, ADD, CONST, 256, FLOORDIV)


def launch(*programs, **changes):
  return attributes(launch_programs=[v for p in programs for v in p], **changes)


def evaluate(attrs, *shapes):
  """(grid, scalar slots) for add(a, b, out, n) with these input shapes; the output has a's."""
  shapes = list(shapes) + [shapes[0]] * (3 - len(shapes))
  return _core._testing.evaluate_launch(attrs, shapes)


def test_the_grid_and_a_scalar_follow_the_size():
  attrs = launch(program(GRID, 0, *CDIV), program(SIGNED, 0, DIM, 0, 0))
  assert _core.validate_launch(attrs, False)["param_sizes"] == [8, 8, 8, 4]
  for n, blocks in ((1, 1), (256, 1), (257, 2), (1000, 4), (1 << 20, 4096)):
    assert evaluate(attrs, [n]) == ([blocks, 1, 1], [n])
  # Every operation, with Python's rounding of // and % toward negative infinity.
  for op, a, b, expected in ((ADD, 7, -9, -2), (MUL, -3, 5, -15), (FLOORDIV, -7, 2, -4), (FLOORDIV, 7, -2, -4),
                             (MOD, -7, 2, 1), (MOD, 7, -2, -1), (MAX, -3, 2, 2), (MIN, -3, 2, -3)):
    attrs = launch(program(SIGNED, 0, DIM, 0, 0, CONST, a, ADD, CONST, b, op))
    assert evaluate(attrs, [0]) == ([4, 1, 1], [expected & 0xFFFFFFFF]), (op, a, b)


def test_a_scalar_is_written_in_its_width_and_the_other_scalars_keep_their_values():
  attrs = launch(program(UNSIGNED, 1, DIM, 1, 1), scalar_sizes=[4, 2], param_order=[0, 1, 2, -1, -2],
                 scalar_data=(1024).to_bytes(8, "little") + bytes(8))
  assert evaluate(attrs, [3, 65535], [2, 65535]) == ([4, 1, 1], [1024, 65535])


@pytest.mark.parametrize("code, shape, message", [
    (CDIV, [0], "grid[0] = floordiv(in0.shape[0] + 255, 256) is 0 for these shapes; it must be 1..2147483647"),
    (CDIV, [1 << 40], "grid[0] = floordiv(in0.shape[0] + 255, 256) is 4294967296 for these shapes; it must be "
                      "1..2147483647"),
    ((DIM, 0, 0, CONST, -1, MUL), [5], "grid[0] = in0.shape[0] * -1 is -5 for these shapes; it must be 1..2147483647"),
    ((DIM, 0, 0, DIM, 0, 0, MUL, DIM, 0, 0, MUL), [1 << 30],
     "grid[0] = in0.shape[0] * in0.shape[0] * in0.shape[0] overflows int64 (1152921504606846976 * 1073741824)"),
    ((DIM, 0, 0, CONST, 9223372036854775807, ADD), [1],
     "grid[0] = in0.shape[0] + 9223372036854775807 overflows int64 (1 + 9223372036854775807)"),
    ((CONST, 7, DIM, 0, 0, FLOORDIV), [0], "grid[0] = floordiv(7, in0.shape[0]) divides by zero (7 // 0)"),
    ((CONST, 7, DIM, 0, 0, MOD), [0], "grid[0] = mod(7, in0.shape[0]) divides by zero (7 % 0)"),
    ((CONST, -9223372036854775808, CONST, -1, FLOORDIV), [1],
     "grid[0] = floordiv(-9223372036854775808, -1) overflows int64 (-9223372036854775808 // -1)"),
    ((DIM, 0, 1), [5], "grid[0] = in0.shape[1] reads dimension 1 of buffer 0, which has rank 1"),
    # A constant's text is its value: said once.
    ((CONST, 2147483648), [1], "grid[0] is 2147483648 for these shapes; it must be 1..2147483647"),
    ((CONST, 0), [1], "grid[0] is 0 for these shapes; it must be 1..2147483647"),
])
def test_a_grid_the_sizes_make_impossible_is_an_error_naming_the_expression(code, shape, message):
  with pytest.raises(ValueError) as caught:
    evaluate(launch(program(GRID, 0, *code)), shape)
  assert str(caught.value) == message


def test_a_grid_that_is_not_a_multiple_of_the_cluster_is_an_error():
  with pytest.raises(ValueError) as caught:
    evaluate(launch(program(GRID, 0, DIM, 0, 0), grid=[2, 1, 1], cluster=[2, 1, 1]), [3])
  assert str(caught.value) == "grid[0] = in0.shape[0] is 3 for these shapes, not a multiple of cluster[0] = 2"


@pytest.mark.parametrize("target, size, value, message", [
    (SIGNED, 4, 1 << 31, "scalars[0] = in0.shape[0] is 2147483648 for these shapes, which does not fit its int32"),
    (UNSIGNED, 1, 256, "scalars[0] = in0.shape[0] is 256 for these shapes, which does not fit its uint8"),
    (UNSIGNED, 8, -1, "scalars[0] = in0.shape[0] + -2 is -1 for these shapes, which does not fit its uint64"),
])
def test_a_scalar_that_does_not_fit_its_width_is_an_error(target, size, value, message):
  code = (DIM, 0, 0) if value >= 0 else (DIM, 0, 0, CONST, -2, ADD)
  attrs = launch(program(target, 0, *code), scalar_sizes=[size])
  with pytest.raises(ValueError) as caught:
    evaluate(attrs, [value if value >= 0 else 1])
  assert str(caught.value) == message


STACK_17 = [CONST, 1] * 17 + [ADD] * 16


@pytest.mark.parametrize("programs, message", [
    ([9, 0, 2, CONST, 1], "launch_programs entry at 0 has target 9; it must be 0 (grid), 1 or 2 (a scalar)"),
    (program(GRID, 3, CONST, 1), "launch_programs entry at 0 computes grid[3], which is not 0..2 or is computed twice"),
    (program(GRID, 0, CONST, 1) + program(GRID, 0, CONST, 2),
     "launch_programs entry at 5 computes grid[0], which is not 0..2 or is computed twice"),
    (program(SIGNED, 1, CONST, 1),
     "launch_programs entry at 0 computes scalar 1, which is missing or computed twice (the call has 1 scalars)"),
    ([GRID, 0, 5, CONST, 1], "launch_programs entry at 0 has a code of 5 values; it must be 1..256 and within the "
                             "attribute"),
    ([GRID, 0, 0], "launch_programs entry at 0 has a code of 0 values; it must be 1..256 and within the attribute"),
    ([GRID, 0], "launch_programs ends inside a program's header"),
    (program(GRID, 0, 8, 1), "launch_programs entry at 0: unknown operation 8 at 0"),
    (program(GRID, 0, CONST), "launch_programs entry at 0: operation 0 at 0 lacks its operands"),
    (program(GRID, 0, DIM, 0), "launch_programs entry at 0: operation 1 at 0 lacks its operands"),
    (program(GRID, 0, CONST, 1, ADD), "launch_programs entry at 0: operation 2 at 2 lacks operands"),
    (program(GRID, 0, CONST, 1, CONST, 2), "launch_programs entry at 0: leaves 2 values; it must leave one"),
    (program(GRID, 0, *STACK_17), "launch_programs entry at 0: needs a stack deeper than 16"),
    (program(GRID, 0, DIM, 3, 0), "launch_programs entry at 0: reads dimension 0 of buffer 3, but the call has 3 "
                                  "buffers of rank below 64"),
    (program(GRID, 0, DIM, -1, 0), "launch_programs entry at 0: reads dimension 0 of buffer -1, but the call has 3 "
                                   "buffers of rank below 64"),
    (program(GRID, 0, DIM, 0, 64), "launch_programs entry at 0: reads dimension 64 of buffer 0, but the call has 3 "
                                   "buffers of rank below 64"),
    ([GRID, 0, 1, CONST] + [0] * 4096, "launch_programs holds 4100 values; at most 4096"),
])
def test_malformed_programs_are_refused_before_any_arithmetic(programs, message):
  with pytest.raises(ValueError) as caught:
    _core.validate_launch(attributes(launch_programs=programs), False)
  assert str(caught.value) == message


def test_programs_are_refused_on_the_collective_target_and_with_a_batch():
  programs = program(GRID, 0, *CDIV)
  with pytest.raises(ValueError, match="launch_programs is not supported on the collective target"):
    _core.validate_launch(attributes(launch_programs=programs, uses_xla_collective_metadata=True,
                                     xla_replica_ids="0,1"), True)
  with pytest.raises(ValueError, match=r"^launch_programs cannot be combined with batch_size > 1$"):
    _core.validate_launch(attributes(launch_programs=programs, batch_size=2, batch_strides=[4, 4, 4]), False)


def test_the_attribute_must_be_an_i64_array():
  with pytest.raises(ValueError, match="attribute 'launch_programs' has the wrong type or size; the contract says "
                                       "array<i64>"):
    _core.validate_launch(attributes(launch_programs="0,0,1"), False)

