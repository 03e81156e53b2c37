// The call site's launch programs (contract v2, contract/launch_programs.h):
// a grid or scalars computed from the buffers' shapes, which jax.export with
// shape polymorphism only knows once the exported function is called. XLA
// compiles each call site for fixed shapes, so the programs run once, at the
// first execution or record of the compiled call site, under the state's
// mutex; every later call compares the few dimensions they read with the
// ones they ran on (no parsing, no allocation) and launches what they gave.
#include <string>

#include "contract/launch_programs.h"
#include "runtime/call_site.h"

namespace jmf {
namespace {

// The dimensions of buffer `b` (inputs, then outputs); empty where XLA passed none.
ffi::Span<const int64_t> Dimensions(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets, int b) {
  if (static_cast<size_t>(b) < args.size()) {
    auto buffer = args.get<ffi::AnyBuffer>(b);
    return buffer.has_value() ? buffer->dimensions() : ffi::Span<const int64_t>();
  }
  auto buffer = rets.get<ffi::AnyBuffer>(b - args.size());
  return buffer.has_value() ? (*buffer)->dimensions() : ffi::Span<const int64_t>();
}

// Dimension `axis` of buffer `b`, or -1 when there is none.
int64_t Dimension(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets, int b, int axis) {
  ffi::Span<const int64_t> dims = Dimensions(args, rets, b);
  return static_cast<size_t>(axis) < dims.size() ? dims[axis] : -1;
}

}  // namespace

ffi::Error CallSite::ResolveLaunchPrograms(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets) {
  const LaunchPrograms& programs = *spec_.programs;
  if (!programs_resolved_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!programs_resolved_.load(std::memory_order_relaxed)) {
      if (args.size() + rets.size() != static_cast<size_t>(spec_.num_buffers)) [[unlikely]] {
        return ffi::Error::InvalidArgument(who() + ": called with " + std::to_string(args.size() + rets.size()) +
                                           " buffers, but lowered for " + std::to_string(spec_.num_buffers));
      }
      BufferShapes shapes;
      shapes.count = spec_.num_buffers;
      for (int b = 0; b < spec_.num_buffers; ++b) {
        ffi::Span<const int64_t> dims = Dimensions(args, rets, b);
        shapes.dims[b] = dims.begin();
        shapes.rank[b] = static_cast<int64_t>(dims.size());
      }
      std::string error;
      if (!EvaluateLaunchPrograms(programs, shapes, &spec_, &error)) {
        return ffi::Error::InvalidArgument(
            who() + ": " + error +
            ". The grid and scalars were computed from symbolic shapes (jax.export); change the expression or "
            "call the exported function with shapes it accepts");
      }
      program_dims_.clear();
      for (const DimRef& ref : programs.dims) program_dims_.push_back(shapes.dims[ref.buffer][ref.axis]);
      config_.gridDimX = spec_.grid[0], config_.gridDimY = spec_.grid[1], config_.gridDimZ = spec_.grid[2];
      // Bounded by the contract's grid limits, so they fit in int32.
      record_dims_.grid = record_abi::Dim3{static_cast<int32_t>(spec_.grid[0]), static_cast<int32_t>(spec_.grid[1]),
                                           static_cast<int32_t>(spec_.grid[2])};
      programs_resolved_.store(true, std::memory_order_release);
      return ffi::Error::Success();
    }
  }
  // Resolved for these shapes; XLA compiled this call site for them, so they cannot change.
  for (size_t k = 0; k < programs.dims.size(); ++k) {
    const DimRef& ref = programs.dims[k];
    if (Dimension(args, rets, ref.buffer, ref.axis) != program_dims_[k]) [[unlikely]] {
      return ffi::Error::Internal(who() + ": buffer " + std::to_string(ref.buffer) + " dimension " +
                                  std::to_string(ref.axis) + " changed since the launch was computed from it");
    }
  }
  return ffi::Error::Success();
}

}  // namespace jmf
