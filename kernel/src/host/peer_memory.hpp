// Where every rank's peer buffer lives for the host executor: caller-given base pointers (ranks as
// threads of one process, or any memory the caller maps), or POSIX shared memory found by a
// rendezvous name (ranks as processes on one host).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/shape.hpp"
#include "host/detail.hpp"
#include "mok/mok.h"

namespace mok::host {

// Shared-memory segments: "/dev/shm/<name>-<rank>", a core::PeerHeader at the start whose setup_*
// fields say whose it is and how far its setup got.
constexpr uint32_t kSegmentMagic = 0x6d6f6b31;  // "mok1"
enum SegmentState : uint32_t {
  kSegmentOpen = 1,      // linked, its creator is setting up
  kSegmentSealed = 2,    // its creator's group agreed on every segment; it is unlinked next
  kSegmentPoisoned = 3,  // a second process claimed the name: the creator's group fails
  kSegmentFailed = 4,    // its creator gave up; it is unlinked next
};

class PeerMemory {
 public:
  PeerMemory() = default;
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;
  ~PeerMemory();

  // Adopt caller-given bases (not owned).
  void adopt(void* const* bases, int world);

  // Create this rank's segment "/dev/shm/<name>-<rank>" (space reserved, header written before it
  // gets its name), map every rank's, agree with every rank on exactly which segments form the
  // group, and unlink this rank's own before returning. Detects a second group using the name, a
  // config that differs between ranks and leftovers of crashed ranks (docs/c-api.md, "Shared
  // memory"). Every wait ends by timeout_ns.
  // A failure's words go to `why`.
  mokStatus_t rendezvous(const char* name, const core::LayerShape& shape, size_t bytes, uint64_t timeout_ns,
                         Detail& why);

  char* base(int rank) const { return bases_[rank]; }
  char* const* bases() const { return bases_; }

 private:
  // Plain arrays, not std containers: their template instances would be exported from libmok.
  char* bases_[core::kMaxWorld] = {};
  int world_ = 0;
  size_t mapped_bytes_ = 0;  // non-zero when the bases are our mappings
};

}  // namespace mok::host
