// The host half of a clique across processes (peers/cross_process.h has
// the whole picture): per execution the ranks meet on the host through a
// small flag page in POSIX shared memory (one per rank, mapped by the peers):
// a peer that stalls or died gives an error naming it after
// JAX_MOSAIC_FFI_PEER_TIMEOUT_S, before any device barrier can wait on it;
// the rank that gives up marks its page, so its peers fail at once instead of
// waiting in turn. Every rank fails that execution; at its next one, each
// meets its peers again through the key-value exchange before it counts
// executions afresh, so the clique recovers once the peer is back.
//
// Peers are processes of the same job, user and host, but what they send is
// still checked before use, once per workspace: a bad deposit or page is an
// error naming the peer, never a fault here (docs/threat_model.md).
//
// Needs no driver: only the IPC handle type of cuda.h, carried as bytes.
#ifndef JAX_MOSAIC_FFI_HOST_RENDEZVOUS_H_
#define JAX_MOSAIC_FFI_HOST_RENDEZVOUS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "driver/cuda_driver.h"
#include "xla/ffi/api/ffi.h"

namespace jmf {

namespace ffi = xla::ffi;

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

// "jmf-" and 32 lowercase hex digits: what this runtime names its flag pages
// (without the leading slash shm_open takes).
bool IsPageFileName(const char* name);

// This process's identity: random bytes from getrandom(2), new in a forked
// child; null when the kernel gave none. Tells "same process" where a pid
// cannot (pid namespaces, reuse).
const uint8_t* ProcessToken();

// A deposit's bytes, as SharedWorkspace publishes them.
std::string EncodeDeposit(uint64_t bytes, uint64_t address, const CUipcMemHandle& handle, const std::string& page);

// One more trade of this rank's deposit with its peers (the key-value exchange, whose every attempt ends in
// one verdict for all ranks): every rank's deposit, rank-major.
using DepositTrade = std::function<ffi::Error(std::vector<std::string>*)>;

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

  // Arrive, after meeting the peers again (through `trade` of this rank's deposit `mine`) when an earlier
  // execution broke: what each execution does.
  ffi::Error Meet(const DepositTrade& trade, const std::string& mine, std::chrono::milliseconds timeout,
                  const std::string& who);
  // Whether an execution gave up on a peer, or a peer on it, since the peers last met.
  bool broken() const { return broken_; }

  std::string PeerName(int r) const;

 private:
  HostRendezvous(int rank, const std::vector<int32_t>& device_ids);
  ffi::Error CreatePage(const std::string& who);
  ffi::Error MapPeerPage(int r, const DepositRecord& d, const std::string& who, const std::string& peer);
  void ReleaseName();
  ffi::Error Broken(const std::string& who, const std::string& why);
  ffi::Error Resynchronize(const DepositTrade& trade, const std::string& mine, const std::string& who);

  int rank_ = 0;
  std::vector<int32_t> device_ids_;
  std::vector<uint64_t> peer_pids_;
  std::vector<SharedPage*> pages_;  // by rank, ours included
  std::vector<std::string> page_names_;
  std::vector<std::string> admitted_;  // each peer's deposit, as admitted at set-up
  std::string page_name_;              // unlinked once every peer has mapped it
  int page_fd_ = -1;                   // holds the flock that tells other processes the page is live
  uint64_t executions_ = 0;
  bool broken_ = false;
};

// This process's live workspaces: a deposit with our token must name one.
void RegisterLocalWorkspace(uint64_t address, uint64_t bytes);
void UnregisterLocalWorkspace(uint64_t address);

// The flag pages this process has mapped now (its own and its peers'), for
// GetCrossProcessStats.
int64_t LiveSharedPages();

}  // namespace jmf

#endif  // JAX_MOSAIC_FFI_HOST_RENDEZVOUS_H_
