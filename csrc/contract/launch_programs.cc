#include "contract/launch_programs.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string>

#include "contract/checker.h"

namespace jmf {
namespace {

// The operand count of an operation, or -1 for an unknown opcode.
int Operands(int64_t op) {
  switch (op) {
    case kOpConst:
      return 1;
    case kOpDim:
      return 2;
    case kOpAdd:
    case kOpMul:
    case kOpFloorDiv:
    case kOpMod:
    case kOpMax:
    case kOpMin:
      return 0;
    default:
      return -1;
  }
}

std::string TargetText(const LaunchProgram& p) {
  return p.target == kProgramGrid ? "grid[" + Num(p.index) + "]" : "scalars[" + Num(p.index) + "]";
}

// Checks one program's code: opcodes, operands in range, the stack within
// bounds and one value left. Collects the dimensions it reads.
bool CheckCode(const std::vector<int64_t>& code, const std::string& what, const LaunchSpec& spec,
               std::vector<DimRef>* dims, Checker& check) {
  int depth = 0;
  for (size_t i = 0; i < code.size();) {
    const int64_t op = code[i];
    const int operands = Operands(op);
    if (operands < 0) return check.Fail(what + ": unknown operation " + Num(op) + " at " + Num(int64_t(i)));
    if (i + operands >= code.size()) {
      return check.Fail(what + ": operation " + Num(op) + " at " + Num(int64_t(i)) + " lacks its operands");
    }
    if (op == kOpDim) {
      const int64_t buffer = code[i + 1], axis = code[i + 2];
      if (buffer < 0 || buffer >= spec.num_buffers || axis < 0 || axis >= kMaxBufferRank) {
        return check.Fail(what + ": reads dimension " + Num(axis) + " of buffer " + Num(buffer) +
                          ", but the call has " + Num(spec.num_buffers) + " buffers of rank below " +
                          Num(kMaxBufferRank));
      }
      DimRef ref{static_cast<int>(buffer), static_cast<int>(axis)};
      if (std::find(dims->begin(), dims->end(), ref) == dims->end()) dims->push_back(ref);
    }
    depth += operands > 0 ? 1 : -1;
    if (depth < 1) return check.Fail(what + ": operation " + Num(op) + " at " + Num(int64_t(i)) + " lacks operands");
    if (depth > kMaxLaunchProgramStack) {
      return check.Fail(what + ": needs a stack deeper than " + Num(kMaxLaunchProgramStack));
    }
    i += 1 + operands;
  }
  if (depth != 1) return check.Fail(what + ": leaves " + Num(depth) + " values; it must leave one");
  return true;
}

// Checked int64 arithmetic, Python's semantics for // and %.
bool Apply(int64_t op, int64_t a, int64_t b, int64_t* out, std::string* why) {
  switch (op) {
    case kOpAdd:
      if (__builtin_add_overflow(a, b, out)) return *why = "overflows int64 (" + Num(a) + " + " + Num(b) + ")", false;
      return true;
    case kOpMul:
      if (__builtin_mul_overflow(a, b, out)) return *why = "overflows int64 (" + Num(a) + " * " + Num(b) + ")", false;
      return true;
    case kOpFloorDiv:
    case kOpMod: {
      if (b == 0) return *why = "divides by zero (" + Num(a) + (op == kOpMod ? " % 0)" : " // 0)"), false;
      if (a == std::numeric_limits<int64_t>::min() && b == -1) {
        if (op == kOpMod) return *out = 0, true;
        return *why = "overflows int64 (" + Num(a) + " // -1)", false;
      }
      int64_t q = a / b, r = a % b;
      if (r != 0 && ((r < 0) != (b < 0))) --q, r += b;  // round toward negative infinity, as Python
      *out = op == kOpFloorDiv ? q : r;
      return true;
    }
    case kOpMax:
      return *out = std::max(a, b), true;
    case kOpMin:
      return *out = std::min(a, b), true;
  }
  return *why = "unknown operation " + Num(op), false;
}

// Runs a checked program. The code was validated (CheckCode), so the stack
// stays within its bounds.
bool Run(const std::vector<int64_t>& code, const BufferShapes& shapes, int64_t* value, std::string* why) {
  int64_t stack[kMaxLaunchProgramStack];
  int depth = 0;
  for (size_t i = 0; i < code.size();) {
    const int64_t op = code[i];
    if (op == kOpConst) {
      stack[depth++] = code[i + 1];
      i += 2;
    } else if (op == kOpDim) {
      const int64_t buffer = code[i + 1], axis = code[i + 2];
      if (buffer >= shapes.count || axis >= shapes.rank[buffer]) {
        *why = "reads dimension " + Num(axis) + " of buffer " + Num(buffer) + ", which has rank " +
               Num(buffer < shapes.count ? shapes.rank[buffer] : 0);
        return false;
      }
      stack[depth++] = shapes.dims[buffer][axis];
      i += 3;
    } else {
      int64_t result = 0;
      if (!Apply(op, stack[depth - 2], stack[depth - 1], &result, why)) return false;
      stack[--depth - 1] = result;
      i += 1;
    }
  }
  *value = stack[0];
  return true;
}

}  // namespace

bool CheckLaunchPrograms(const std::vector<int64_t>& values, const LaunchSpec& spec, LaunchPrograms* out,
                         std::string* error) {
  *out = LaunchPrograms();
  Checker check(error);
  if (values.size() > kMaxLaunchProgramValues) {
    return check.Fail("launch_programs holds " + Num(int64_t(values.size())) + " values; at most " +
                      Num(int64_t(kMaxLaunchProgramValues)));
  }
  std::vector<bool> grid_seen(3, false), scalar_seen(spec.scalar_sizes.size(), false);
  for (size_t i = 0; i < values.size();) {
    if (values.size() - i < 3) return check.Fail("launch_programs ends inside a program's header");
    LaunchProgram p;
    const int64_t target = values[i], index = values[i + 1], length = values[i + 2];
    const std::string what = "launch_programs entry at " + Num(int64_t(i));
    if (target == kProgramGrid) {
      if (index < 0 || index > 2 || grid_seen[index]) {
        return check.Fail(what + " computes grid[" + Num(index) + "], which is not 0..2 or is computed twice");
      }
      grid_seen[index] = true;
    } else if (target == kProgramSignedScalar || target == kProgramUnsignedScalar) {
      if (index < 0 || index >= int64_t(scalar_seen.size()) || scalar_seen[index]) {
        return check.Fail(what + " computes scalar " + Num(index) +
                          ", which is missing or computed twice (the call has " + Num(int64_t(scalar_seen.size())) +
                          " scalars)");
      }
      scalar_seen[index] = true;
    } else {
      return check.Fail(what + " has target " + Num(target) + "; it must be 0 (grid), 1 or 2 (a scalar)");
    }
    if (length < 1 || length > kMaxLaunchProgramCode || length > int64_t(values.size() - i - 3)) {
      return check.Fail(what + " has a code of " + Num(length) + " values; it must be 1.." +
                        Num(kMaxLaunchProgramCode) + " and within the attribute");
    }
    p.target = target;
    p.index = static_cast<int>(index);
    p.code.assign(values.begin() + i + 3, values.begin() + i + 3 + length);
    if (!CheckCode(p.code, what, spec, &out->dims, check)) return false;
    out->programs.push_back(std::move(p));
    i += 3 + length;
  }
  if (spec.batch_size > 1 && !out->programs.empty()) {
    return check.Fail("launch_programs cannot be combined with batch_size > 1");
  }
  return true;
}

bool EvaluateLaunchPrograms(const LaunchPrograms& programs, const BufferShapes& shapes, LaunchSpec* spec,
                            std::string* error) {
  std::array<uint32_t, 3> grid = spec->grid;
  std::vector<uint64_t> scalars = spec->scalars;
  for (const LaunchProgram& p : programs.programs) {
    int64_t value = 0;
    std::string why;
    const auto fail = [&](const std::string& reason) {
      // A constant program's text is its value: "grid[0] is 0", not "grid[0] = 0 is 0".
      const std::string text = LaunchProgramText(p.code, spec->num_inputs);
      *error = TargetText(p) + (text == Num(value) ? "" : " = " + text) + " " + reason;
      return false;
    };
    if (!Run(p.code, shapes, &value, &why)) return fail(why);
    if (p.target == kProgramGrid) {
      const int64_t limit = kMaxGrid[p.index], cluster = spec->cluster[p.index];
      if (value < 1 || value > limit) {
        return fail("is " + Num(value) + " for these shapes; it must be 1.." + Num(limit));
      }
      if (value % cluster != 0) {
        return fail("is " + Num(value) + " for these shapes, not a multiple of cluster[" + Num(p.index) +
                    "] = " + Num(cluster));
      }
      grid[p.index] = static_cast<uint32_t>(value);
      continue;
    }
    const int bits = 8 * spec->scalar_sizes[p.index];
    const bool is_signed = p.target == kProgramSignedScalar;
    bool fits = true;
    if (is_signed && bits < 64) {
      fits = value >= -(int64_t{1} << (bits - 1)) && value < (int64_t{1} << (bits - 1));
    } else if (!is_signed) {
      fits = value >= 0 && (bits == 64 || value < (int64_t{1} << bits));
    }
    if (!fits) {
      return fail("is " + Num(value) + " for these shapes, which does not fit its " + (is_signed ? "int" : "uint") +
                  Num(bits));
    }
    const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    scalars[p.index] = static_cast<uint64_t>(value) & mask;
  }
  spec->grid = grid;
  spec->scalars = std::move(scalars);
  return true;
}

std::string LaunchProgramText(const std::vector<int64_t>& code, int num_inputs) {
  // Each value's text and how loosely it binds: 0 a name, number or call, 1 a product, 2 a sum. Only a sum
  // inside a product needs parentheses.
  std::vector<std::pair<std::string, int>> stack;
  for (size_t i = 0; i < code.size();) {
    const int64_t op = code[i];
    const int operands = Operands(op);
    if (operands < 0 || i + operands >= code.size()) return "<malformed program>";
    if (op == kOpConst) {
      stack.emplace_back(Num(code[i + 1]), 0);
    } else if (op == kOpDim) {
      const int64_t b = code[i + 1];
      stack.emplace_back(
          (b < num_inputs ? "in" + Num(b) : "out" + Num(b - num_inputs)) + ".shape[" + Num(code[i + 2]) + "]", 0);
    } else {
      if (stack.size() < 2) return "<malformed program>";
      auto [b, b_binds] = stack.back();
      stack.pop_back();
      auto& [a, a_binds] = stack.back();
      static const char* const kNames[] = {"", "", " + ", " * ", "floordiv", "mod", "max", "min"};
      if (op == kOpAdd) {
        a = a + " + " + b, a_binds = 2;
      } else if (op == kOpMul) {
        const auto wrap = [](const std::string& t, int binds) { return binds == 2 ? "(" + t + ")" : t; };
        a = wrap(a, a_binds) + " * " + wrap(b, b_binds), a_binds = 1;
      } else {
        a = std::string(kNames[op]) + "(" + a + ", " + b + ")", a_binds = 0;
      }
    }
    i += 1 + operands;
  }
  if (stack.size() != 1) return "<malformed program>";
  return stack[0].first;
}

}  // namespace jmf
