// ===== csrc/contract/: the custom-call contract and the module format =====
// The layer at the bottom. Its files include the C++ standard library and
// each other, nothing else: no CUDA, no XLA, no nanobind, no other folder of
// csrc/. The fuzz driver (tests/fuzz/) and Python's trace-time checks rely on
// that. Layers: contract <- driver <- ffi <- peers <- runtime <- python; a file
// includes from its own folder or one below, never above
// (scripts/check_csrc_layers.py).
//
// The custom-call contract (docs/contract.md): its limits, the names and
// types of its attributes, and the one validator that turns attributes into
// a launch specification.
//
// This is the single owner of the contract. XLA's instantiate stage
// (runtime/call_site.cc) and Python's trace-time checks (through _core.validate_launch)
// both decode attributes with DecodeLaunchAttributes and check them with
// ValidateLaunch, so the two can never disagree. Attribute values come from
// programs the user may have loaded from anywhere (an edited jax.export
// artifact): every value is bounded here before any arithmetic or indexing.
//
// Plain C++ only (no XLA, no CUDA): the fuzz driver links it as it is.
#ifndef JAX_MOSAIC_FFI_CONTRACT_H_
#define JAX_MOSAIC_FFI_CONTRACT_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jmf {

// ----------------------------------------------------------------- limits

inline constexpr int kMaxParams = 256;   // kernel parameters; launch arguments live on the stack
inline constexpr int kMaxBuffers = 256;  // inputs plus outputs of one call
inline constexpr int kMaxDevices = 64;   // device ordinals a call-site state keeps slots for
inline constexpr int kMaxPeers = 64;     // devices in one collective clique
inline constexpr int kMaxThreadsPerBlock = 1024;
inline constexpr std::array<int64_t, 3> kMaxGrid = {2147483647, 65535, 65535};
inline constexpr std::array<int64_t, 3> kMaxBlock = {1024, 1024, 64};
inline constexpr int kMaxClusterBlocks = 16;  // the largest non-portable cluster of current GPUs
inline constexpr int kPortableClusterBlocks = 8;
inline constexpr int64_t kMaxSmemBytes = 1 << 20;  // a bound; the device's own limit is checked at load
inline constexpr int kMaxScalarBytes = 8;
inline constexpr size_t kMaxLabelBytes = 512;  // kernel_name, call_site: for messages only
// Message text from a user-supplied string: bounded (kMaxLabelBytes), printable, valid UTF-8 (it becomes a
// Python string): control bytes and broken sequences become '?'.
std::string Label(std::string_view text);
inline constexpr size_t kMaxReplicaIdsBytes = 64 * 1024;
inline constexpr size_t kMaxCostEstimateBytes = 4096;  // cost_estimate_json: for profilers only
inline constexpr uint64_t kBufferAlignment = 256;
inline constexpr int64_t kMaxBatch = 1 << 16;                 // launches of one vmapped call
inline constexpr int64_t kMaxBatchStride = int64_t{1} << 40;  // bytes between batch elements
inline constexpr size_t kKernelHashBytes = 32;
// TMA descriptors (CUtensorMap) the runtime builds for a kernel's parameters.
inline constexpr int kMaxTensorMaps = 16;  // per call
// Under vmap each batch element has its own descriptors (one per tensor map
// and element, 136 bytes each per device): batch_size * tensor maps at most.
inline constexpr int64_t kMaxBatchedTensorMaps = 4096;
inline constexpr int64_t kTensorMapCode = 1 << 16;  // param_order code of tensor map m: kTensorMapCode + m
inline constexpr int kTensorMapFields = 26;         // i64 values per map in `tensor_maps`
inline constexpr int kTensorMapBytes = 128;         // sizeof(CUtensorMap)
inline constexpr int kMaxTensorRank = 5;
inline constexpr int kMaxTensorMapDataType = 12;  // CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ
// The CuTe target's `host_args`: per argument of the module's host function (after the stream) three
// values, (kind, buffer, dimension). kind 1: buffer's device address; kind 2: dimension `dimension` of
// buffer's shape (int64; with vmap, of the element: a batched buffer's leading dimension is skipped).
inline constexpr int kHostArgFields = 3;
inline constexpr int kHostArgAddress = 1;
inline constexpr int kHostArgDimension = 2;
inline constexpr int kMaxHostArgDimension = 63;

// ------------------------------------------------------------- attributes

// The attributes of one custom call, as decoded, before validation.
// Absent optional attributes keep these defaults.
struct LaunchAttributes {
  std::string kernel_hash;
  std::string kernel_name = "<unnamed>";
  std::string call_site = "<unknown call site>";
  bool use_custom_barrier = false;
  bool uses_xla_collective_metadata = false;
  std::vector<int64_t> grid, block, cluster;
  int64_t smem_bytes = 0;
  bool uses_pdl = false;
  int64_t num_inputs = 0;
  std::optional<int64_t> num_outputs;  // absent in artifacts made before it existed
  std::vector<int64_t> param_order;
  std::vector<int64_t> scalar_sizes;
  std::string scalar_data;
  std::vector<int64_t> poison_outputs;
  int64_t batch_size = 1;                // vmap: launches, one per batch element
  std::vector<int64_t> batch_strides;    // bytes between elements, per buffer; 0: shared
  std::vector<int64_t> tensor_maps;      // kTensorMapFields values per TMA descriptor (TensorMapSpec)
  std::vector<int64_t> zero_outputs;     // outputs zeroed before every launch
  std::vector<int64_t> launch_programs;  // contract v2: grid and scalars from symbolic shapes (launch_programs.h)
  // Collective target only.
  std::string xla_replica_ids;
  std::string symmetric_memory_parameters;
  bool skip_device_barrier = false;
  // Plain target only: present for a kernel that uses NVSHMEM, one 0/1 flag
  // per buffer saying which are staged through the symmetric heap.
  std::string nvshmem_symmetric;
  // The call's cost for profilers (JSON, as jax-triton writes it): bounded, never read by the runtime.
  std::string cost_estimate_json;
  // The CuTe target only: the host function's arguments after the stream (kHostArgFields values each).
  std::vector<int64_t> host_args;
};

// How a lookup of one attribute went.
enum class Lookup { kFound, kMissing, kWrongType };

// Decodes every contract attribute from `source`, which provides
//   Lookup Bool(const char*, bool*), Int(const char*, int64_t*),
//   Ints(const char*, std::vector<int64_t>*) (array<i32>), Ints64(...) (array<i64>),
//   Bytes(const char*, std::string*, size_t limit)
// (Bytes fails with kWrongType past `limit` bytes). The names and types here
// are the contract's; an absent required attribute or a wrong type is an
// error naming it.
template <typename Source>
bool DecodeLaunchAttributes(Source& source, LaunchAttributes* a, std::string* error) {
  bool ok = true;
  auto check = [&](Lookup found, const char* name, bool required, const char* type) {
    if (!ok) return;
    if (found == Lookup::kWrongType) {
      *error = std::string("attribute '") + name + "' has the wrong type or size; the contract says " + type;
      ok = false;
    } else if (found == Lookup::kMissing && required) {
      *error = std::string("the custom call has no '") + name +
               "' attribute; it was not lowered by jax_mosaic_ffi's mosaic_kernel";
      ok = false;
    }
  };
  constexpr bool kRequired = true, kOptional = false;
  check(source.Bytes("kernel_hash", &a->kernel_hash, 1024), "kernel_hash", kRequired, "32 bytes");
  check(source.Bytes("kernel_name", &a->kernel_name, 1 << 16), "kernel_name", kOptional, "a string");
  check(source.Bytes("call_site", &a->call_site, 1 << 16), "call_site", kOptional, "a string");
  check(source.Bool("use_custom_barrier", &a->use_custom_barrier), "use_custom_barrier", kOptional, "a bool");
  check(source.Bool("uses_xla_collective_metadata", &a->uses_xla_collective_metadata), "uses_xla_collective_metadata",
        kOptional, "a bool");
  check(source.Ints("grid", &a->grid), "grid", kRequired, "array<i32> of 3");
  check(source.Ints("block", &a->block), "block", kRequired, "array<i32> of 3");
  check(source.Ints("cluster", &a->cluster), "cluster", kRequired, "array<i32> of 3");
  check(source.Int("smem_bytes", &a->smem_bytes), "smem_bytes", kOptional, "i32");
  check(source.Bool("uses_pdl", &a->uses_pdl), "uses_pdl", kOptional, "a bool");
  check(source.Int("num_inputs", &a->num_inputs), "num_inputs", kRequired, "i32");
  int64_t num_outputs = 0;
  Lookup outputs = source.Int("num_outputs", &num_outputs);
  check(outputs, "num_outputs", kOptional, "i32");
  if (outputs == Lookup::kFound) a->num_outputs = num_outputs;
  check(source.Ints("param_order", &a->param_order), "param_order", kRequired, "array<i32>");
  check(source.Ints("scalar_sizes", &a->scalar_sizes), "scalar_sizes", kOptional, "array<i32>");
  check(source.Bytes("scalar_data", &a->scalar_data, 8 * kMaxParams), "scalar_data", kOptional, "8 bytes per scalar");
  check(source.Ints("poison_outputs", &a->poison_outputs), "poison_outputs", kOptional, "array<i32>");
  check(source.Int("batch_size", &a->batch_size), "batch_size", kOptional, "i32");
  check(source.Ints64("batch_strides", &a->batch_strides), "batch_strides", kOptional, "array<i64>");
  check(source.Ints64("tensor_maps", &a->tensor_maps), "tensor_maps", kOptional, "array<i64>");
  check(source.Ints("zero_outputs", &a->zero_outputs), "zero_outputs", kOptional, "array<i32>");
  check(source.Ints64("launch_programs", &a->launch_programs), "launch_programs", kOptional, "array<i64>");
  check(source.Bytes("xla_replica_ids", &a->xla_replica_ids, kMaxReplicaIdsBytes), "xla_replica_ids", kOptional,
        "a string of device ids");
  // The anchor's older name for the same flags is read too.
  Lookup symmetric = source.Bytes("symmetric_memory_parameters", &a->symmetric_memory_parameters, 4 * kMaxBuffers);
  if (symmetric == Lookup::kMissing) {
    symmetric = source.Bytes("multimem_parameters", &a->symmetric_memory_parameters, 4 * kMaxBuffers);
  }
  check(symmetric, "symmetric_memory_parameters", kOptional, "a string of 0/1 flags");
  check(source.Bool("skip_device_barrier", &a->skip_device_barrier), "skip_device_barrier", kOptional, "a bool");
  check(source.Bytes("nvshmem_symmetric", &a->nvshmem_symmetric, 4 * kMaxBuffers), "nvshmem_symmetric", kOptional,
        "a string of 0/1 flags");
  check(source.Bytes("cost_estimate_json", &a->cost_estimate_json, kMaxCostEstimateBytes), "cost_estimate_json",
        kOptional, "a string of at most 4096 bytes");
  check(source.Ints("host_args", &a->host_args), "host_args", kOptional, "array<i32>");
  return ok;
}

// --------------------------------------------------------------- the spec

// A kernel parameter: buffer `index` (inputs, then outputs), or scalar `index`.
struct Param {
  enum Kind : uint8_t { kBuffer, kScalar, kTensorMap } kind;
  uint16_t index;
};

// One TMA descriptor to encode with cuTensorMapEncodeTiled from buffer
// `buffer`'s address. The enums hold the driver's CUtensorMap* values. Dims,
// box and element strides are innermost first; strides[i] is the byte stride
// of dimension i + 1. `attributes` layout, kTensorMapFields i64 each:
//   buffer, data_type, rank, interleave, swizzle, l2_promotion, oob_fill,
//   dims[5], strides[4], box[5], element_strides[5]
// (entries past `rank` must be 1, and 0 for strides).
struct TensorMapSpec {
  uint16_t buffer = 0;
  uint8_t data_type = 0, rank = 1, interleave = 0, swizzle = 0, l2_promotion = 0, oob_fill = 0;
  uint8_t element_bytes = 1;
  uint8_t alignment = 16;  // the base address must be this aligned
  uint16_t param = 0;      // its position among the kernel's parameters
  std::array<uint64_t, 5> dims{};
  std::array<uint64_t, 4> strides{};
  std::array<uint32_t, 5> box{};
  std::array<uint32_t, 5> element_strides{};
  uint64_t extent_bytes = 0;  // the buffer must hold at least this many bytes
};

struct LaunchPrograms;  // launch_programs.h

// One argument of a CuTe DSL host function (after the stream): a buffer's address or one of its dimensions.
struct HostArg {
  uint8_t kind;       // kHostArgAddress or kHostArgDimension
  uint8_t dimension;  // kHostArgDimension: 0..kMaxHostArgDimension
  uint16_t buffer;
};

// A validated launch: everything the runtime needs, all in range.
struct LaunchSpec {
  std::string who;  // "mosaic_kernel 'add' at model.py:12 (f)", for messages
  std::array<uint32_t, 3> grid{}, block{}, cluster{};
  uint32_t smem_bytes = 0;
  bool uses_pdl = false;
  bool has_cluster = false;           // more than one block per cluster
  bool non_portable_cluster = false;  // more than 8
  int num_inputs = 0;
  int num_buffers = 0;            // inputs plus outputs
  std::vector<Param> params;      // in the kernel's order (the metadata pointer not included)
  std::vector<uint64_t> scalars;  // one 8-byte slot per scalar, value in the low bytes
  std::vector<uint8_t> scalar_sizes;
  std::vector<size_t> param_sizes;      // what the kernel's signature must be, metadata pointer included
  std::vector<int> poison_buffers;      // debug: buffers filled with 0xFF before the launch
  uint32_t batch_size = 1;              // vmap: one launch per element, pointers moved by...
  std::vector<uint64_t> batch_strides;  // ...these bytes per element and buffer (empty when 1)
  std::vector<TensorMapSpec> tensor_maps;
  std::vector<int> zero_buffers;  // buffers zeroed before every launch (zero_outputs)
  // Grid dimensions and scalars computed from the buffers' shapes (contract v2); null when none are.
  std::shared_ptr<const LaunchPrograms> programs;
  // Collective target only.
  bool collective = false;
  std::vector<std::vector<int32_t>> cliques;  // device ordinals of each clique
  std::vector<bool> symmetric;                // per buffer
  bool skip_device_barrier = false;
  // NVSHMEM calls (plain target): the kernel's module needs NVSHMEM, and these
  // buffers (per buffer) are copied through the symmetric heap.
  bool nvshmem = false;
  std::vector<bool> nvshmem_symmetric;
  // The CuTe target: the module's host function launches; these are its arguments.
  bool host_launch = false;
  std::vector<HostArg> host_args;
};

// "mosaic_kernel 'add' at model.py:12 (f)": how messages name a call site.
std::string Who(const LaunchAttributes& a);

// Checks `a` (for the collective target when `collective`) and fills `spec`.
// On failure returns false with `*error` naming the attribute and the fix;
// `spec->who` is filled either way, for the caller's message.
bool ValidateLaunch(const LaunchAttributes& a, bool collective, LaunchSpec* spec, std::string* error);

// "0,1,2,3" is one clique; cliques are separated by ';'. Each device id may
// appear once, below kMaxDevices.
bool ParseCliques(std::string_view ids, std::vector<std::vector<int32_t>>* cliques, std::string* error);

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CONTRACT_H_
