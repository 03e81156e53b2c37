// ===== csrc/peers/: the cross-GPU mechanisms =====
// Collective state and workspace (this file, collective_workspace.cc), peers
// in other processes (cross_process.h, host_rendezvous.h), NVSHMEM's job and
// an NVSHMEM call's symmetric buffers (nvshmem_runtime.h, nvshmem_staging.h).
// Each is built from what it needs, never from a call site. May include: the
// standard library, POSIX headers, cuda.h, the XLA FFI headers
// (xla/ffi/api/), csrc/ffi/, csrc/driver/ and csrc/contract/. Not nanobind,
// not runtime/ or python/. Layers: contract <- driver <- ffi <- peers <-
// runtime <- python (scripts/check_csrc_layers.py).
//
// Collective kernels in one process that drives several GPUs.
//
// Per call site and device the runtime owns one allocation: a barrier area
// of flag words that peers write to, then the collective metadata the kernel
// receives as its last parameter (layout in docs/collectives.md and in
// jax_mosaic_ffi/include/jax_mosaic_ffi/collective.cuh):
//
//   header   u64 rank | u64* param_to_peers | u64* param_to_multimem | u64 num_peers
//   u64 param_to_peers[P * N]     entry p * N + r: buffer p on rank r
//   u64 param_to_multimem[P]      null: multicast stays off
//   u64 barrier_areas[N]          each rank's barrier area
//
// The first four parts are XLA's layout. Every execution, initialize trades
// buffer addresses with the peers through a rendezvous keyed by the run id
// (a peer that never comes ends in an error after a timeout), refreshes the
// metadata when an address changed, and execute runs a device barrier before
// the launch unless skip_device_barrier is set.
#ifndef JAX_MOSAIC_FFI_COLLECTIVE_H_
#define JAX_MOSAIC_FFI_COLLECTIVE_H_

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "driver/cuda_driver.h"
#include "ffi/buffers.h"
#include "ffi/record.h"
#include "peers/cross_process.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

// A barrier area: kernel-side words (collective.cuh's kKernelRow...), then
// the runtime generation word at kRuntimeGeneration (driver/runtime_kernels.h).
inline constexpr size_t kBarrierAreaBytes = 2048;
inline constexpr size_t kMetadataHeaderWords = 4;

// Devices of one clique meet here once per execution to trade addresses.
class Rendezvous {
 public:
  Rendezvous(int participants, int words_each);

  // Deposits `mine` as `rank`, waits for every participant of `run_id`, and
  // copies all deposits, rank-major, to `all`. On timeout names the ranks
  // that never came.
  ffi::Error Exchange(int64_t run_id, int rank, const uint64_t* mine, uint64_t* all, std::chrono::milliseconds timeout,
                      const std::string& who);

 private:
  struct Round {
    int64_t run_id = -1;
    int arrived = 0;
    int departed = 0;
    std::vector<char> present;
    std::vector<uint64_t> data;
  };

  const int participants_;
  const int words_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::array<Round, 4> rounds_;
};

// What a collective call site's state is built from: the parts of its
// validated launch (contract/contract.h) that concern the peers. The call site
// fills it; CollectiveState keeps no reference to the call site.
struct CollectiveInputs {
  const Driver* driver = nullptr;
  std::string who;                            // the call site, for messages
  int num_inputs = 0;                         // buffers are inputs, then outputs
  int num_buffers = 0;                        // inputs plus outputs
  std::vector<std::vector<int32_t>> cliques;  // global device ids of each clique
  std::vector<bool> symmetric;                // per buffer; none set: every input, across processes
  bool skip_device_barrier = false;
};

class CollectiveState {
 public:
  static ffi::ErrorOr<std::unique_ptr<CollectiveState>> Create(CollectiveInputs inputs);
  ~CollectiveState();

  // Allocates this device's area and enables peer access. O(1) once done.
  ffi::Error Prepare(int32_t device, CUcontext context);
  // Trades addresses with the peers and refreshes the metadata on `stream`.
  ffi::Error Initialize(int32_t device, int64_t run_id, CUstream stream, const Buffers& buffers);
  ffi::Error LaunchBarrier(int32_t device, CUstream stream);
  // Execute's steps around the launch: across processes, copies symmetric
  // inputs into the workspace before the barrier, and symmetric outputs
  // back after the kernel (cross_process.h).
  ffi::Error BeforeLaunch(int32_t device, CUstream stream, const Buffers& buffers);
  ffi::Error AfterLaunch(int32_t device, CUstream stream, const Buffers& buffers);
  // Some clique of this call site has a peer in another process.
  bool cross_process() const { return cross_process_; }
  // Records the barrier; `*dependency` is what the launch must wait for.
  ffi::Error RecordBarrier(const RecordFrame& record, int32_t device, const record_abi::Command** dependency);
  int barrier_commands() const { return skip_barrier_ ? 0 : 1; }

  // Where this device's metadata pointer is kept: the launch passes it on.
  void* const* metadata_slot(int32_t device) const { return &devices_[device].metadata_ptr; }

 private:
  explicit CollectiveState(const CollectiveInputs& inputs)
      : driver_(*inputs.driver),
        who_(inputs.who),
        num_inputs_(inputs.num_inputs),
        num_buffers_(inputs.num_buffers),
        symmetric_(inputs.symmetric) {}

  struct Clique {
    std::vector<int32_t> devices;  // global device ids
    std::unique_ptr<Rendezvous> rendezvous;
    bool cross_process = false;  // some device belongs to another process
  };
  // A symmetric parameter's place in the workspace.
  struct Slot {
    int buffer = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  // The barrier kernel's parameters for one device (fixed once prepared).
  struct BarrierArgs {
    uint64_t areas = 0;  // device address of barrier_areas[N] in the metadata
    uint32_t rank = 0;
    uint32_t peers = 0;
    uint64_t timeout_ns = 0;
  };
  struct DeviceResources {
    bool ready = false;
    BarrierArgs barrier_args;
    CUcontext context = nullptr;
    CUdeviceptr area = 0;
    void* metadata_ptr = nullptr;  // area + kBarrierAreaBytes
    CUfunction barrier = nullptr;
    std::vector<uint64_t> deposit;               // my buffer addresses, then my area
    std::vector<uint64_t> exchange;              // everyone's deposits
    std::vector<uint64_t> metadata;              // host copy of the device metadata
    std::vector<uint64_t> copied;                // what the device holds now
    int64_t initialized_run = -1;                // the run whose addresses were last traded
    int32_t global = -1;                         // the device's global id
    std::unique_ptr<SharedWorkspace> workspace;  // across processes only
    std::vector<Slot> slots;
  };

  size_t MetadataWords(int peers) const;
  ffi::Error PrepareLocalPeers(int32_t device, const Clique& clique);
  ffi::Error AllocateArea(DeviceResources& res, int peers);
  ffi::Error InitializeShared(int32_t device, int64_t run_id, CUstream stream, const Buffers& buffers);
  ffi::Error SetUpWorkspace(int32_t device, const Buffers& buffers);
  void FillSharedMetadata(DeviceResources& res, int rank, int peers);
  ffi::Error CopyMetadata(DeviceResources& res, CUstream stream);
  bool InWorkspace(int buffer) const;

  const Driver& driver_;
  const std::string who_;
  const int num_inputs_;
  const int num_buffers_;
  const std::vector<bool> symmetric_;
  std::vector<Clique> cliques_;
  std::array<int, kMaxDevices> clique_of_{};
  std::array<int, kMaxDevices> rank_of_{};
  bool skip_barrier_ = false;
  bool cross_process_ = false;
  bool any_symmetric_ = false;
  std::chrono::milliseconds timeout_{0};
  std::mutex mutex_;
  std::array<DeviceResources, kMaxDevices> devices_;
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_COLLECTIVE_H_
