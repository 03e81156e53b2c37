// Collective kernels whose peers live in other processes of one host
// (jax.distributed, one GPU per process): a symmetric workspace per device
// and clique that every peer maps (docs/collectives.md, "Across processes").
//
// XLA's buffers come from the virtual-memory API and cannot be shared with
// CUDA IPC, so each device owns one cuMemAlloc allocation, laid out alike on
// every rank: the barrier area, the metadata, then one slot per symmetric
// parameter. The IPC handles travel once per workspace through the
// jax.distributed key-value store (a Python function the module registers:
// jax_mosaic_ffi/call/cross_process.py), and each peer opens the others'.
//
// Per execution the ranks meet on the host through a small flag page in
// POSIX shared memory (one per rank, mapped by the peers): a peer that
// stalls or died gives an error naming it after JAX_MOSAIC_FFI_PEER_TIMEOUT_S,
// before any device barrier can wait on it; the rank that gives up marks its
// page, so its peers fail at once instead of waiting in turn.
//
// Peers are processes of the same job, user and host, but what they send is
// still checked before use, once per workspace: a bad deposit or page is an
// error naming the peer, never a fault here (docs/threat_model.md).
#ifndef JAX_MOSAIC_FFI_CROSS_PROCESS_H_
#define JAX_MOSAIC_FFI_CROSS_PROCESS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "driver/cuda_driver.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

namespace ffi = xla::ffi;

// One trade through the key-value store: publish `mine` as `rank`, return
// every rank's bytes, rank-major. Errors name the missing or foreign peer.
struct PeerExchangeRequest {
  std::string key;  // the call site and clique
  int rank = 0;
  std::vector<int32_t> device_ids;  // global device ids of the clique, by rank
  std::string mine;
  std::chrono::milliseconds timeout{0};
  std::string who;
};
using PeerExchangeFn = std::function<ffi::Error(const PeerExchangeRequest&, std::vector<std::string>*)>;

// Set by the Python module when jax.distributed runs several processes:
// the exchange, and which global device id each local ordinal is.
void SetPeerExchange(PeerExchangeFn exchange);
void SetProcessDevices(const std::vector<std::pair<int32_t, int32_t>>& ordinal_to_global);
// The global id of a local ordinal (the ordinal itself when no map was set).
int32_t GlobalDeviceId(int32_t ordinal);
// The local ordinal of a global device id of this process (itself when no map was set).
int32_t LocalOrdinal(int32_t global_id);
// Whether a global device id belongs to this process (all do when no map was set).
bool IsLocalDevice(int32_t global_id);

struct CrossProcessStats {
  int64_t live_workspaces = 0;
  int64_t peer_mappings = 0;
  int64_t shared_pages = 0;
};
CrossProcessStats GetCrossProcessStats();

// The host-shared flag page of one rank.
struct HostFlags {
  std::atomic<uint64_t> arrived;    // the last execution this rank reached, or kBroken
  std::atomic<uint64_t> broken_by;  // 1 + the rank that gave up on it (a peer writes it: bounded before use)
};
inline constexpr uint64_t kBroken = ~uint64_t{0};
inline constexpr size_t kTokenBytes = 16;
inline constexpr size_t kPageNameBytes = 64;
inline constexpr size_t kPageBytes = 4096;

// A flag page in POSIX shared memory, named /jmf-<32 random hex digits>. The
// header is written by its creator before the name is published.
struct SharedPage {
  uint64_t magic;
  uint64_t pid;                // the creator's, for messages only
  uint8_t token[kTokenBytes];  // the creator's ProcessToken
  alignas(64) HostFlags flags;
};
static_assert(sizeof(SharedPage) <= kPageBytes);

// What one rank publishes about its workspace. Fixed size, read by peers of
// the same build on the same host; every field is checked before use.
struct DepositRecord {
  uint64_t magic;
  uint64_t pid;  // for messages only: pids repeat across namespaces and time
  uint64_t bytes;
  uint64_t address;            // meaningful only in the process that made it
  uint8_t token[kTokenBytes];  // that process's ProcessToken
  CUipcMemHandle handle;
  char page[kPageNameBytes];  // the name of the rank's flag page
};

// This process's identity: random bytes from getrandom(2), new in a forked
// child; null when the kernel gave none. Tells "same process" where a pid
// cannot (pid namespaces, reuse).
const uint8_t* ProcessToken();

// A deposit's bytes, as SharedWorkspace publishes them.
std::string EncodeDeposit(uint64_t bytes, uint64_t address, const CUipcMemHandle& handle, const std::string& page);

// The host half of one rank of a clique across processes: its flag page,
// its peers' pages and the per-execution rendezvous. Needs no driver (the
// test hook in python/cross_process_python.cc drives it on any machine).
class HostRendezvous {
 public:
  // Creates this rank's flag page under a fresh random name (after removing
  // stale pages of dead processes, once per process).
  static ffi::ErrorOr<std::unique_ptr<HostRendezvous>> Create(int rank, const std::vector<int32_t>& device_ids,
                                                              const std::string& who);
  ~HostRendezvous();
  HostRendezvous(const HostRendezvous&) = delete;
  HostRendezvous& operator=(const HostRendezvous&) = delete;

  const std::string& page_name() const { return page_name_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(device_ids_.size()); }

  // Peer r's deposit, checked field by field, and its flag page mapped after
  // checking what it is (ours, one page exactly, made by the process the
  // deposit names). `*same_process`: the deposit comes from this process (its
  // token is ours and its address is a live workspace here), so its address
  // is usable as is; a deposit with our token and any other address is refused.
  ffi::Error Admit(int r, const std::string& deposit, uint64_t expected_bytes, const std::string& who,
                   DepositRecord* record, bool* same_process);

  // Host rendezvous for one execution: marks arrival, waits for every peer.
  ffi::Error Arrive(std::chrono::milliseconds timeout, const std::string& who);

  std::string PeerName(int r) const;

 private:
  HostRendezvous(int rank, const std::vector<int32_t>& device_ids);
  ffi::Error CreatePage(const std::string& who);
  ffi::Error MapPeerPage(int r, const DepositRecord& d, const std::string& who, const std::string& peer);
  void ReleaseName();
  ffi::Error Broken(const std::string& who, const std::string& why);

  int rank_ = 0;
  std::vector<int32_t> device_ids_;
  std::vector<uint64_t> peer_pids_;
  std::vector<SharedPage*> pages_;  // by rank, ours included
  std::vector<std::string> page_names_;
  std::string page_name_;  // unlinked once every peer has mapped it
  int page_fd_ = -1;       // holds the flock that tells other processes the page is live
  uint64_t executions_ = 0;
  bool broken_ = false;
};

// This process's live workspaces: a deposit with our token must name one.
void RegisterLocalWorkspace(uint64_t address, uint64_t bytes);
void UnregisterLocalWorkspace(uint64_t address);

class SharedWorkspace {
 public:
  // Allocates `bytes` (zeroed) in `context`, trades handles with the peers
  // and maps theirs. `device_ids` lists the clique by rank.
  static ffi::ErrorOr<std::unique_ptr<SharedWorkspace>> Create(const Driver& driver, CUcontext context, size_t bytes,
                                                               const PeerExchangeRequest& request);
  ~SharedWorkspace();
  SharedWorkspace(const SharedWorkspace&) = delete;
  SharedWorkspace& operator=(const SharedWorkspace&) = delete;

  // Rank `r`'s workspace as this device addresses it (its own for r == rank).
  uint64_t base(int r) const { return peers_[r].address; }

  // Host rendezvous for one execution: marks arrival, waits for every peer.
  ffi::Error Arrive(std::chrono::milliseconds timeout, const std::string& who) { return host_->Arrive(timeout, who); }

 private:
  struct Peer {
    uint64_t address = 0;
    bool opened = false;  // an IPC mapping to close
  };
  SharedWorkspace(const Driver& driver, CUcontext context) : driver_(driver), context_(context) {}
  ffi::Error Allocate(size_t bytes, const std::string& who);
  ffi::Error MapPeer(int r, const std::string& deposit, const PeerExchangeRequest& request);
  ffi::Error Deposit(const std::string& who, std::string* out) const;

  const Driver& driver_;
  CUcontext context_;
  int rank_ = 0;
  size_t bytes_ = 0;
  CUdeviceptr local_ = 0;
  std::unique_ptr<HostRendezvous> host_;
  std::vector<Peer> peers_;
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CROSS_PROCESS_H_
