// Launch values that depend on symbolic shapes (jax.export with shape
// polymorphism): the `launch_programs` attribute of contract v2
// (docs/contract.md, "Launch programs").
//
// A grid dimension or an integer scalar computed from a symbolic size
// (`cdiv(n, 256)`, `n`) is lowered as a small postfix program over the
// dimensions of the call's buffers; the attribute itself then holds a
// placeholder. The runtime evaluates the programs once the buffers' shapes
// are known (the first execution or record of a compiled call site), with
// checked int64 arithmetic, and checks each result against the launch limits
// and the scalar's declared width.
//
// Validation (CheckLaunchPrograms) bounds everything before any arithmetic:
// lengths, opcodes, stack depth, buffer and axis indices, targets. Plain C++
// only: the fuzz driver and Python's trace-time checks run it as it is.
#ifndef JAX_MOSAIC_FFI_LAUNCH_PROGRAMS_H_
#define JAX_MOSAIC_FFI_LAUNCH_PROGRAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "contract/contract.h"

namespace jmf {

inline constexpr size_t kMaxLaunchProgramValues = 4096;  // the whole attribute
inline constexpr int64_t kMaxLaunchProgramCode = 256;    // values in one program's code
inline constexpr int kMaxLaunchProgramStack = 16;
inline constexpr int64_t kMaxBufferRank = 64;

// What a program computes.
enum LaunchProgramTarget : int64_t {
  kProgramGrid = 0,            // grid[index], index 0..2
  kProgramSignedScalar = 1,    // scalar `index`, a signed integer of its declared size
  kProgramUnsignedScalar = 2,  // scalar `index`, an unsigned integer of its declared size
};

// The operations of a program's code, postfix over an int64 stack.
enum LaunchProgramOp : int64_t {
  kOpConst = 0,  // followed by the value
  kOpDim = 1,    // followed by buffer, axis: that buffer's dimension
  kOpAdd = 2,    // the rest pop two values (a below b) and push one
  kOpMul = 3,
  kOpFloorDiv = 4,  // Python's a // b (rounds toward negative infinity)
  kOpMod = 5,       // Python's a % b (the sign of b)
  kOpMax = 6,
  kOpMin = 7,
};

struct LaunchProgram {
  int64_t target = kProgramGrid;
  int index = 0;
  std::vector<int64_t> code;
};

// A dimension a program reads: buffer `buffer`'s axis `axis`.
struct DimRef {
  int buffer = 0;
  int axis = 0;
  bool operator==(const DimRef&) const = default;
};

struct LaunchPrograms {
  std::vector<LaunchProgram> programs;
  std::vector<DimRef> dims;  // every dimension the programs read, each once
};

// Checks the `launch_programs` attribute against a validated spec (buffer
// count, scalars, what is fixed) and decodes it. Empty `values`: no programs.
bool CheckLaunchPrograms(const std::vector<int64_t>& values, const LaunchSpec& spec, LaunchPrograms* out,
                         std::string* error);

// The shapes of a call's buffers: dims[b] points at rank[b] dimensions.
struct BufferShapes {
  const int64_t* dims[kMaxBuffers] = {};
  int64_t rank[kMaxBuffers] = {};
  int count = 0;
};

// Evaluates every program on these shapes into `spec`'s grid and scalars, and
// checks the results (grid in range and a multiple of the cluster, scalars in
// their width). On failure `spec` is unchanged and `*error` names the
// expression and what went wrong.
bool EvaluateLaunchPrograms(const LaunchPrograms& programs, const BufferShapes& shapes, LaunchSpec* spec,
                            std::string* error);

// A program's code as text for messages: "floordiv(in0.shape[0] + 255, 256)".
std::string LaunchProgramText(const std::vector<int64_t>& code, int num_inputs);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_LAUNCH_PROGRAMS_H_
