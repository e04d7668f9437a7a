// POSIX shared-memory rendezvous for ranks that are processes.
#include "host/peer_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "api/error.hpp"
#include "core/protocol.hpp"

namespace mok::host {
namespace {

struct SegmentName {
  char path[256];
  SegmentName(const char* name, int rank) { std::snprintf(path, sizeof(path), "/%s-%d", name, rank); }
};

// Open a peer's segment once it exists at full size (its owner creates, then sizes it).
char* map_peer(const char* path, size_t bytes, uint64_t deadline) {
  core::Backoff backoff;
  for (;;) {
    int fd = shm_open(path, O_RDWR, 0);
    if (fd >= 0) {
      struct stat st{};
      bool sized = fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes;
      void* p = sized ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      close(fd);
      if (p != MAP_FAILED) return static_cast<char*>(p);
    }
    if (core::now_ns() > deadline) return nullptr;
    backoff.pause();
  }
}

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

mokStatus_t PeerMemory::rendezvous(const char* name, int world, int rank, size_t bytes, uint64_t timeout_ns) {
  uint64_t deadline = core::now_ns() + timeout_ns;
  world_ = world;
  mapped_bytes_ = bytes;
  SegmentName own_name(name, rank);
  const char* own = own_name.path;
  int fd = shm_open(own, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return api::fail(mokSystemError, "shared memory '%s': shm_open failed: %s (a stale segment of a crashed run?)", own,
                     std::strerror(errno));
  bool sized = ftruncate(fd, static_cast<off_t>(bytes)) == 0;
  close(fd);
  if (!sized) {
    shm_unlink(own);
    return api::fail(mokSystemError, "shared memory '%s': ftruncate to %zu bytes failed: %s", own, bytes,
                     std::strerror(errno));
  }
  for (int r = 0; r < world; ++r) {
    SegmentName peer(name, r);
    bases_[r] = map_peer(peer.path, bytes, deadline);
    if (!bases_[r]) {
      shm_unlink(own);
      return api::fail(mokTimeout, "shared memory: rank %d's segment '%s' did not appear within the timeout", r,
                       peer.path);
    }
  }
  for (int r = 0; r < world; ++r) {
    auto* h = reinterpret_cast<core::PeerHeader*>(bases_[r]);
    core::SystemAtomic<uint32_t>(h->mapped).fetch_add(1, cuda::std::memory_order_acq_rel);
  }
  core::SystemAtomic<uint32_t> mine(reinterpret_cast<core::PeerHeader*>(bases_[rank])->mapped);
  core::Backoff backoff;
  while (mine.load(cuda::std::memory_order_acquire) < static_cast<uint32_t>(world)) {
    if (core::now_ns() > deadline) {
      shm_unlink(own);
      return api::fail(mokTimeout, "shared memory '%s': not every rank mapped it within the timeout", own);
    }
    backoff.pause();
  }
  shm_unlink(own);
  return mokSuccess;
}

}  // namespace mok::host
