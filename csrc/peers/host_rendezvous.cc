#include "peers/host_rendezvous.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "ffi/status.h"

namespace jmf {
namespace {

std::mutex workspaces_mutex;
std::map<uint64_t, uint64_t>* local_workspaces = nullptr;  // address -> bytes; leaked: outlives static destructors

constexpr uint64_t kDepositMagic = 0x6a6d662d77733032ull;  // "jmf-ws02"

// A name from a peer, printable and short, for a message.
std::string Printable(const char* text, size_t limit) {
  std::string out;
  for (size_t i = 0; i < limit && text[i] != '\0'; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  return out;
}

}  // namespace

std::string EncodeDeposit(uint64_t bytes, uint64_t address, const CUipcMemHandle& handle, const std::string& page) {
  DepositRecord d{};
  d.magic = kDepositMagic;
  d.pid = static_cast<uint64_t>(getpid());
  d.bytes = bytes;
  d.address = address;
  if (const uint8_t* token = ProcessToken()) std::memcpy(d.token, token, kTokenBytes);
  d.handle = handle;
  std::snprintf(d.page, sizeof(d.page), "%s", page.c_str());
  return std::string(reinterpret_cast<const char*>(&d), sizeof(d));
}

void RegisterLocalWorkspace(uint64_t address, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(workspaces_mutex);
  if (local_workspaces == nullptr) local_workspaces = new std::map<uint64_t, uint64_t>();
  (*local_workspaces)[address] = bytes;
}

void UnregisterLocalWorkspace(uint64_t address) {
  std::lock_guard<std::mutex> lock(workspaces_mutex);
  if (local_workspaces != nullptr) local_workspaces->erase(address);
}

HostRendezvous::HostRendezvous(int rank, const std::vector<int32_t>& device_ids)
    : rank_(rank),
      device_ids_(device_ids),
      peer_pids_(device_ids.size(), static_cast<uint64_t>(getpid())),
      pages_(device_ids.size(), nullptr),
      page_names_(device_ids.size()),
      admitted_(device_ids.size()) {}

ffi::ErrorOr<std::unique_ptr<HostRendezvous>> HostRendezvous::Create(int rank, const std::vector<int32_t>& device_ids,
                                                                     const std::string& who) {
  if (rank < 0 || rank >= static_cast<int>(device_ids.size())) {
    return ffi::Error::Internal(who + ": rank " + std::to_string(rank) + " is not in a clique of " +
                                std::to_string(device_ids.size()));
  }
  std::unique_ptr<HostRendezvous> host(new HostRendezvous(rank, device_ids));
  if (ffi::Error e = host->CreatePage(who); e.failure()) return e;
  return host;
}

ffi::Error HostRendezvous::Admit(int r, const std::string& deposit, uint64_t expected_bytes, const std::string& who,
                                 DepositRecord* record, bool* same_process) {
  *same_process = false;
  if (r < 0 || r >= size() || r == rank_) return ffi::Error::Internal(who + ": no peer rank " + std::to_string(r));
  const std::string peer = "peer rank " + std::to_string(r) + " (device " + std::to_string(device_ids_[r]) + ")";
  DepositRecord& d = *record;
  if (deposit.size() != sizeof(d)) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who + ": " + peer + " sent a malformed deposit: " + std::to_string(deposit.size()) +
                          " bytes, not " + std::to_string(sizeof(d)) +
                          " (another jax_mosaic_ffi version, or not a peer of this job)");
  }
  std::memcpy(&d, deposit.data(), sizeof(d));
  if (d.magic != kDepositMagic) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who + ": " + peer + " runs another jax_mosaic_ffi version (workspace format differs)");
  }
  if (d.bytes != expected_bytes) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who + ": " + peer + " has a " + std::to_string(d.bytes) + "-byte workspace and rank " +
                          std::to_string(rank_) + " one of " + std::to_string(expected_bytes) +
                          " bytes: the processes lowered this kernel with different buffer sizes");
  }
  if (std::memchr(d.page, '\0', sizeof(d.page)) == nullptr || d.page[0] != '/' || !IsPageFileName(d.page + 1)) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who + ": " + peer + " named '" + Printable(d.page, sizeof(d.page)) +
                          "' as its host flag page, which is not a page name of this runtime: refused");
  }
  peer_pids_[r] = d.pid;
  JMF_RETURN_IF_ERROR(MapPeerPage(r, d, who, PeerName(r)));
  admitted_[r] = deposit;
  const uint8_t* token = ProcessToken();
  if (token == nullptr || std::memcmp(d.token, token, kTokenBytes) != 0) return ffi::Error::Success();
  // Our token: only a workspace this process holds makes the raw address usable.
  bool live = false;
  {
    std::lock_guard<std::mutex> lock(workspaces_mutex);
    if (local_workspaces != nullptr) {
      auto it = local_workspaces->find(d.address);
      live = it != local_workspaces->end() && it->second == d.bytes;
    }
  }
  if (!live) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who + ": " + PeerName(r) +
                          " claims to be this process (its deposit carries this process's token) but names no "
                          "workspace of this process: refused");
  }
  *same_process = true;
  return ffi::Error::Success();
}

std::string HostRendezvous::PeerName(int r) const {
  if (r < 0 || r >= size()) return "rank " + std::to_string(r) + " (not in the clique)";
  return "peer rank " + std::to_string(r) + " (device " + std::to_string(device_ids_[r]) + ", process id " +
         std::to_string(peer_pids_[r]) + ")";
}

// Each rank's page holds the last execution it reached, or kBroken. A rank
// that times out on a peer swaps the peer's count for kBroken (only if the
// peer has not arrived meanwhile), and marks its own page too: a late peer
// then fails as it arrives, instead of passing the rendezvous alone and
// waiting in the device barrier for a rank that already gave up. Every value
// read from a page was written by another process: each is bounded here.
ffi::Error HostRendezvous::Meet(const DepositTrade& trade, const std::string& mine, std::chrono::milliseconds timeout,
                                const std::string& who) {
  if (broken_) JMF_RETURN_IF_ERROR(Resynchronize(trade, mine, who));
  return Arrive(timeout, who);
}

// Every rank failed the execution that broke (a rank that gave up marked the pages, so none went on). The
// peers meet twice through the key-value exchange, whose verdict keeps every rank in step however late one
// comes: first once every rank is past that execution, so none still reads or marks our flags, then once
// every rank has cleared its own, so none reads a peer's from before. The workspace and its mappings stay:
// addresses a captured graph holds stay valid.
ffi::Error HostRendezvous::Resynchronize(const DepositTrade& trade, const std::string& mine, const std::string& who) {
  std::vector<std::string> all;
  const auto meet = [&]() -> ffi::Error {
    if (ffi::Error e = trade(&all); e.failure()) {
      return ffi::Error(e.errc().value_or(ffi::ErrorCode::kInternal),
                        who + ": meeting the peers again after a timeout: " + e.message());
    }
    if (all.size() != device_ids_.size()) {
      return ffi::Error::Internal(who + ": the peer exchange returned " + std::to_string(all.size()) +
                                  " deposits for a clique of " + std::to_string(device_ids_.size()));
    }
    for (int r = 0; r < size(); ++r) {
      if (all[r] != (r == rank_ ? mine : admitted_[r])) {
        return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                          who + ": " + (r == rank_ ? "this rank's deposit" : PeerName(r) + "'s workspace") +
                              " is not the one the clique was set up with, so the ranks cannot meet again after the "
                              "timeout. Compile the program again or restart the processes");
      }
    }
    return ffi::Error::Success();
  };
  JMF_RETURN_IF_ERROR(meet());
  HostFlags& own = pages_[rank_]->flags;
  own.broken_by.store(0, std::memory_order_release);
  own.arrived.store(0, std::memory_order_release);
  executions_ = 0;
  JMF_RETURN_IF_ERROR(meet());
  broken_ = false;
  return ffi::Error::Success();
}

ffi::Error HostRendezvous::Arrive(std::chrono::milliseconds timeout, const std::string& who) {
  if (broken_) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who +
                          ": an earlier execution of this kernel timed out on a peer process; the ranks must meet "
                          "again first (Meet)");
  }
  HostFlags& own = pages_[rank_]->flags;
  const uint64_t n = executions_ + 1;
  uint64_t previous = executions_;
  if (!own.arrived.compare_exchange_strong(previous, n, std::memory_order_acq_rel)) {
    broken_ = true;
    const uint64_t by = own.broken_by.load(std::memory_order_acquire);
    std::string culprit = "a peer rank";
    if (by >= 1 && by <= static_cast<uint64_t>(size()) && by - 1 != static_cast<uint64_t>(rank_)) {
      culprit = PeerName(static_cast<int>(by - 1));
    } else if (by != 0) {
      culprit = "a peer rank (the flag page names rank " + std::to_string(by - 1) + ", which is no peer of rank " +
                std::to_string(rank_) + " in this clique of " + std::to_string(size()) + ")";
    }
    return ffi::Error(ffi::ErrorCode::kAborted,
                      who + ": " + culprit + " gave up waiting for rank " + std::to_string(rank_) +
                          " at an earlier execution; the clique is out of step, so this rank fails too "
                          "(JAX_MOSAIC_FFI_PEER_TIMEOUT_S sets the timeout)");
  }
  executions_ = n;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    std::atomic<uint64_t>& arrived = pages_[r]->flags.arrived;
    for (uint64_t spins = 0;; ++spins) {
      uint64_t seen = arrived.load(std::memory_order_acquire);
      if (seen == kBroken) return Broken(who, PeerName(r) + " gave up on the clique");
      // A peer passes execution n only once we reached it, so it can be at most one ahead.
      if (seen > n + 1) {
        return Broken(who, PeerName(r) + " claims to have reached execution " + std::to_string(seen) + " while rank " +
                               std::to_string(rank_) + " is at " + std::to_string(n) +
                               ": its flag page is not in step with this clique");
      }
      if (seen >= n) break;
      if (spins < 4096) continue;  // a peer a few microseconds behind
      if (spins % 256 == 0 && std::chrono::steady_clock::now() > deadline) {
        pages_[r]->flags.broken_by.store(static_cast<uint64_t>(rank_) + 1, std::memory_order_release);
        if (!arrived.compare_exchange_strong(seen, kBroken, std::memory_order_acq_rel)) continue;  // it just came
        return Broken(who, "rank " + std::to_string(rank_) + " waited " + Seconds(timeout) + " s for " + PeerName(r) +
                               " to reach execution " + std::to_string(n) +
                               " of this kernel; it never did. Did its process stall or die? "
                               "(JAX_MOSAIC_FFI_PEER_TIMEOUT_S sets the timeout)");
      }
      if (spins < 100000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  if (n == 1) ReleaseName();  // every peer has mapped our page by now
  return ffi::Error::Success();
}

ffi::Error HostRendezvous::Broken(const std::string& who, const std::string& why) {
  broken_ = true;
  HostFlags& own = pages_[rank_]->flags;
  own.broken_by.store(static_cast<uint64_t>(rank_) + 1, std::memory_order_release);
  own.arrived.store(kBroken, std::memory_order_release);
  return ffi::Error(ffi::ErrorCode::kDeadlineExceeded, who + ": " + why);
}

}  // namespace jmf
