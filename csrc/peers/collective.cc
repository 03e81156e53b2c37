#include "peers/collective.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "driver/runtime_kernels.h"
#include "ffi/status.h"

namespace jmf {
namespace {

// Peer access is per ordered pair of contexts and lasts for the process.
ffi::Error EnablePeerAccess(const Driver& driver, int32_t device, int32_t peer, const std::string& who) {
  static std::mutex mutex;
  static auto* enabled = new std::set<std::pair<int32_t, int32_t>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (enabled->count({device, peer})) return ffi::Error::Success();
  CUdevice self_dev, peer_dev;
  if (driver.cuDeviceGet(&self_dev, device) != CUDA_SUCCESS || driver.cuDeviceGet(&peer_dev, peer) != CUDA_SUCCESS) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who + ": device " + std::to_string(peer) +
                          " of the clique is not visible in this "
                          "process. Collective kernels need every device of the clique in one process");
  }
  int can_access = 0;
  driver.cuDeviceCanAccessPeer(&can_access, self_dev, peer_dev);
  if (!can_access) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who + ": devices " + std::to_string(device) + " and " + std::to_string(peer) +
                          " cannot access each other's memory (no NVLink or PCIe peer-to-peer path). "
                          "Collective kernels need peer access between all devices of a clique");
  }
  CUcontext peer_context = nullptr;
  if (CUresult r = driver.cuDevicePrimaryCtxRetain(&peer_context, peer_dev); r != CUDA_SUCCESS) {
    return ffi::Error::Internal(who + ": cuDevicePrimaryCtxRetain: " + CudaErrorText(driver, r));
  }
  CUresult r = driver.cuCtxEnablePeerAccess(peer_context, 0);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
    return ffi::Error::Internal(who + ": enabling peer access from device " + std::to_string(device) + " to " +
                                std::to_string(peer) + ": " + CudaErrorText(driver, r));
  }
  enabled->insert({device, peer});
  return ffi::Error::Success();
}

// JAX_MOSAIC_FFI_PEER_TIMEOUT_S, default 60 s. A value that is not a
// positive finite number means the default; a huge one means a week, so the
// conversion to milliseconds (and to nanoseconds for the barrier) never overflows.
std::chrono::milliseconds PeerTimeout() {
  constexpr double kDefault = 60.0, kMax = 7 * 24 * 3600.0;
  const char* value = std::getenv("JAX_MOSAIC_FFI_PEER_TIMEOUT_S");
  double seconds = kDefault;
  if (value != nullptr) {
    char* end = nullptr;
    const double parsed = std::strtod(value, &end);
    if (end != value && parsed > 0 && std::isfinite(parsed)) seconds = std::min(parsed, kMax);
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

Rendezvous::Rendezvous(int participants, int words_each) : participants_(participants), words_(words_each) {
  for (Round& round : rounds_) {
    round.present.assign(participants, 0);
    round.data.assign(static_cast<size_t>(participants) * words_each, 0);
  }
}

ffi::Error Rendezvous::Exchange(int64_t run_id, int rank, const uint64_t* mine, uint64_t* all,
                                std::chrono::milliseconds timeout, const std::string& who) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  Round* round = nullptr;
  while (round == nullptr) {
    for (Round& r : rounds_) {
      if (r.run_id == run_id) round = &r;
    }
    if (round == nullptr) {
      for (Round& r : rounds_) {
        if (r.run_id == -1) {
          round = &r;
          round->run_id = run_id;
          break;
        }
      }
    }
    if (round == nullptr && changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return ffi::Error(ffi::ErrorCode::kDeadlineExceeded,
                        who + ": rank " + std::to_string(rank) +
                            " found no free rendezvous slot: earlier "
                            "executions of this kernel never completed on every peer");
    }
  }
  if (round->present[rank]) {
    return ffi::Error::Internal(who + ": rank " + std::to_string(rank) + " arrived twice for run " +
                                std::to_string(run_id));
  }
  std::memcpy(&round->data[static_cast<size_t>(rank) * words_], mine, sizeof(uint64_t) * words_);
  round->present[rank] = 1;
  if (++round->arrived == participants_) changed_.notify_all();
  if (!changed_.wait_until(lock, deadline, [&] { return round->arrived == participants_; })) {
    std::string missing;
    for (int r = 0; r < participants_; ++r) {
      if (!round->present[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    // Leave the round to the peers that did come; the slot frees when they give up too.
    round->present[rank] = 0;
    if (--round->arrived == 0) {
      round->run_id = -1;
      changed_.notify_all();
    }
    return ffi::Error(ffi::ErrorCode::kDeadlineExceeded,
                      who + ": rank " + std::to_string(rank) + " of " + std::to_string(participants_) + " waited " +
                          Seconds(timeout) + " s for peer rank(s) " + missing + " to run this kernel (run id " +
                          std::to_string(run_id) +
                          "); they never arrived. Every device of the mesh "
                          "axis must run the kernel: is it under a lax.cond or a branch some devices "
                          "skip? (JAX_MOSAIC_FFI_PEER_TIMEOUT_S sets the timeout)");
  }
  std::memcpy(all, round->data.data(), sizeof(uint64_t) * round->data.size());
  if (++round->departed == participants_) {
    round->run_id = -1;
    round->arrived = 0;
    round->departed = 0;
    std::fill(round->present.begin(), round->present.end(), 0);
    changed_.notify_all();
  }
  return ffi::Error::Success();
}

ffi::ErrorOr<std::unique_ptr<CollectiveState>> CollectiveState::Create(CollectiveInputs inputs) {
  std::unique_ptr<CollectiveState> state(new CollectiveState(inputs));
  state->clique_of_.fill(-1);
  state->rank_of_.fill(-1);
  // The contract bounds device ids below kMaxDevices, each in one clique, and
  // cliques to kMaxPeers devices, so the rendezvous is small.
  for (size_t c = 0; c < inputs.cliques.size(); ++c) {
    Clique clique;
    clique.devices = inputs.cliques[c];
    for (size_t r = 0; r < clique.devices.size(); ++r) {
      state->clique_of_[clique.devices[r]] = static_cast<int>(c);
      state->rank_of_[clique.devices[r]] = static_cast<int>(r);
    }
    clique.rendezvous = std::make_unique<Rendezvous>(static_cast<int>(clique.devices.size()), inputs.num_buffers + 1);
    bool has_local = false;
    for (int32_t d : clique.devices) {
      const bool local = IsLocalDevice(d);
      has_local = has_local || local;
      clique.cross_process = clique.cross_process || !local;
    }
    state->cross_process_ = state->cross_process_ || (has_local && clique.cross_process);
    state->cliques_.push_back(std::move(clique));
  }
  // A device alone in its clique has no one to wait for: no barrier kernel.
  const bool all_alone = std::all_of(inputs.cliques.begin(), inputs.cliques.end(),
                                     [](const std::vector<int32_t>& clique) { return clique.size() == 1; });
  state->skip_barrier_ = inputs.skip_device_barrier || all_alone;
  state->timeout_ = PeerTimeout();
  state->any_symmetric_ = std::find(inputs.symmetric.begin(), inputs.symmetric.end(), true) != inputs.symmetric.end();
  return state;
}

CollectiveState::~CollectiveState() {
  const Driver& driver = driver_;
  for (DeviceResources& device : devices_) {
    if (device.area != 0) {
      ScopedContext scoped(driver, device.context);
      driver.cuMemFree(device.area);
    }
  }
}

size_t CollectiveState::MetadataWords(int peers) const {
  const size_t p = static_cast<size_t>(num_buffers_);
  return kMetadataHeaderWords + p * peers + p + peers;
}

ffi::Error CollectiveState::Prepare(int32_t device, CUcontext context) {
  DeviceResources& res = devices_[device];
  if (res.ready) return ffi::Error::Success();
  std::lock_guard<std::mutex> lock(mutex_);
  if (res.ready) return ffi::Error::Success();
  const std::string& who = who_;
  const int32_t global = GlobalDeviceId(device);
  if (global < 0 || global >= kMaxDevices || clique_of_[global] < 0) {
    return ffi::Error::InvalidArgument(who + ": device " + std::to_string(global) + " (local ordinal " +
                                       std::to_string(device) +
                                       ") runs this collective kernel but is in no clique of xla_replica_ids");
  }
  const Clique& clique = cliques_[clique_of_[global]];
  JMF_RETURN_IF_ERROR(PrepareLocalPeers(device, clique));
  std::string error;
  CUfunction barrier = LoadRuntimeKernel(driver_, context, RuntimeKernel::kBarrier, &error);
  if (barrier == nullptr) return ffi::Error::Internal(who + ": " + error);
  const int peers = static_cast<int>(clique.devices.size());
  res.global = global;
  res.context = context;
  res.barrier = barrier;
  // Across processes the area lives in the shared workspace, made at the
  // first initialize (it is sized from the buffers).
  if (!clique.cross_process) JMF_RETURN_IF_ERROR(AllocateArea(res, peers));
  res.barrier_args.rank = static_cast<uint32_t>(rank_of_[global]);
  res.barrier_args.peers = static_cast<uint32_t>(peers);
  res.barrier_args.timeout_ns = static_cast<uint64_t>(timeout_.count()) * 1000000;
  res.deposit.assign(num_buffers_ + 1, 0);
  res.exchange.assign(static_cast<size_t>(peers) * (num_buffers_ + 1), 0);
  res.metadata.assign(MetadataWords(peers), 0);
  res.copied.assign(MetadataWords(peers), ~uint64_t{0});
  res.ready = true;
  return ffi::Error::Success();
}

// Peer access to the clique's devices in this process (all of them, unless
// the clique spans processes).
ffi::Error CollectiveState::PrepareLocalPeers(int32_t device, const Clique& clique) {
  const int32_t self = GlobalDeviceId(device);
  for (int32_t peer : clique.devices) {
    if (peer == self || !IsLocalDevice(peer)) continue;
    const int32_t ordinal = LocalOrdinal(peer);
    JMF_RETURN_IF_ERROR(EnablePeerAccess(driver_, device, ordinal, who_));
  }
  return ffi::Error::Success();
}

ffi::Error CollectiveState::AllocateArea(DeviceResources& res, int peers) {
  const std::string& who = who_;
  const Driver& driver = driver_;
  const size_t bytes = kBarrierAreaBytes + MetadataWords(peers) * sizeof(uint64_t);
  ScopedContext scoped(driver, res.context);
  CUdeviceptr area = 0;
  if (CUresult r = driver.cuMemAlloc(&area, bytes); r != CUDA_SUCCESS) {
    return ffi::Error(
        ffi::ErrorCode::kResourceExhausted,
        who + ": allocating " + std::to_string(bytes) + " bytes of collective metadata: " + CudaErrorText(driver, r));
  }
  if (CUresult r = driver.cuMemsetD8(area, 0, bytes); r != CUDA_SUCCESS) {
    driver.cuMemFree(area);
    return ffi::Error::Internal(who + ": clearing collective metadata: " + CudaErrorText(driver, r));
  }
  res.area = area;
  res.metadata_ptr = reinterpret_cast<void*>(area + kBarrierAreaBytes);
  const size_t p = static_cast<size_t>(num_buffers_);
  res.barrier_args.areas = area + kBarrierAreaBytes + (kMetadataHeaderWords + p * peers + p) * sizeof(uint64_t);
  return ffi::Error::Success();
}

ffi::Error CollectiveState::Initialize(int32_t device, int64_t run_id, CUstream stream, const Buffers& buffers) {
  if (device < 0 || device >= kMaxDevices || !devices_[device].ready) {
    return ffi::Error::Internal(who_ + ": initialize ran before prepare on device " + std::to_string(device));
  }
  DeviceResources& res = devices_[device];
  const Clique& clique = cliques_[clique_of_[res.global]];
  if (clique.cross_process) return InitializeShared(device, run_id, stream, buffers);
  const int rank = rank_of_[res.global];
  const int peers = static_cast<int>(clique.devices.size());
  const int p = num_buffers_;
  // XLA may run initialize twice for one execution (through the command
  // buffer and through the thunk that holds the same call): the second time,
  // with the same run and buffers, every peer has traded already.
  bool same_buffers = run_id == res.initialized_run;
  for (int i = 0; i < p; ++i) {
    const uint64_t address = reinterpret_cast<uintptr_t>(buffers.ptrs[i]);
    same_buffers = same_buffers && res.deposit[i] == address;
    res.deposit[i] = address;
  }
  if (same_buffers) return ffi::Error::Success();
  res.deposit[p] = res.area;
  if (peers > 1) {
    if (ffi::Error e = clique.rendezvous->Exchange(run_id, rank, res.deposit.data(), res.exchange.data(), timeout_,
                                                   who_ + " on device " + std::to_string(device));
        e.failure()) {
      return e;
    }
  } else {
    res.exchange = res.deposit;
  }
  const uint64_t base = res.area + kBarrierAreaBytes;
  uint64_t* m = res.metadata.data();
  const size_t peers_offset = kMetadataHeaderWords;
  const size_t multimem_offset = peers_offset + static_cast<size_t>(p) * peers;
  const size_t areas_offset = multimem_offset + p;
  m[0] = static_cast<uint64_t>(rank);
  m[1] = base + peers_offset * sizeof(uint64_t);
  m[2] = base + multimem_offset * sizeof(uint64_t);
  m[3] = static_cast<uint64_t>(peers);
  for (int b = 0; b < p; ++b) {
    for (int r = 0; r < peers; ++r)
      m[peers_offset + b * peers + r] = res.exchange[static_cast<size_t>(r) * (p + 1) + b];
    m[multimem_offset + b] = 0;
  }
  for (int r = 0; r < peers; ++r) m[areas_offset + r] = res.exchange[static_cast<size_t>(r) * (p + 1) + p];
  JMF_RETURN_IF_ERROR(CopyMetadata(res, stream));
  res.initialized_run = run_id;
  return ffi::Error::Success();
}

ffi::Error CollectiveState::CopyMetadata(DeviceResources& res, CUstream stream) {
  if (res.metadata == res.copied) return ffi::Error::Success();
  const Driver& driver = driver_;
  const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(res.metadata_ptr);
  if (CUresult r = driver.cuMemcpyHtoDAsync(base, res.metadata.data(), res.metadata.size() * sizeof(uint64_t), stream);
      r != CUDA_SUCCESS) {
    return ffi::Error::Internal(who_ + ": copying collective metadata: " + CudaErrorText(driver, r));
  }
  res.copied = res.metadata;
  return ffi::Error::Success();
}

ffi::Error CollectiveState::LaunchBarrier(int32_t device, CUstream stream) {
  if (skip_barrier_) return ffi::Error::Success();
  if (device < 0 || device >= kMaxDevices || !devices_[device].ready) [[unlikely]] {
    return ffi::Error::Internal(who_ + ": execute ran before prepare on device " + std::to_string(device));
  }
  DeviceResources& res = devices_[device];
  void* params[] = {&res.barrier_args.areas, &res.barrier_args.rank, &res.barrier_args.peers,
                    &res.barrier_args.timeout_ns};
  const Driver& driver = driver_;
  if (CUresult r = driver.cuLaunchKernel(res.barrier, 1, 1, 1, kMaxPeers, 1, 1, 0, stream, params, nullptr);
      r != CUDA_SUCCESS) {
    return ffi::Error::Internal(who_ + ": launching the device barrier: " + CudaErrorText(driver, r));
  }
  return ffi::Error::Success();
}

ffi::Error CollectiveState::RecordBarrier(const RecordFrame& record, int32_t device,
                                          const record_abi::Command** dependency) {
  *dependency = nullptr;
  if (skip_barrier_) return ffi::Error::Success();
  if (!record.creating()) return ffi::Error::Success();  // its arguments never change
  DeviceResources& res = devices_[device];
  BarrierArgs& a = res.barrier_args;
  record_abi::KernelArg args[] = {
      {&a.areas, sizeof(a.areas), record_abi::kHostValue},
      {&a.rank, sizeof(a.rank), record_abi::kHostValue},
      {&a.peers, sizeof(a.peers), record_abi::kHostValue},
      {&a.timeout_ns, sizeof(a.timeout_ns), record_abi::kHostValue},
  };
  record_abi::KernelArgs kernel_args{args, 4};
  record_abi::LaunchDims dims{{1, 1, 1}, {kMaxPeers, 1, 1}, {0, 0, 0}};
  const record_abi::Command* command = nullptr;
  const RuntimeKernelSource source = Source(RuntimeKernel::kBarrier);
  // Loaded at prepare, in this device's context, for the stream launch; record 0.5 launches that function.
  const RecordedKernel barrier{source.symbol, source.ptx, static_cast<int64_t>(source.size), record_abi::kPtx,
                               res.barrier};
  JMF_RETURN_IF_ERROR(
      record.CreateLaunch(barrier, dims, 0, false, &kernel_args, nullptr, &command, "recording the device barrier"));
  if (!record.Push(command)) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, who_ + ": the record frame has no room");
  }
  *dependency = command;
  return ffi::Error::Success();
}

}  // namespace jmf
