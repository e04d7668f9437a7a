// Random identities of the host executor: a context's incarnation (host/layer.cpp) and a
// shared-memory segment's nonce (host/peer_memory.cpp), and the hash that combines nonces.
#pragma once

#include <sys/random.h>
#include <unistd.h>

#include <cstdint>

#include "core/platform.hpp"

namespace mok::host {

// splitmix64's finaliser over h ^ v.
inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// A random non-zero word. Mixed with the clock, the process and `salt` (a rank), so that even a failed
// getrandom gives distinct values across ranks and processes.
inline uint64_t random_word(uint64_t salt) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) v = 0;
  uint64_t z = mix(v, core::now_ns() ^ (static_cast<uint64_t>(getpid()) << 32) ^ salt);
  return z ? z : 1;
}

}  // namespace mok::host
