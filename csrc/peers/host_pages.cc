// The host flag pages of a clique across processes (peers/host_rendezvous.h):
// this rank's, created under a fresh random name it alone holds; a peer's,
// mapped only once checked to be one page of ours made by that peer; and the
// stale pages of dead processes, removed. host_rendezvous.cc has the
// rendezvous they serve.
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
#include <mutex>

#include "peers/host_rendezvous.h"

namespace jmf {
namespace {

std::atomic<int64_t> shared_pages{0};

constexpr uint64_t kPageMagic = 0x6a6d662d70673031ull;  // "jmf-pg01"
constexpr char kPagePrefix[] = "jmf-";                  // then 32 lowercase hex digits
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

}  // namespace

bool IsPageFileName(const char* name) {
  if (std::strncmp(name, kPagePrefix, sizeof(kPagePrefix) - 1) != 0) return false;
  const char* hex = name + sizeof(kPagePrefix) - 1;
  for (size_t i = 0; i < kPageRandomHex; ++i) {
    if (!((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f'))) return false;
  }
  return hex[kPageRandomHex] == '\0';
}

const uint8_t* ProcessToken() {
  const Token& t = TheToken();
  return t.ok ? t.bytes : nullptr;
}

int64_t LiveSharedPages() { return shared_pages.load(); }

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

HostRendezvous::~HostRendezvous() {
  for (SharedPage* page : pages_) UnmapPage(page);
  ReleaseName();
}

}  // namespace jmf
