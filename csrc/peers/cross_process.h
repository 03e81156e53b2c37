// Collective kernels whose peers live in other processes of one host
// (jax.distributed, one GPU per process): a symmetric workspace per device
// and clique that every peer maps (docs/collectives.md, "Across processes").
//
// XLA's buffers come from the virtual-memory API and cannot be shared with
// CUDA IPC, so each device owns one cuMemAlloc allocation, laid out alike on
// every rank: the barrier area, the metadata, then one slot per symmetric
// parameter. The IPC handles travel once per workspace through the
// jax.distributed key-value store (a Python function the module registers:
// jax_mosaic_ffi/call/peers/cross_process.py), and each peer opens the others'.
//
// Per execution the ranks meet on the host through flag pages in POSIX
// shared memory, and every deposit and page a peer sends is checked before
// use: peers/host_rendezvous.h, which this half builds on.
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
#include "peers/host_rendezvous.h"
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

  // Host rendezvous for one execution: marks arrival, waits for every peer; after an execution that timed out,
  // meets them again first through the key-value exchange (HostRendezvous::Meet).
  ffi::Error Arrive(std::chrono::milliseconds timeout, const std::string& who) {
    return host_->Meet(trade_again_, request_.mine, timeout, who);
  }

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
  PeerExchangeFn exchange_;
  PeerExchangeRequest request_;  // the set-up's trade, this rank's deposit in `mine`
  DepositTrade trade_again_;     // the same trade again, for meeting after a timeout
  int rank_ = 0;
  size_t bytes_ = 0;
  CUdeviceptr local_ = 0;
  std::unique_ptr<HostRendezvous> host_;
  std::vector<Peer> peers_;
};

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_CROSS_PROCESS_H_
