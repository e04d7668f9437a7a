// POSIX shared-memory rendezvous for ranks that are processes.
//
// Rank r owns the segment /dev/shm/<name>-r. Setup, on every rank:
//   1. create: the segment is made unnamed (O_TMPFILE), its space reserved (posix_fallocate), its
//      header written (owner pid, size, a random nonce, the group shape, state open) and locked
//      (an OFD lock, which the kernel drops when the creator dies); then it gets its name with
//      linkat, which fails when the name exists. So a visible segment is always complete, and a
//      rank killed before this point leaves nothing behind.
//   2. find: every peer's segment is opened by name, its header compared (shape, size), mapped.
//   3. agree: the rank writes the hash of the nonces it mapped (its group key) into its header and
//      waits until every mapped segment carries the same key: then the W creators mapped exactly
//      the same W segments, and no rank mixes incarnations of a name.
//   4. seal: own state open -> sealed by compare-exchange, then wait until every segment is sealed
//      (success) or poisoned or failed (failure). Final states never change, so every rank decides
//      on the same states: the group succeeds or fails as one.
//   5. unlink its own segment, then drop the lock.
// A process that finds its own name held by a live creator (the lock is taken) is a second group
// using the name: it poisons an open segment (open -> poisoned: the creator's group fails) and
// fails. A segment whose lock is free under its name is a dead creator's leftover: whoever meets
// it removes it. A rank that fails keeps its segment (state failed) until every peer has looked at
// it, so each peer reports the same cause.
#include "host/peer_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "core/protocol.hpp"
#include "host/random.hpp"

namespace mok::host {
namespace {

constexpr const char* kShmDir = "/dev/shm";
constexpr size_t kHeaderBytes = sizeof(core::PeerHeader);
constexpr int kAbsent = -1;  // open_named: nothing (left) under the name
constexpr int kFailed = -2;  // open_named: an error was recorded

struct SegmentPath {
  char text[300];
  SegmentPath(const char* name, int rank) { std::snprintf(text, sizeof(text), "%s/%s-%d", kShmDir, name, rank); }
};

template <class T>
T load(T& v) {
  return core::SystemAtomic<T>(v).load(cuda::std::memory_order_acquire);
}

bool change_state(core::PeerHeader* h, uint32_t from, uint32_t to) {
  return core::SystemAtomic<uint32_t>(h->setup_state)
      .compare_exchange_strong(from, to, cuda::std::memory_order_acq_rel);
}

// The creator's lock: taken before the segment has a name, kept until after it lost it.
bool take_lock(int fd) {
  struct flock l{};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  return fcntl(fd, F_OFD_SETLK, &l) == 0;
}

bool lock_held(int fd) {
  struct flock l{};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  return fcntl(fd, F_OFD_GETLK, &l) != 0 || l.l_type != F_UNLCK;
}

uint64_t shm_free_bytes() {
  struct statvfs v{};
  if (statvfs(kShmDir, &v) != 0) return ~0ull;
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
}

double gib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1ull << 30);
}

struct Segment {
  int fd = -1;
  core::PeerHeader* page = nullptr;    // the header alone, mapped while the segment is inspected
  char* base = nullptr;                // the whole segment, once it is this group's
  core::PeerHeader* header = nullptr;  // into base
  ino_t counted = 0;                   // the file whose setup_seen counts this rank
  bool found = false;                  // mapped, or reported
  bool gave_up = false;                // a segment whose creator gave up was seen under the name
};

class Setup {
 public:
  Setup(const char* name, const core::LayerShape& shape, size_t bytes, uint64_t timeout_ns, Detail& why)
      : why_(why),
        name_(name),
        world_(shape.world),
        rank_(shape.rank),
        bytes_(bytes),
        deadline_(core::now_ns() + timeout_ns) {
    core::group_shape(shape, shape_);
  }
  Setup(const Setup&) = delete;
  Setup& operator=(const Setup&) = delete;

  ~Setup() {
    if (linked_) unlink(SegmentPath(name_, rank_).text);
    for (int r = 0; r < world_; ++r) {
      Segment& s = seg_[r];
      if (s.page) munmap(s.page, kHeaderBytes);
      if (s.base && !kept_) munmap(s.base, bytes_);
      if (s.fd >= 0) close(s.fd);  // after the unlink: drops the lock
    }
  }

  mokStatus_t run(char** bases) {
    if (create_own() != mokSuccess) return status_;
    find_peers();
    if (ok()) agree();
    if (ok()) seal();
    if (!ok()) withdraw();
    unlink(SegmentPath(name_, rank_).text);
    linked_ = false;
    if (!ok()) return status_;
    for (int r = 0; r < world_; ++r) bases[r] = seg_[r].base;
    kept_ = true;
    return mokSuccess;
  }

 private:
  bool ok() const { return status_ == mokSuccess; }
  bool late() const { return core::now_ns() > deadline_; }
  core::PeerHeader* own() const { return seg_[rank_].header; }

  // The first failure is the one reported.
  __attribute__((format(printf, 3, 4))) mokStatus_t record(mokStatus_t status, const char* fmt, ...) {
    if (!ok()) return status_;
    char text[900];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(text, sizeof(text), fmt, args);
    va_end(args);
    status_ = fail(why_, status, "mokLayerCreate: %s", text);
    return status_;
  }

  // A collision: the segment of `rank` was claimed twice, or belongs to a group that met a claim.
  mokStatus_t record_collision(int rank, core::PeerHeader* h) {
    collided_ = true;
    SegmentPath path(name_, rank);
    int32_t collider = load(h->setup_collider);
    if (collider != 0)
      return record(mokInvalidUsage,
                    "shared memory name '%s' is in use by another group: pid %d also claimed rank %d's segment '%s' "
                    "(created by pid %d); every group needs a name of its own",
                    name_, collider, rank, path.text, h->setup_owner);
    return record(mokInvalidUsage,
                  "shared memory name '%s' is in use by another group: rank %d's segment '%s' (created by pid %d) "
                  "belongs to a group that met it; every group needs a name of its own",
                  name_, rank, path.text, h->setup_owner);
  }

  mokStatus_t no_space(const char* path, uint64_t free_bytes) {
    return record(mokOutOfMemory,
                  "shared memory '%s': this rank's peer buffer needs %zu bytes (%.2f GiB), but %s has %llu bytes "
                  "(%.2f GiB) free; enlarge it (Docker: --shm-size) or lower config.max_tokens, hidden or top_k",
                  path, bytes_, gib(bytes_), kShmDir, static_cast<unsigned long long>(free_bytes), gib(free_bytes));
  }

  // Step 1: this rank's segment, complete before it has a name.
  mokStatus_t create_own() {
    SegmentPath own_path(name_, rank_);
    const char* path = own_path.text;
    uint64_t free_bytes = shm_free_bytes();
    if (bytes_ > free_bytes) return no_space(path, free_bytes);
    Segment& s = seg_[rank_];
    s.fd = open(kShmDir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (s.fd < 0)
      return record(mokSystemError, "shared memory '%s': open(%s, O_TMPFILE) failed: %s", path, kShmDir,
                    std::strerror(errno));
    // Reserve every page now: a sparse segment larger than the free space dies with SIGBUS later.
    if (int e = posix_fallocate(s.fd, 0, static_cast<off_t>(bytes_)); e != 0)
      return e == ENOSPC ? no_space(path, shm_free_bytes())
                         : record(mokSystemError, "shared memory '%s': posix_fallocate of %zu bytes failed: %s", path,
                                  bytes_, std::strerror(e));
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
    if (p == MAP_FAILED)
      return record(mokSystemError, "shared memory '%s': mmap of %zu bytes failed: %s", path, bytes_,
                    std::strerror(errno));
    s.base = static_cast<char*>(p);
    s.header = reinterpret_cast<core::PeerHeader*>(p);
    if (!take_lock(s.fd))
      return record(mokSystemError, "shared memory '%s': fcntl(F_OFD_SETLK) failed: %s", path, std::strerror(errno));
    core::PeerHeader* h = s.header;
    std::memcpy(h->shape, shape_, sizeof(shape_));
    h->setup_owner = getpid();
    h->setup_bytes = bytes_;
    h->setup_nonce = random_word(static_cast<uint64_t>(rank_));
    h->setup_state = kSegmentOpen;
    core::SystemAtomic<uint32_t>(h->setup_magic).store(kSegmentMagic, cuda::std::memory_order_release);
    return claim_name(path);
  }

  mokStatus_t claim_name(const char* path) {
    char self[64];
    std::snprintf(self, sizeof(self), "/proc/self/fd/%d", seg_[rank_].fd);
    core::Backoff backoff;
    for (;;) {
      if (linkat(AT_FDCWD, self, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0) {
        linked_ = true;
        return mokSuccess;
      }
      if (errno != EEXIST)
        return record(mokSystemError, "shared memory '%s': linkat from %s failed: %s", path, self,
                      std::strerror(errno));
      core::PeerHeader* h = nullptr;
      struct stat st{};
      int fd = open_named(path, &h, &st);
      if (fd == kFailed) return status_;
      if (fd >= 0) {
        uint32_t state = load(h->setup_state);
        bool poisoned = state == kSegmentOpen && poison(h);
        if (!poisoned) state = load(h->setup_state);
        if (poisoned || state == kSegmentPoisoned)
          record(mokInvalidUsage,
                 "shared memory name '%s' is in use by another group: rank %d's segment '%s' belongs to pid %d, "
                 "which is setting up; every group needs a name of its own (that group fails too)",
                 name_, rank_, path, h->setup_owner);
        munmap(h, kHeaderBytes);
        close(fd);
        if (!ok()) return status_;
        // Sealed or failed: its creator unlinks it next.
      }
      if (late())
        return record(mokTimeout, "shared memory '%s': the name stayed taken by a finishing group within the timeout",
                      path);
      backoff.pause();
    }
  }

  static bool poison(core::PeerHeader* h) {
    core::SystemAtomic<int32_t>(h->setup_collider).store(getpid(), cuda::std::memory_order_relaxed);
    return change_state(h, kSegmentOpen, kSegmentPoisoned);
  }

  // What lies under `path`: a live libmok segment (its fd; *page its header), nothing (kAbsent;
  // a dead creator's leftover is removed), or kFailed with the error recorded.
  int open_named(const char* path, core::PeerHeader** page, struct stat* st) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return kAbsent;
      record(mokSystemError, "shared memory '%s': open failed: %s", path, std::strerror(errno));
      return kFailed;
    }
    void* p = MAP_FAILED;
    if (fstat(fd, st) == 0 && static_cast<size_t>(st->st_size) >= kHeaderBytes)
      p = mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    auto* h = static_cast<core::PeerHeader*>(p);
    if (p == MAP_FAILED || load(h->setup_magic) != kSegmentMagic) {
      if (p != MAP_FAILED) munmap(p, kHeaderBytes);
      close(fd);
      record(mokSystemError,
             "shared memory '%s' exists but is not a segment of this libmok version; remove it or choose another name",
             path);
      return kFailed;
    }
    if (take_lock(fd)) {  // its creator is gone: remove the leftover, if the name still means this file
      struct stat now{};
      if (stat(path, &now) == 0 && now.st_ino == st->st_ino && now.st_dev == st->st_dev) unlink(path);
      munmap(p, kHeaderBytes);
      close(fd);
      return kAbsent;
    }
    *page = h;
    return fd;
  }

  // Step 2: every peer's segment. After a failure the rank still visits every peer (counting
  // itself in their setup_seen), so that peers failing too are not kept waiting.
  void find_peers() {
    int missing = world_ - 1;
    core::Backoff backoff;
    while (missing > 0) {
      for (int p = 0; p < world_; ++p)
        if (p != rank_ && !seg_[p].found && find_peer(p)) {
          seg_[p].found = true;
          --missing;
        }
      if (load(own()->setup_state) == kSegmentPoisoned) record_collision(rank_, own());
      if (missing == 0) return;
      if (late()) {
        for (int p = 0; p < world_; ++p)
          if (p != rank_ && !seg_[p].found)
            record(mokTimeout, "shared memory: rank %d's segment '%s' did not appear within the timeout%s", p,
                   SegmentPath(name_, p).text, seg_[p].gave_up ? " (one whose creator gave up was there)" : "");
        return;
      }
      backoff.pause();
    }
  }

  // True once peer p's segment is mapped or a failure about it is recorded.
  bool find_peer(int p) {
    SegmentPath path(name_, p);
    Segment& s = seg_[p];
    if (!ok() && s.counted != 0) return true;  // failed, and already counted in its setup_seen: nothing left to do
    core::PeerHeader* h = nullptr;
    struct stat st{};
    int fd = open_named(path.text, &h, &st);
    if (fd == kFailed) return true;
    if (fd == kAbsent) return false;
    auto drop = [&](bool found) {
      munmap(h, kHeaderBytes);
      close(fd);
      return found;
    };
    uint32_t state = load(h->setup_state);
    if (state == kSegmentSealed) return drop(false);  // a finished group's: unlinked next
    if (s.counted != st.st_ino) {
      core::SystemAtomic<uint32_t>(h->setup_seen).fetch_add(1, cuda::std::memory_order_acq_rel);
      s.counted = st.st_ino;
    }
    for (int i = 0; i < core::kGroupShapeFields; ++i)
      if (h->shape[i] != shape_[i]) {
        record(mokInvalidArgument,
               "argument 'config.%s' differs between rank %d and rank %d; every rank of a group needs the same value",
               core::group_shape_field(i), rank_, p);
        return drop(true);
      }
    // Its creator gave up: maybe an earlier group's rank, so wait for the next one, unless this
    // rank has failed already and visits only to be counted.
    if (state == kSegmentFailed) {
      s.gave_up = true;
      return drop(!ok());
    }
    if (state == kSegmentPoisoned) {
      record_collision(p, h);
      return drop(true);
    }
    if (h->setup_bytes != bytes_ || static_cast<size_t>(st.st_size) != bytes_) {
      record(mokInvalidArgument, "shared memory: rank %d's segment '%s' has %llu bytes, this rank needs %zu", p,
             path.text, static_cast<unsigned long long>(h->setup_bytes), bytes_);
      return drop(true);
    }
    if (!ok()) return drop(true);  // visited only to be counted
    void* b = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b == MAP_FAILED) {
      record(mokSystemError, "shared memory '%s': mmap of %zu bytes failed: %s", path.text, bytes_,
             std::strerror(errno));
      return drop(true);
    }
    s.fd = fd;
    s.page = h;
    s.base = static_cast<char*>(b);
    s.header = reinterpret_cast<core::PeerHeader*>(b);
    return true;
  }

  // Records why segment p's setup cannot succeed any more, if it cannot.
  bool peer_gone(int p) {
    core::PeerHeader* h = seg_[p].header;
    uint32_t state = load(h->setup_state);
    if (state == kSegmentPoisoned) return record_collision(p, h), true;
    if (state == kSegmentFailed)
      return record(mokPeerAbort, "shared memory '%s': rank %d (pid %d) gave up its setup", name_, p, h->setup_owner),
             true;
    if (p != rank_ && state == kSegmentOpen && !lock_held(seg_[p].fd))
      return record(mokPeerAbort, "shared memory '%s': rank %d (pid %d) exited during setup", name_, p, h->setup_owner),
             true;
    return false;
  }

  // Wait until done(p) holds for every rank, a segment's state ends the setup, or the deadline.
  template <class Done>
  void wait_all(Done done, const char* what) {
    bool finished[core::kMaxWorld] = {};
    int left = world_;
    core::Backoff backoff;
    for (;;) {
      for (int p = 0; p < world_ && ok(); ++p)
        if (!finished[p] && !peer_gone(p) && done(p)) {
          finished[p] = true;
          --left;
        }
      if (!ok() || left == 0) return;
      if (late()) {
        for (int p = 0; p < world_; ++p)
          if (!finished[p]) record(mokTimeout, "shared memory '%s': rank %d %s within the timeout", name_, p, what);
        return;
      }
      backoff.pause();
    }
  }

  // Step 3: the same W segments on every rank.
  void agree() {
    uint64_t key = 0;
    for (int r = 0; r < world_; ++r) key = mix(key, seg_[r].header->setup_nonce);
    key = key ? key : 1;
    core::SystemAtomic<uint64_t>(own()->setup_group).store(key, cuda::std::memory_order_release);
    for (int r = 0; r < world_; ++r)
      core::SystemAtomic<uint32_t>(seg_[r].header->mapped).fetch_add(1, cuda::std::memory_order_acq_rel);
    wait_all(
        [&](int p) {
          uint64_t theirs = load(seg_[p].header->setup_group);
          if (theirs != 0 && theirs != key) {
            collided_ = true;
            record(mokInvalidUsage,
                   "shared memory name '%s' is in use by another group: rank %d mapped other segments than rank %d; "
                   "every group needs a name of its own",
                   name_, p, rank_);
          }
          return theirs == key;
        },
        "did not map every rank's segment");
  }

  // Step 4: every segment sealed, or the group fails.
  void seal() {
    if (!change_state(own(), kSegmentOpen, kSegmentSealed)) {
      record_collision(rank_, own());
      return;
    }
    wait_all([&](int p) { return load(seg_[p].header->setup_state) == kSegmentSealed; }, "did not seal its segment");
  }

  // After a failure: stay visible until every peer has looked at this segment, so that each peer
  // finds the cause itself rather than waiting for a segment that is gone. After a collision, stay
  // poisoned until the deadline: ranks of either group that come later meet it and report it.
  void withdraw() {
    change_state(own(), kSegmentOpen, collided_ ? kSegmentPoisoned : kSegmentFailed);  // unless poisoned or sealed
    core::Backoff backoff;
    while ((collided_ || load(own()->setup_seen) < static_cast<uint32_t>(world_ - 1)) && !late()) backoff.pause();
  }

  Detail& why_;  // the first failure's words
  const char* name_;
  int world_, rank_;
  int32_t shape_[core::kGroupShapeFields];
  size_t bytes_;
  uint64_t deadline_;
  Segment seg_[core::kMaxWorld];  // seg_[rank_] is this rank's own
  bool linked_ = false;           // this rank's segment has its name
  bool kept_ = false;             // the mappings went to PeerMemory
  bool collided_ = false;         // the failure is a second group using the name
  mokStatus_t status_ = mokSuccess;
};

}  // namespace

PeerMemory::~PeerMemory() {
  if (mapped_bytes_ == 0) return;
  for (int r = 0; r < world_; ++r)
    if (bases_[r]) munmap(bases_[r], mapped_bytes_);
}

void PeerMemory::adopt(void* const* bases, int world) {
  world_ = world;
  for (int r = 0; r < world; ++r) bases_[r] = static_cast<char*>(bases[r]);
}

mokStatus_t PeerMemory::rendezvous(const char* name, const core::LayerShape& shape, size_t bytes, uint64_t timeout_ns,
                                   Detail& why) {
  Setup setup(name, shape, bytes, timeout_ns, why);
  if (mokStatus_t s = setup.run(bases_); s != mokSuccess) return s;
  world_ = shape.world;
  mapped_bytes_ = bytes;
  return mokSuccess;
}

}  // namespace mok::host
