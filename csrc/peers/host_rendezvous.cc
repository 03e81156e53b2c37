#include "peers/host_rendezvous.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
std::atomic<int64_t> shared_pages{0};

constexpr uint64_t kDepositMagic = 0x6a6d662d77733032ull;  // "jmf-ws02"
constexpr uint64_t kPageMagic = 0x6a6d662d70673031ull;     // "jmf-pg01"
constexpr char kPagePrefix[] = "jmf-";                     // then 32 lowercase hex digits
constexpr size_t kPageRandomHex = 32;
constexpr char kShmDirectory[] = "/dev/shm";  // where glibc's shm_open keeps its objects

bool RandomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

struct Token {
  uint8_t bytes[kTokenBytes];
  bool ok;
};

Token& TheToken() {
  static Token token = [] {
    Token t{};
    t.ok = RandomBytes(t.bytes, sizeof(t.bytes));
    // A forked child is another process: it must not pass for its parent.
    pthread_atfork(nullptr, nullptr, [] { TheToken().ok = RandomBytes(TheToken().bytes, kTokenBytes); });
    return t;
  }();
  return token;
}

// "jmf-" and 32 lowercase hex digits: what this runtime names its pages
// (without the leading slash shm_open takes).
bool IsPageFileName(const char* name) {
  if (std::strncmp(name, kPagePrefix, sizeof(kPagePrefix) - 1) != 0) return false;
  const char* hex = name + sizeof(kPagePrefix) - 1;
  for (size_t i = 0; i < kPageRandomHex; ++i) {
    if (!((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f'))) return false;
  }
  return hex[kPageRandomHex] == '\0';
}

// Whether `name` in `directory` is still the file open as `fd` (it was not
// unlinked and replaced in between).
bool StillNamed(int directory, const char* name, int fd) {
  struct stat open_file, named;
  return fstat(fd, &open_file) == 0 && fstatat(directory, name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
         open_file.st_dev == named.st_dev && open_file.st_ino == named.st_ino;
}

// A page's creator holds an exclusive flock on it for as long as its name
// exists, so a page of ours that nobody holds belongs to a process that died
// before it could unlink it (a crash during set-up). Pids are not asked: they
// repeat, and a peer in another pid namespace has a pid we cannot see.
void RemoveStalePages() {
  DIR* dir = opendir(kShmDirectory);
  if (dir == nullptr) return;
  const int directory = dirfd(dir);
  while (const dirent* entry = readdir(dir)) {
    if (!IsPageFileName(entry->d_name)) continue;
    const int fd = openat(directory, entry->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        StillNamed(directory, entry->d_name, fd)) {
      unlinkat(directory, entry->d_name, 0);
    }
    close(fd);  // drops the lock
  }
  closedir(dir);
}

std::once_flag stale_pages_once;

void UnmapPage(SharedPage* page) {
  if (page == nullptr) return;
  munmap(page, kPageBytes);
  shared_pages.fetch_sub(1);
}

std::string Octal(unsigned mode) {
  char text[16];
  std::snprintf(text, sizeof(text), "%04o", mode & 07777);
  return text;
}

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

const uint8_t* ProcessToken() {
  const Token& t = TheToken();
  return t.ok ? t.bytes : nullptr;
}

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

int64_t LiveSharedPages() { return shared_pages.load(); }

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

// A fresh random name each time, created exclusively: nobody can predict it
// to pre-create it, and a name that exists anyway is skipped, not an error.
ffi::Error HostRendezvous::CreatePage(const std::string& who) {
  std::call_once(stale_pages_once, RemoveStalePages);
  const uint8_t* token = ProcessToken();
  if (token == nullptr) {
    return ffi::Error::Internal(who +
                                ": no random bytes from getrandom(2) for the host flag page: " + std::strerror(errno));
  }
  int last_errno = EEXIST;
  for (int attempt = 0; attempt < 16; ++attempt) {
    uint8_t random[kPageRandomHex / 2];
    if (!RandomBytes(random, sizeof(random))) {
      last_errno = errno;
      break;
    }
    std::string name = std::string("/") + kPagePrefix;
    for (uint8_t b : random) {
      name += "0123456789abcdef"[b >> 4];
      name += "0123456789abcdef"[b & 15];
    }
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW, 0600);
    if (fd < 0) {
      last_errno = errno;
      if (errno == EEXIST) continue;
      break;
    }
    // Another process's stale-page sweep may have opened the name between its
    // creation and this lock: if it holds the lock or already unlinked the
    // name, it removes the page, and we take another name.
    const int directory = open(kShmDirectory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool ours =
        flock(fd, LOCK_EX | LOCK_NB) == 0 && (directory < 0 || StillNamed(directory, name.c_str() + 1, fd));
    if (directory >= 0) close(directory);
    if (!ours) {
      close(fd);
      last_errno = EEXIST;
      continue;
    }
    if (ftruncate(fd, kPageBytes) != 0) {
      last_errno = errno;
      shm_unlink(name.c_str());
      close(fd);
      break;
    }
    void* mapped = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      last_errno = errno;
      shm_unlink(name.c_str());
      close(fd);
      break;
    }
    shared_pages.fetch_add(1);
    auto* page = static_cast<SharedPage*>(mapped);
    page->magic = kPageMagic;
    page->pid = static_cast<uint64_t>(getpid());
    std::memcpy(page->token, token, kTokenBytes);
    pages_[rank_] = page;
    page_name_ = name;
    page_names_[rank_] = name;
    page_fd_ = fd;
    return ffi::Error::Success();
  }
  return ffi::Error::Internal(who + ": creating the host flag page in /dev/shm: " + std::strerror(last_errno));
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

// The page a deposit names must be one page of ours, and made by the process
// that sent the deposit: anything else could fault (a short file), be
// another user's, or lead us into someone else's rendezvous.
ffi::Error HostRendezvous::MapPeerPage(int r, const DepositRecord& d, const std::string& who, const std::string& peer) {
  const std::string page = peer + "'s host flag page " + d.page;
  auto refuse = [&](const std::string& why) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, who + ": " + page + " " + why + ": refused");
  };
  for (int other = 0; other < size(); ++other) {
    if (page_names_[other] == d.page) {
      return refuse("is already rank " + std::to_string(other) + "'s");
    }
  }
  const int fd = shm_open(d.page, O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      who + ": opening " + page + ": " + std::strerror(errno) + " (did that process exit?)");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return refuse(std::string("cannot be examined (") + std::strerror(error) + ")");
  }
  std::string problem;
  if (!S_ISREG(st.st_mode)) {
    problem = "is not a plain file";
  } else if (st.st_uid != geteuid()) {
    problem =
        "belongs to uid " + std::to_string(st.st_uid) + ", not to this process's uid " + std::to_string(geteuid());
  } else if ((st.st_mode & 077) != 0) {
    problem = "is open to other users (mode " + Octal(st.st_mode) + ")";
  } else if (st.st_size != static_cast<off_t>(kPageBytes)) {
    problem = "holds " + std::to_string(st.st_size) + " bytes, not " + std::to_string(kPageBytes);
  }
  if (!problem.empty()) {
    close(fd);
    return refuse(problem);
  }
  void* mapped = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (mapped == MAP_FAILED) return ffi::Error::Internal(who + ": mapping " + page + ": " + std::strerror(error));
  shared_pages.fetch_add(1);
  auto* mapped_page = static_cast<SharedPage*>(mapped);
  pages_[r] = mapped_page;
  page_names_[r] = d.page;
  if (mapped_page->magic != kPageMagic || std::memcmp(mapped_page->token, d.token, kTokenBytes) != 0) {
    return refuse("was not made by the process that sent the deposit");
  }
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

void HostRendezvous::ReleaseName() {
  if (!page_name_.empty()) {
    shm_unlink(page_name_.c_str());
    page_name_.clear();
  }
  if (page_fd_ >= 0) {  // no name left to sweep: the lock has nothing more to say
    close(page_fd_);
    page_fd_ = -1;
  }
}

ffi::Error HostRendezvous::Broken(const std::string& who, const std::string& why) {
  broken_ = true;
  HostFlags& own = pages_[rank_]->flags;
  own.broken_by.store(static_cast<uint64_t>(rank_) + 1, std::memory_order_release);
  own.arrived.store(kBroken, std::memory_order_release);
  return ffi::Error(ffi::ErrorCode::kDeadlineExceeded, who + ": " + why);
}

HostRendezvous::~HostRendezvous() {
  for (SharedPage* page : pages_) UnmapPage(page);
  ReleaseName();
}

}  // namespace jmf
