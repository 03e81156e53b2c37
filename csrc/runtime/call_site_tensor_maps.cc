// The call site's tensor maps: TMA descriptors (CUtensorMap) for kernel
// parameters declared with jmf.TensorMap, encoded with cuTensorMapEncodeTiled
// from the address of the buffer they describe.
//
// Every field was validated at instantiate (contract/contract.cc). The address is
// known only at execution, and XLA may hand a call site a different buffer
// each time, so each device keeps the encoded map with the address it was
// encoded for: an execution whose buffer did not move only compares a
// pointer; one whose buffer moved encodes again, into the same storage (no
// allocation). The launch passes that storage by value (the driver copies
// kernel parameters at launch), and the record stage hands the same bytes to
// XLA, which copies them into the graph node.
#include <cstdint>
#include <string>

#include "ffi/status.h"
#include "runtime/call_site.h"

namespace jmf {

ffi::Error CallSite::EncodeTensorMaps(const Buffers& buffers, int32_t device) const {
  EncodedTensorMap* encoded = slots_[device].tensor_maps.get();
  if (encoded == nullptr) [[unlikely]] {
    return ffi::Error::Internal(who() + ": tensor maps used on device " + std::to_string(device) + " before loading");
  }
  for (uint32_t element = 0; element < spec_.batch_size; ++element) {
    for (size_t m = 0; m < spec_.tensor_maps.size(); ++m) {
      const size_t index = TensorMapIndex(m, element);
      if (element > 0 && index == m) continue;  // a shared input's map: element 0's
      const TensorMapSpec& t = spec_.tensor_maps[m];
      const uint64_t offset = ElementOffset(t.buffer, element);
      if (encoded[index].address == static_cast<const char*>(buffers.ptrs[t.buffer]) + offset) continue;
      JMF_RETURN_IF_ERROR(EncodeTensorMap(t, m, element, buffers, &encoded[index]));
    }
  }
  return ffi::Error::Success();
}

ffi::Error CallSite::EncodeTensorMap(const TensorMapSpec& t, size_t m, uint32_t element, const Buffers& buffers,
                                     EncodedTensorMap* encoded) const {
  const uint64_t offset = ElementOffset(t.buffer, element);
  const uint64_t bytes = buffers.bytes[t.buffer];
  void* address = static_cast<char*>(buffers.ptrs[t.buffer]) + (offset <= bytes ? offset : 0);
  const bool input = t.buffer < spec_.num_inputs;
  auto name = [&] {  // built only for an error: encoding itself builds no strings
    return who() + ": the tensor map of parameter " + std::to_string(t.param) + " (" + (input ? "in" : "out") +
           std::to_string(input ? t.buffer : t.buffer - spec_.num_inputs) + ")" +
           (spec_.batch_size > 1 ? " for vmap batch element " + std::to_string(element) : std::string());
  };
  if (reinterpret_cast<uintptr_t>(address) % t.alignment != 0) {
    return ffi::Error::InvalidArgument(name() + ": the buffer's address " +
                                       std::to_string(reinterpret_cast<uintptr_t>(address)) + " is not " +
                                       std::to_string(t.alignment) + "-byte aligned, as TMA requires");
  }
  if (offset > bytes || bytes - offset < t.extent_bytes) {
    return ffi::Error::InvalidArgument(name() + " reaches " + std::to_string(t.extent_bytes) + " bytes from byte " +
                                       std::to_string(offset) + ", but the buffer holds " + std::to_string(bytes));
  }
  cuuint64_t dims[kMaxTensorRank], strides[kMaxTensorRank];
  cuuint32_t box[kMaxTensorRank], element_strides[kMaxTensorRank];
  for (int d = 0; d < t.rank; ++d) {
    dims[d] = t.dims[d];
    box[d] = t.box[d];
    element_strides[d] = t.element_strides[d];
    if (d > 0) strides[d - 1] = t.strides[d - 1];
  }
  const CUresult result = driver_->cuTensorMapEncodeTiled(
      &encoded->map, static_cast<CUtensorMapDataType>(t.data_type), t.rank, address, dims, strides, box,
      element_strides, static_cast<CUtensorMapInterleave>(t.interleave), static_cast<CUtensorMapSwizzle>(t.swizzle),
      static_cast<CUtensorMapL2promotion>(t.l2_promotion), static_cast<CUtensorMapFloatOOBfill>(t.oob_fill));
  if (result != CUDA_SUCCESS) {
    encoded->address = nullptr;
    return ffi::Error::InvalidArgument(name() + ": cuTensorMapEncodeTiled refused it (tensor map " + std::to_string(m) +
                                       "): " + CudaErrorText(*driver_, result));
  }
  encoded->address = address;
  GetCacheStats().tensor_map_encodes.fetch_add(1, std::memory_order_relaxed);
  return ffi::Error::Success();
}

}  // namespace jmf
