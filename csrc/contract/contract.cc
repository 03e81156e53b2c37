#include "contract/contract.h"

#include <algorithm>
#include <string>

#include "contract/checker.h"
#include "contract/launch_programs.h"

namespace jmf {

std::string Label(std::string_view text) {
  std::string out;
  const size_t end = std::min(text.size(), kMaxLabelBytes);
  for (size_t i = 0; i < end;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool valid = length > 0 && i + length <= end;
    for (size_t k = 1; valid && k < length; ++k) valid = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
    if (!valid || (length == 1 && (c < 0x20 || c == 0x7f))) {
      out += '?';
      ++i;
      continue;
    }
    out.append(text.substr(i, length));
    i += length;
  }
  if (text.size() > kMaxLabelBytes) out += "...";
  return out;
}

bool ParseCliques(std::string_view ids, std::vector<std::vector<int32_t>>* cliques, std::string* error) {
  cliques->clear();
  if (ids.empty() || ids.size() > kMaxReplicaIdsBytes) {
    *error = "xla_replica_ids must list the devices of each clique, like \"0,1,2,3\"";
    return false;
  }
  std::array<bool, kMaxDevices> seen{};
  std::vector<int32_t> current;
  int64_t number = -1;
  for (size_t i = 0; i <= ids.size(); ++i) {
    const char c = i < ids.size() ? ids[i] : ';';
    if (c >= '0' && c <= '9') {
      number = (number < 0 ? 0 : number) * 10 + (c - '0');
      if (number >= kMaxDevices) {
        *error =
            "xla_replica_ids names a device id of " + Num(number) + " or more; ids must be below " + Num(kMaxDevices);
        return false;
      }
    } else if (c == ',' || c == ';') {
      if (number < 0) {
        *error = "xla_replica_ids '" + Label(ids) + "' is malformed: an empty entry";
        return false;
      }
      if (seen[number]) {
        *error = "xla_replica_ids names device " + Num(number) + " twice";
        return false;
      }
      seen[number] = true;
      current.push_back(static_cast<int32_t>(number));
      number = -1;
      if (c == ';') {
        if (current.size() > static_cast<size_t>(kMaxPeers)) {
          *error = "xla_replica_ids has a clique of more than " + Num(kMaxPeers) + " devices";
          return false;
        }
        cliques->push_back(std::move(current));
        current.clear();
      }
    } else if (c != ' ') {
      *error = "xla_replica_ids '" + Label(ids) + "' is malformed: only digits, ',' and ';' may appear";
      return false;
    }
  }
  return true;
}

std::string Who(const LaunchAttributes& a) {
  return "mosaic_kernel '" + Label(a.kernel_name) + "' at " + Label(a.call_site);
}

namespace {

// The validation stages, in order; each fills its part of `spec` or fails
// with the message, and may rely on the stages before it.

bool CheckHeader(const LaunchAttributes& a, bool collective, Checker& check) {
  if (a.kernel_hash.size() != kKernelHashBytes) {
    return check.Fail("kernel_hash is " + Num(static_cast<int64_t>(a.kernel_hash.size())) +
                      " bytes; it must be the 32-byte sha256 of the module");
  }
  if (a.use_custom_barrier) return check.Fail("use_custom_barrier=true is not supported on GPUs");
  if (a.uses_xla_collective_metadata != collective) {
    return check.Fail(std::string("uses_xla_collective_metadata=") +
                      (a.uses_xla_collective_metadata ? "true" : "false") +
                      " does not match the custom call target; lower it again with this jax_mosaic_ffi");
  }
  return true;
}

bool CheckLaunchShape(const LaunchAttributes& a, LaunchSpec* spec, Checker& check) {
  if (!check.Dims("grid", a.grid, kMaxGrid, &spec->grid) || !check.Dims("block", a.block, kMaxBlock, &spec->block) ||
      !check.Dims("cluster", a.cluster, {kMaxClusterBlocks, kMaxClusterBlocks, kMaxClusterBlocks}, &spec->cluster)) {
    return false;
  }
  // Every factor is bounded above, so these products fit in 64 bits.
  const int64_t threads = int64_t{spec->block[0]} * spec->block[1] * spec->block[2];
  if (threads > kMaxThreadsPerBlock) {
    return check.Fail("block (" + Num(spec->block[0]) + ", " + Num(spec->block[1]) + ", " + Num(spec->block[2]) +
                      ") has " + Num(threads) + " threads; a block holds at most " + Num(kMaxThreadsPerBlock));
  }
  const int64_t cluster_blocks = int64_t{spec->cluster[0]} * spec->cluster[1] * spec->cluster[2];
  if (cluster_blocks > kMaxClusterBlocks) {
    return check.Fail("a cluster of " + Num(cluster_blocks) + " blocks is more than the " + Num(kMaxClusterBlocks) +
                      " any GPU allows");
  }
  for (int i = 0; i < 3; ++i) {
    if (spec->grid[i] % spec->cluster[i] != 0) {
      return check.Fail("grid[" + Num(i) + "] = " + Num(spec->grid[i]) + " is not a multiple of cluster[" + Num(i) +
                        "] = " + Num(spec->cluster[i]));
    }
  }
  spec->has_cluster = cluster_blocks > 1;
  spec->non_portable_cluster = cluster_blocks > kPortableClusterBlocks;
  if (a.smem_bytes < 0 || a.smem_bytes > kMaxSmemBytes) {
    return check.Fail("smem_bytes = " + Num(a.smem_bytes) + (a.smem_bytes < 0 ? " is negative" : " is out of range") +
                      "; it must be 0.." + Num(kMaxSmemBytes));
  }
  spec->smem_bytes = static_cast<uint32_t>(a.smem_bytes);
  spec->uses_pdl = a.uses_pdl;
  return true;
}

// Scalars: sizes 1..8, 8 bytes of data each.
bool CheckScalars(const LaunchAttributes& a, LaunchSpec* spec, Checker& check) {
  if (a.scalar_sizes.size() > static_cast<size_t>(kMaxParams)) {
    return check.Fail("more than " + Num(kMaxParams) + " scalars");
  }
  if (a.scalar_data.size() != 8 * a.scalar_sizes.size()) {
    return check.Fail("scalar_data holds " + Num(static_cast<int64_t>(a.scalar_data.size())) + " bytes for " +
                      Num(static_cast<int64_t>(a.scalar_sizes.size())) + " scalars; it must hold 8 bytes per scalar");
  }
  for (size_t k = 0; k < a.scalar_sizes.size(); ++k) {
    if (a.scalar_sizes[k] < 1 || a.scalar_sizes[k] > kMaxScalarBytes) {
      return check.Fail("scalar_sizes[" + Num(static_cast<int64_t>(k)) + "] = " + Num(a.scalar_sizes[k]) +
                        "; scalars are 1 to 8 bytes");
    }
    spec->scalar_sizes.push_back(static_cast<uint8_t>(a.scalar_sizes[k]));
    uint64_t value = 0;
    for (int b = 0; b < 8; ++b) value |= uint64_t{static_cast<unsigned char>(a.scalar_data[8 * k + b])} << (8 * b);
    spec->scalars.push_back(value);
  }
  return true;
}

// How many buffers the call has, inputs then outputs.
bool CheckBuffers(const LaunchAttributes& a, LaunchSpec* spec, Checker& check) {
  if (a.num_inputs < 0 || a.num_inputs > kMaxBuffers) {
    return check.Fail("num_inputs = " + Num(a.num_inputs) + " is out of range 0.." + Num(kMaxBuffers));
  }
  if (a.param_order.size() > static_cast<size_t>(kMaxParams)) {
    return check.Fail("param_order has " + Num(static_cast<int64_t>(a.param_order.size())) +
                      " entries; a kernel takes at most " + Num(kMaxParams) + " parameters");
  }
  int64_t num_buffers = 0;
  if (a.num_outputs.has_value()) {
    if (*a.num_outputs < 0 || *a.num_outputs > kMaxBuffers - a.num_inputs) {
      return check.Fail("num_outputs = " + Num(*a.num_outputs) +
                        " is out of range: inputs and outputs together are at most " + Num(kMaxBuffers));
    }
    num_buffers = a.num_inputs + *a.num_outputs;
  } else {
    // Contract v1 before num_outputs: every buffer is a parameter.
    for (int64_t code : a.param_order) {
      if (code >= 0 && code < kMaxBuffers) num_buffers = std::max(num_buffers, code + 1);
    }
  }
  if (a.num_inputs > num_buffers) {
    return check.Fail("num_inputs = " + Num(a.num_inputs) + " is more than the " + Num(num_buffers) + " buffers");
  }
  spec->num_inputs = static_cast<int>(a.num_inputs);
  spec->num_buffers = static_cast<int>(num_buffers);
  return true;
}

// The kernel's parameters: buffers, scalars and tensor maps in param_order.
bool CheckParams(const LaunchAttributes& a, bool collective, LaunchSpec* spec, Checker& check) {
  if (!CheckBuffers(a, spec, check)) return false;
  const int64_t num_buffers = spec->num_buffers;
  std::vector<bool> scalar_seen(a.scalar_sizes.size(), false);
  if (a.tensor_maps.size() % kTensorMapFields != 0 ||
      a.tensor_maps.size() > size_t{kTensorMapFields} * kMaxTensorMaps) {
    return check.Fail("tensor_maps holds " + Num(static_cast<int64_t>(a.tensor_maps.size())) +
                      " values; it must hold " + Num(kTensorMapFields) + " per tensor map, for at most " +
                      Num(kMaxTensorMaps) + " maps");
  }
  const int64_t num_maps = static_cast<int64_t>(a.tensor_maps.size()) / kTensorMapFields;
  spec->tensor_maps.assign(num_maps, TensorMapSpec());
  std::vector<bool> map_seen(num_maps, false);
  for (size_t i = 0; i < a.param_order.size(); ++i) {
    const int64_t code = a.param_order[i];
    if (code >= kTensorMapCode && code < kTensorMapCode + kMaxTensorMaps) {
      const int64_t m = code - kTensorMapCode;
      if (m >= num_maps || map_seen[m]) {
        return check.Fail("param_order[" + Num(static_cast<int64_t>(i)) + "] = " + Num(code) + " names tensor map " +
                          Num(m) + ", which is missing or named twice (the call has " + Num(num_maps) + ")");
      }
      map_seen[m] = true;
      spec->tensor_maps[m].param = static_cast<uint16_t>(spec->params.size());
      spec->params.push_back(Param{Param::kTensorMap, static_cast<uint16_t>(m)});
      spec->param_sizes.push_back(kTensorMapBytes);
      continue;
    }
    if (code >= 0) {
      if (code >= num_buffers) {
        return check.Fail("param_order[" + Num(static_cast<int64_t>(i)) + "] = " + Num(code) + " names buffer " +
                          Num(code) + ", but the call has " + Num(num_buffers) + " buffers");
      }
      spec->params.push_back(Param{Param::kBuffer, static_cast<uint16_t>(code)});
      spec->param_sizes.push_back(8);
      continue;
    }
    const int64_t k = -(code + 1);  // code < 0, so code + 1 cannot overflow
    if (k >= static_cast<int64_t>(a.scalar_sizes.size()) || scalar_seen[k]) {
      return check.Fail("param_order[" + Num(static_cast<int64_t>(i)) + "] = " + Num(code) + " names scalar " + Num(k) +
                        ", which is missing or named twice");
    }
    scalar_seen[k] = true;
    spec->params.push_back(Param{Param::kScalar, static_cast<uint16_t>(k)});
    spec->param_sizes.push_back(spec->scalar_sizes[k]);
  }
  for (int64_t m = 0; m < num_maps; ++m) {
    if (!map_seen[m]) return check.Fail("tensor map " + Num(m) + " is not named in param_order");
  }
  if (collective) spec->param_sizes.push_back(8);  // the metadata pointer, last
  if (spec->param_sizes.size() > static_cast<size_t>(kMaxParams)) {
    return check.Fail("more than " + Num(kMaxParams) + " kernel parameters");
  }
  return true;
}

// An attribute listing outputs to fill (poison_outputs, zero_outputs): each
// in range and named once, appended to `buffers` as buffer indices.
bool CheckOutputList(const char* name, const std::vector<int64_t>& outputs, const LaunchSpec& spec,
                     std::vector<int>* buffers, Checker& check) {
  const int64_t num_outputs = spec.num_buffers - spec.num_inputs;
  std::vector<bool> named(num_outputs, false);
  for (int64_t output : outputs) {
    if (output < 0 || output >= num_outputs || named[output]) {
      return check.Fail(std::string(name) + " names output " + Num(output) + ", but the call has " + Num(num_outputs) +
                        " outputs" + (output >= 0 && output < num_outputs ? " and names each once" : ""));
    }
    named[output] = true;
    buffers->push_back(static_cast<int>(spec.num_inputs + output));
  }
  return true;
}

// Debug poisoning, zeroed outputs and vmap's batch, all per buffer.
bool CheckPerBuffer(const LaunchAttributes& a, bool collective, LaunchSpec* spec, Checker& check) {
  if (!CheckOutputList("poison_outputs", a.poison_outputs, *spec, &spec->poison_buffers, check) ||
      !CheckOutputList("zero_outputs", a.zero_outputs, *spec, &spec->zero_buffers, check)) {
    return false;
  }
  if (a.batch_size < 1 || a.batch_size > kMaxBatch) {
    return check.Fail("batch_size = " + Num(a.batch_size) + " is out of range 1.." + Num(kMaxBatch));
  }
  spec->batch_size = static_cast<uint32_t>(a.batch_size);
  if (a.batch_size == 1) {
    return a.batch_strides.empty() || check.Fail("batch_strides is given without a batch_size above 1");
  }
  if (collective) return check.Fail("a collective kernel cannot be batched (vmap) on its own devices");
  const int64_t maps = static_cast<int64_t>(spec->tensor_maps.size());
  if (maps * a.batch_size > kMaxBatchedTensorMaps) {
    return check.Fail("a batch of " + Num(a.batch_size) + " with " + Num(maps) + " tensor maps needs a descriptor " +
                      "per element and map, more than " + Num(kMaxBatchedTensorMaps) + "; vmap over fewer elements");
  }
  if (a.batch_strides.size() != static_cast<size_t>(spec->num_buffers)) {
    return check.Fail("batch_strides has " + Num(static_cast<int64_t>(a.batch_strides.size())) + " entries for " +
                      Num(spec->num_buffers) + " buffers");
  }
  for (size_t b = 0; b < a.batch_strides.size(); ++b) {
    const int64_t stride = a.batch_strides[b];
    const bool output = static_cast<int64_t>(b) >= spec->num_inputs;
    if (stride < (output ? 1 : 0) || stride > kMaxBatchStride) {
      return check.Fail("batch_strides[" + Num(static_cast<int64_t>(b)) + "] = " + Num(stride) + " is out of range " +
                        (output ? "1" : "0") + ".." + Num(kMaxBatchStride) +
                        (output ? " (every batch element writes its own part of an output)" : ""));
    }
    spec->batch_strides.push_back(static_cast<uint64_t>(stride));
  }
  return CheckTensorMapBatch(*spec, check);
}

// One 0/1 flag per buffer ("1,0,1"), into `flags`.
bool CheckBufferFlags(const char* name, const std::string& text, const LaunchSpec& spec, std::vector<bool>* flags,
                      Checker& check) {
  flags->assign(spec.num_buffers, false);
  size_t count = 0;
  for (char c : text) {
    if (c == '0' || c == '1') {
      if (count < flags->size()) (*flags)[count] = c == '1';
      ++count;
    } else if (c != ',' && c != ' ') {
      return check.Fail(std::string(name) + " must be 0/1 flags, got '" + Label(text) + "'");
    }
  }
  if (count != static_cast<size_t>(spec.num_buffers)) {
    return check.Fail(std::string(name) + " has " + Num(static_cast<int64_t>(count)) + " flags for " +
                      Num(spec.num_buffers) + " buffers");
  }
  return true;
}

bool CheckCollective(const LaunchAttributes& a, LaunchSpec* spec, Checker& check, std::string* error) {
  if (!ParseCliques(a.xla_replica_ids, &spec->cliques, error)) return false;
  spec->symmetric.assign(spec->num_buffers, false);
  spec->skip_device_barrier = a.skip_device_barrier;
  if (a.symmetric_memory_parameters.empty()) return true;
  return CheckBufferFlags("symmetric_memory_parameters", a.symmetric_memory_parameters, *spec, &spec->symmetric, check);
}

// An NVSHMEM call: its PEs are NVSHMEM's (one per process), not a clique of
// the collective target, and each launch is one grid, never a vmap batch.
bool CheckNvshmem(const LaunchAttributes& a, bool collective, LaunchSpec* spec, Checker& check) {
  if (a.nvshmem_symmetric.empty()) return true;
  if (collective) return check.Fail("nvshmem_symmetric is for the plain target; NVSHMEM calls have no clique metadata");
  if (spec->batch_size != 1) return check.Fail("a kernel that uses NVSHMEM cannot be batched (vmap)");
  spec->nvshmem = true;
  return CheckBufferFlags("nvshmem_symmetric", a.nvshmem_symmetric, *spec, &spec->nvshmem_symmetric, check);
}

bool CheckPrograms(const LaunchAttributes& a, bool collective, LaunchSpec* spec, std::string* error) {
  if (a.launch_programs.empty()) return true;
  if (collective) {
    *error = "launch_programs is not supported on the collective target; export the call once per concrete size";
    return false;
  }
  auto programs = std::make_shared<LaunchPrograms>();
  if (!CheckLaunchPrograms(a.launch_programs, *spec, programs.get(), error)) return false;
  spec->programs = std::move(programs);
  return true;
}

// The CuTe target: the module's host function chooses the grid, block and shared memory and launches, so
// the call carries none of them (grid, block and cluster all 1, no parameters) but its host_args.
bool CheckHostLaunch(const LaunchAttributes& a, bool collective, LaunchSpec* spec, Checker& check) {
  if (a.host_args.empty()) return true;
  spec->host_launch = true;
  if (collective || spec->nvshmem) return check.Fail("host_args is for the CuTe target alone");
  const bool ones = spec->grid == std::array<uint32_t, 3>{1, 1, 1} && spec->block == std::array<uint32_t, 3>{1, 1, 1} &&
                    spec->cluster == std::array<uint32_t, 3>{1, 1, 1};
  if (!ones || spec->smem_bytes != 0 || spec->uses_pdl || !spec->params.empty() || !spec->tensor_maps.empty() ||
      spec->programs != nullptr) {
    return check.Fail(
        "a call with host_args launches through its module's host function: grid, block and cluster must be "
        "[1, 1, 1], and smem_bytes, uses_pdl, param_order, scalars, tensor_maps and launch_programs empty");
  }
  if (a.host_args.size() % kHostArgFields != 0 || a.host_args.size() > size_t{kHostArgFields} * kMaxParams) {
    return check.Fail("host_args holds " + Num(static_cast<int64_t>(a.host_args.size())) + " values; it must hold " +
                      Num(kHostArgFields) + " per argument, for at most " + Num(kMaxParams) + " arguments");
  }
  for (size_t i = 0; i < a.host_args.size(); i += kHostArgFields) {
    const int64_t kind = a.host_args[i], buffer = a.host_args[i + 1], dimension = a.host_args[i + 2];
    const std::string which = "host_args entry " + Num(static_cast<int64_t>(i / kHostArgFields));
    if (kind != kHostArgAddress && kind != kHostArgDimension) {
      return check.Fail(which + " has kind " + Num(kind) + "; 1 is a buffer's address, 2 one of its dimensions");
    }
    if (buffer < 0 || buffer >= spec->num_buffers) {
      return check.Fail(which + " names buffer " + Num(buffer) + ", but the call has " + Num(spec->num_buffers));
    }
    if (dimension < 0 || dimension > kMaxHostArgDimension || (kind == kHostArgAddress && dimension != 0)) {
      return check.Fail(which + " names dimension " + Num(dimension) + "; dimensions are 0.." +
                        Num(kMaxHostArgDimension) + " (0 for an address)");
    }
    spec->host_args.push_back(
        HostArg{static_cast<uint8_t>(kind), static_cast<uint8_t>(dimension), static_cast<uint16_t>(buffer)});
  }
  return true;
}

}  // namespace

bool ValidateLaunch(const LaunchAttributes& a, bool collective, LaunchSpec* spec, std::string* error) {
  *spec = LaunchSpec();
  spec->who = Who(a);
  spec->collective = collective;
  Checker check(error);
  return CheckHeader(a, collective, check) && CheckLaunchShape(a, spec, check) && CheckScalars(a, spec, check) &&
         CheckParams(a, collective, spec, check) && CheckTensorMaps(a, spec, check) &&
         CheckPerBuffer(a, collective, spec, check) && CheckNvshmem(a, collective, spec, check) &&
         (!collective || CheckCollective(a, spec, check, error)) && CheckPrograms(a, collective, spec, error) &&
         CheckHostLaunch(a, collective, spec, check);
}

}  // namespace jmf
