#include "cross_process.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace jmf {
namespace {

std::mutex registry_mutex;
PeerExchangeFn* registered_exchange = nullptr;            // leaked: outlives static destructors
std::map<int32_t, int32_t>* ordinal_to_global = nullptr;  // null: one process drives every device
std::atomic<int64_t> live_workspaces{0}, peer_mappings{0}, shared_pages{0};
std::atomic<uint64_t> page_counter{0};

constexpr uint64_t kDepositMagic = 0x6a6d662d77733031ull;  // "jmf-ws01"
constexpr size_t kPageBytes = 4096;

// What one rank publishes about its workspace. Fixed size, read by peers of
// the same build on the same host.
struct DepositRecord {
  uint64_t magic;
  uint64_t pid;
  uint64_t bytes;
  uint64_t address;  // valid as is in the same process
  CUipcMemHandle handle;
  char page[64];  // the POSIX shared-memory name of the rank's flag page
};

HostFlags* MapPage(const char* name, bool create) {
  const int fd = shm_open(name, create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (create && ftruncate(fd, kPageBytes) != 0) {
    close(fd);
    shm_unlink(name);
    return nullptr;
  }
  void* page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (page == MAP_FAILED) return nullptr;
  shared_pages.fetch_add(1);
  return static_cast<HostFlags*>(page);
}

void UnmapPage(HostFlags* page) {
  if (page == nullptr) return;
  munmap(page, kPageBytes);
  shared_pages.fetch_sub(1);
}

std::string Seconds(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", duration.count() / 1000.0);
  return text;
}

}  // namespace

void SetPeerExchange(PeerExchangeFn exchange) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registered_exchange = new PeerExchangeFn(std::move(exchange));  // an old one is leaked on purpose: tiny, rare
}

void SetProcessDevices(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto* map = new std::map<int32_t, int32_t>(pairs.begin(), pairs.end());
  ordinal_to_global = map;  // set once per process in practice; never freed, read without copies
}

int32_t GlobalDeviceId(int32_t ordinal) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (ordinal_to_global == nullptr) return ordinal;
  auto it = ordinal_to_global->find(ordinal);
  return it == ordinal_to_global->end() ? -1 : it->second;
}

int32_t LocalOrdinal(int32_t global_id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (ordinal_to_global == nullptr) return global_id;
  for (const auto& [ordinal, global] : *ordinal_to_global) {
    if (global == global_id) return ordinal;
  }
  return -1;
}

bool IsLocalDevice(int32_t global_id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (ordinal_to_global == nullptr) return true;
  for (const auto& [ordinal, global] : *ordinal_to_global) {
    if (global == global_id) return true;
  }
  return false;
}

CrossProcessStats GetCrossProcessStats() {
  return CrossProcessStats{live_workspaces.load(), peer_mappings.load(), shared_pages.load()};
}

ffi::ErrorOr<std::unique_ptr<SharedWorkspace>> SharedWorkspace::Create(const Driver& driver, CUcontext context,
                                                                       size_t bytes,
                                                                       const PeerExchangeRequest& request) {
  PeerExchangeFn exchange;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    if (registered_exchange != nullptr) exchange = *registered_exchange;
  }
  if (!exchange) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      request.who +
                          ": the clique spans processes but no peer exchange is registered "
                          "(jax_mosaic_ffi.cross_process.install runs when such a kernel is lowered)");
  }
  std::unique_ptr<SharedWorkspace> ws(new SharedWorkspace(driver, context));
  ws->rank_ = request.rank;
  ws->device_ids_ = request.device_ids;
  if (ffi::Error e = ws->Allocate(bytes, request.who); e.failure()) return e;
  PeerExchangeRequest trade = request;
  if (ffi::Error e = ws->Deposit(request.who, &trade.mine); e.failure()) return e;
  std::vector<std::string> deposits;
  if (ffi::Error e = exchange(trade, &deposits); e.failure()) return e;
  if (deposits.size() != request.device_ids.size()) {
    return ffi::Error::Internal(request.who + ": the peer exchange returned " + std::to_string(deposits.size()) +
                                " deposits for a clique of " + std::to_string(request.device_ids.size()));
  }
  if (ffi::Error e = ws->MapPeers(request, deposits); e.failure()) return e;
  return ws;
}

ffi::Error SharedWorkspace::Allocate(size_t bytes, const std::string& who) {
  ScopedContext scoped(driver_, context_);
  if (CUresult r = driver_.cuMemAlloc(&local_, bytes); r != CUDA_SUCCESS) {
    local_ = 0;
    return ffi::Error(
        ffi::ErrorCode::kResourceExhausted,
        who + ": allocating a " + std::to_string(bytes) + "-byte collective workspace: " + CudaErrorText(driver_, r));
  }
  bytes_ = bytes;
  live_workspaces.fetch_add(1);
  // Zeroed and finished before any peer can learn of it and signal into it.
  CUresult r = driver_.cuMemsetD8(local_, 0, bytes);
  if (r == CUDA_SUCCESS) r = driver_.cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return ffi::Error::Internal(who + ": clearing the workspace: " + CudaErrorText(driver_, r));
  page_name_ = "/jmf-" + std::to_string(getpid()) + "-" + std::to_string(page_counter.fetch_add(1));
  own_ = MapPage(page_name_.c_str(), /*create=*/true);
  if (own_ == nullptr) {
    page_name_.clear();
    return ffi::Error::Internal(who + ": creating the host flag page in /dev/shm: " + std::strerror(errno));
  }
  return ffi::Error::Success();
}

ffi::Error SharedWorkspace::Deposit(const std::string& who, std::string* out) const {
  DepositRecord d{};
  d.magic = kDepositMagic;
  d.pid = static_cast<uint64_t>(getpid());
  d.bytes = bytes_;
  d.address = local_;
  ScopedContext scoped(driver_, context_);
  if (CUresult r = driver_.cuIpcGetMemHandle(&d.handle, local_); r != CUDA_SUCCESS) {
    return ffi::Error::Internal(who + ": exporting the workspace (cuIpcGetMemHandle): " + CudaErrorText(driver_, r));
  }
  std::snprintf(d.page, sizeof(d.page), "%s", page_name_.c_str());
  out->assign(reinterpret_cast<const char*>(&d), sizeof(d));
  return ffi::Error::Success();
}

ffi::Error SharedWorkspace::MapPeers(const PeerExchangeRequest& request, const std::vector<std::string>& deposits) {
  peers_.resize(deposits.size());
  peer_pids_.assign(deposits.size(), static_cast<uint64_t>(getpid()));
  peers_[rank_].address = local_;
  peers_[rank_].flags = own_;
  for (int r = 0; r < static_cast<int>(deposits.size()); ++r) {
    if (r == rank_) continue;
    if (ffi::Error e = MapPeer(r, deposits[r], request); e.failure()) return e;
  }
  return ffi::Error::Success();
}

ffi::Error SharedWorkspace::MapPeer(int r, const std::string& deposit, const PeerExchangeRequest& request) {
  const std::string peer = "peer rank " + std::to_string(r) + " (device " + std::to_string(request.device_ids[r]) + ")";
  DepositRecord d{};
  if (deposit.size() != sizeof(d)) return ffi::Error::Internal(request.who + ": " + peer + " sent a malformed deposit");
  std::memcpy(&d, deposit.data(), sizeof(d));
  if (d.magic != kDepositMagic) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      request.who + ": " + peer + " runs another jax_mosaic_ffi version (workspace format differs)");
  }
  if (d.bytes != bytes_) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      request.who + ": " + peer + " has a " + std::to_string(d.bytes) + "-byte workspace and rank " +
                          std::to_string(rank_) + " one of " + std::to_string(bytes_) +
                          " bytes: the processes lowered this kernel with different buffer sizes");
  }
  peer_pids_[r] = d.pid;
  d.page[sizeof(d.page) - 1] = '\0';
  peers_[r].flags = MapPage(d.page, /*create=*/false);
  if (peers_[r].flags == nullptr) {
    return ffi::Error::Internal(request.who + ": mapping " + peer + "'s host flag page " + d.page + ": " +
                                std::strerror(errno));
  }
  if (d.pid == static_cast<uint64_t>(getpid())) {  // same process: the pointer works with peer access on
    peers_[r].address = d.address;
    return ffi::Error::Success();
  }
  ScopedContext scoped(driver_, context_);
  CUdeviceptr mapped = 0;
  if (CUresult res = driver_.cuIpcOpenMemHandle(&mapped, d.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      res != CUDA_SUCCESS) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      request.who + ": opening " + peer + "'s workspace (process " + std::to_string(d.pid) +
                          ") with CUDA IPC: " + CudaErrorText(driver_, res) +
                          ". The GPUs of a clique must share one host and reach each other (NVLink or PCIe)");
  }
  peers_[r].address = mapped;
  peers_[r].opened = true;
  peer_mappings.fetch_add(1);
  return ffi::Error::Success();
}

std::string SharedWorkspace::PeerName(int r) const {
  return "peer rank " + std::to_string(r) + " (device " + std::to_string(device_ids_[r]) + ", process id " +
         std::to_string(peer_pids_[r]) + ")";
}

// Each rank's page holds the last execution it reached, or kBroken. A rank
// that times out on a peer swaps the peer's count for kBroken (only if the
// peer has not arrived meanwhile), and marks its own page too: a late peer
// then fails as it arrives, instead of passing the rendezvous alone and
// waiting in the device barrier for a rank that already gave up.
ffi::Error SharedWorkspace::Arrive(std::chrono::milliseconds timeout, const std::string& who) {
  if (broken_) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who +
                          ": an earlier execution of this kernel timed out on a peer process; the clique cannot "
                          "resynchronize. Compile again or restart the processes");
  }
  const uint64_t n = executions_ + 1;
  uint64_t previous = executions_;
  if (!own_->arrived.compare_exchange_strong(previous, n, std::memory_order_acq_rel)) {
    broken_ = true;
    const uint64_t by = own_->broken_by.load(std::memory_order_acquire);
    return ffi::Error(ffi::ErrorCode::kAborted,
                      who + ": " + (by != 0 ? PeerName(static_cast<int>(by - 1)) : std::string("a peer rank")) +
                          " gave up waiting for rank " + std::to_string(rank_) +
                          " at an earlier execution; the clique is out of step, so this rank fails too "
                          "(JAX_MOSAIC_FFI_PEER_TIMEOUT_S sets the timeout)");
  }
  executions_ = n;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == rank_) continue;
    std::atomic<uint64_t>& arrived = peers_[r].flags->arrived;
    for (uint64_t spins = 0;; ++spins) {
      uint64_t seen = arrived.load(std::memory_order_acquire);
      if (seen == kBroken) return Broken(who, PeerName(r) + " gave up on the clique");
      if (seen >= n) break;
      if (spins < 4096) continue;  // a peer a few microseconds behind
      if (spins % 256 == 0 && std::chrono::steady_clock::now() > deadline) {
        peers_[r].flags->broken_by.store(static_cast<uint64_t>(rank_) + 1, std::memory_order_release);
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
  if (n == 1 && !page_name_.empty()) {  // every peer has mapped our page by now
    shm_unlink(page_name_.c_str());
    page_name_.clear();
  }
  return ffi::Error::Success();
}

ffi::Error SharedWorkspace::Broken(const std::string& who, const std::string& why) {
  broken_ = true;
  own_->broken_by.store(static_cast<uint64_t>(rank_) + 1, std::memory_order_release);
  own_->arrived.store(kBroken, std::memory_order_release);
  return ffi::Error(ffi::ErrorCode::kDeadlineExceeded, who + ": " + why);
}

SharedWorkspace::~SharedWorkspace() {
  ScopedContext scoped(driver_, context_);
  if (local_ != 0) driver_.cuCtxSynchronize();  // nothing queued may still use the mappings
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == rank_) continue;
    if (peers_[r].opened) {
      driver_.cuIpcCloseMemHandle(peers_[r].address);
      peer_mappings.fetch_sub(1);
    }
    UnmapPage(peers_[r].flags);
  }
  UnmapPage(own_);
  if (!page_name_.empty()) shm_unlink(page_name_.c_str());
  if (local_ != 0) {
    driver_.cuMemFree(local_);
    live_workspaces.fetch_sub(1);
  }
}

}  // namespace jmf
