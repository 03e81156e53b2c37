// CollectiveState across processes: the symmetric workspace that every rank
// maps (peers/cross_process.h), the parameter slots laid out in it, the
// metadata pointing into it, and the copies into and out of it around a
// launch. The in-process half (peer access, the host rendezvous of one
// process, the device barrier) is collective.cc.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "ffi/status.h"
#include "peers/collective.h"

namespace jmf {

// Across processes: parameters in the workspace (declared symmetric; every
// input when the kernel declares none).
bool CollectiveState::InWorkspace(int buffer) const {
  if (!any_symmetric_) return buffer < num_inputs_;
  return buffer < static_cast<int>(symmetric_.size()) && symmetric_[buffer];
}

ffi::Error CollectiveState::InitializeShared(int32_t device, int64_t run_id, CUstream stream, const Buffers& buffers) {
  DeviceResources& res = devices_[device];
  if (res.workspace == nullptr) JMF_RETURN_IF_ERROR(SetUpWorkspace(device, buffers));
  // Once per execution (XLA may call twice for one: see Initialize).
  if (run_id != res.initialized_run) {
    JMF_RETURN_IF_ERROR(res.workspace->Arrive(timeout_, who_ + " on device " + std::to_string(res.global)));
    res.initialized_run = run_id;
  }
  const int rank = rank_of_[res.global];
  const size_t peers = cliques_[clique_of_[res.global]].devices.size();
  for (int b = 0; b < num_buffers_; ++b) {
    if (!InWorkspace(b))
      res.metadata[kMetadataHeaderWords + b * peers + rank] = reinterpret_cast<uintptr_t>(buffers.ptrs[b]);
  }
  return CopyMetadata(res, stream);
}

namespace {
uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// FNV-1a: the same key in every process of one build.
std::string KeyHash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}
}  // namespace

ffi::Error CollectiveState::SetUpWorkspace(int32_t device, const Buffers& buffers) {
  DeviceResources& res = devices_[device];
  const int c = clique_of_[res.global];
  const Clique& clique = cliques_[c];
  const int peers = static_cast<int>(clique.devices.size());
  uint64_t offset = RoundUp(kBarrierAreaBytes + MetadataWords(peers) * sizeof(uint64_t), kBufferAlignment);
  std::string identity = who_ + "|clique " + std::to_string(c);
  res.slots.clear();
  for (int b = 0; b < num_buffers_; ++b) {
    if (!InWorkspace(b)) continue;
    res.slots.push_back(Slot{b, offset, buffers.bytes[b]});
    offset += RoundUp(std::max<uint64_t>(buffers.bytes[b], 1), kBufferAlignment);
    identity += "|" + std::to_string(b) + ":" + std::to_string(buffers.bytes[b]);
  }
  PeerExchangeRequest request;
  request.key = "site-" + KeyHash(identity) + "/clique-" + std::to_string(c);
  request.rank = rank_of_[res.global];
  request.device_ids = clique.devices;
  request.timeout = timeout_;
  request.who = who_ + " on device " + std::to_string(res.global);
  auto workspace = SharedWorkspace::Create(driver_, res.context, offset, request);
  if (!workspace.has_value()) return workspace.error();
  res.workspace = std::move(*workspace);
  FillSharedMetadata(res, request.rank, peers);
  return ffi::Error::Success();
}

void CollectiveState::FillSharedMetadata(DeviceResources& res, int rank, int peers) {
  const SharedWorkspace& ws = *res.workspace;
  const size_t p = static_cast<size_t>(num_buffers_);
  const uint64_t base = ws.base(rank) + kBarrierAreaBytes;
  const size_t multimem_offset = kMetadataHeaderWords + p * peers;
  const size_t areas_offset = multimem_offset + p;
  uint64_t* m = res.metadata.data();
  std::fill(res.metadata.begin(), res.metadata.end(), 0);
  m[0] = static_cast<uint64_t>(rank);
  m[1] = base + kMetadataHeaderWords * sizeof(uint64_t);
  m[2] = base + multimem_offset * sizeof(uint64_t);
  m[3] = static_cast<uint64_t>(peers);
  for (const Slot& slot : res.slots) {
    for (int r = 0; r < peers; ++r) m[kMetadataHeaderWords + slot.buffer * peers + r] = ws.base(r) + slot.offset;
  }
  for (int r = 0; r < peers; ++r) m[areas_offset + r] = ws.base(r);
  res.metadata_ptr = reinterpret_cast<void*>(base);
  res.barrier_args.areas = base + areas_offset * sizeof(uint64_t);
}

ffi::Error CollectiveState::BeforeLaunch(int32_t device, CUstream stream, const Buffers& buffers) {
  if (cross_process_) [[unlikely]] {
    if (device < 0 || device >= kMaxDevices || devices_[device].workspace == nullptr) {
      return ffi::Error::Internal(who_ + ": execute ran before initialize on device " + std::to_string(device));
    }
    const DeviceResources& res = devices_[device];
    const uint64_t base = res.workspace->base(rank_of_[res.global]);
    const Driver& driver = driver_;
    for (const Slot& slot : res.slots) {
      if (slot.buffer >= num_inputs_) continue;
      const auto from = reinterpret_cast<CUdeviceptr>(buffers.ptrs[slot.buffer]);
      if (CUresult r = driver.cuMemcpyDtoDAsync(base + slot.offset, from, slot.bytes, stream); r != CUDA_SUCCESS) {
        return ffi::Error::Internal(who_ + ": copying input " + std::to_string(slot.buffer) +
                                    " into the collective workspace: " + CudaErrorText(driver, r));
      }
    }
  }
  return LaunchBarrier(device, stream);
}

ffi::Error CollectiveState::AfterLaunch(int32_t device, CUstream stream, const Buffers& buffers) {
  if (!cross_process_) return ffi::Error::Success();
  const DeviceResources& res = devices_[device];
  const uint64_t base = res.workspace->base(rank_of_[res.global]);
  const Driver& driver = driver_;
  for (const Slot& slot : res.slots) {
    if (slot.buffer < num_inputs_) continue;
    const auto to = reinterpret_cast<CUdeviceptr>(buffers.ptrs[slot.buffer]);
    if (CUresult r = driver.cuMemcpyDtoDAsync(to, base + slot.offset, slot.bytes, stream); r != CUDA_SUCCESS) {
      return ffi::Error::Internal(who_ + ": copying output " + std::to_string(slot.buffer) +
                                  " out of the collective workspace: " + CudaErrorText(driver, r));
    }
  }
  return ffi::Error::Success();
}

}  // namespace jmf
