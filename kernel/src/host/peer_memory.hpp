// Where every rank's peer buffer lives for the host executor: caller-given base pointers (ranks as
// threads of one process, or any memory the caller maps), or POSIX shared memory found by a
// rendezvous name (ranks as processes on one host).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/shape.hpp"
#include "mok/mok.h"

namespace mok::host {

class PeerMemory {
 public:
  PeerMemory() = default;
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;
  ~PeerMemory();

  // Adopt caller-given bases (not owned).
  void adopt(void* const* bases, int world);

  // Create this rank's segment "/<name>-<rank>", map every rank's, and unlink this rank's as soon as
  // every rank has mapped it, so a crash leaves nothing behind. Waits for peers up to timeout_ns.
  mokStatus_t rendezvous(const char* name, int world, int rank, size_t bytes, uint64_t timeout_ns);

  char* base(int rank) const { return bases_[rank]; }
  char* const* bases() const { return bases_; }

 private:
  // Plain arrays, not std containers: their template instances would be exported from libmok.
  char* bases_[core::kMaxWorld] = {};
  int world_ = 0;
  size_t mapped_bytes_ = 0;  // non-zero when the bases are our mappings
};

}  // namespace mok::host
