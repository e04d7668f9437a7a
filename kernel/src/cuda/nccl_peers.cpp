// The peer table from an NCCL communicator (cuda/nccl_peers.hpp).
#include "cuda/nccl_peers.hpp"

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "core/shape.hpp"

namespace mok::cuda {
namespace {

// How long a nonblocking communicator's window registration may take: every rank must arrive, and NCCL's own
// bootstrap has no bound.
constexpr std::chrono::seconds kRegistrationWait{120};

NcclFailure failure(mokStatus_t status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
NcclFailure failure(mokStatus_t status, const char* fmt, ...) {
  NcclFailure f;
  f.status = status;
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(f.message, sizeof(f.message), fmt, args);
  va_end(args);
  return f;
}

// A failed NCCL call, named with NCCL's own words for its result.
NcclFailure nccl_failure(const NcclApi& api, const char* call, NcclResult result) {
  return failure(mokNcclError, "%s failed: NCCL error %d (%s)", call, result, api.ncclGetErrorString(result));
}

// The communicator's rank, size and device, and the rules a layer's group puts on them.
NcclFailure read_communicator(const NcclApi& api, ncclComm_t comm, int current_device, NcclPeers* peers) {
  if (NcclResult r = api.ncclCommCount(comm, &peers->world); r != 0) return nccl_failure(api, "ncclCommCount", r);
  if (NcclResult r = api.ncclCommUserRank(comm, &peers->rank); r != 0) return nccl_failure(api, "ncclCommUserRank", r);
  if (NcclResult r = api.ncclCommCuDevice(comm, &peers->device); r != 0)
    return nccl_failure(api, "ncclCommCuDevice", r);
  if (peers->device != current_device)
    return failure(mokInvalidArgument,
                   "argument 'nccl_comm' is on CUDA device %d but the current device is %d: call cudaSetDevice(%d) "
                   "first (the buffer and the layer live on the communicator's device)",
                   peers->device, current_device, peers->device);
  if (peers->world < 1 || peers->world > core::kMaxWorld)
    return failure(mokInvalidArgument,
                   "argument 'nccl_comm' has %d ranks; a layer's group has 1..%d (config.world): split the "
                   "communicator to the expert-parallel group",
                   peers->world, core::kMaxWorld);
  return {};
}

// Every rank's address of the window. NCCL gives NULL for a rank outside this rank's LSA team (the ranks it reaches
// by loads and stores). Its LSA teams cut the world into equal blocks, so either every rank reaches every peer or
// every rank fails here; each then deregisters, which keeps that collective call matched. (An NCCL error here, on
// some ranks only, would leave the others waiting in their deregistration: NCCL's own failure, not a rule broken.)
NcclFailure address_peers(const NcclApi& api, NcclPeers* peers) {
  peers->bases.assign(peers->world, nullptr);
  for (int r = 0; r < peers->world; ++r) {
    if (NcclResult res = api.ncclGetPeerDevicePointer(peers->window, 0, r, &peers->bases[r]); res != 0)
      return nccl_failure(api, "ncclGetPeerDevicePointer", res);
    if (peers->bases[r] == nullptr)
      return failure(mokUnsupported,
                     "rank %d of 'nccl_comm' cannot reach rank %d's memory by loads and stores (NCCL gives no "
                     "pointer: rank %d is outside this rank's LSA team, the ranks NCCL reaches so, one node's unless "
                     "NCCL spans a multi-node NVLink domain); every rank of a layer's group must reach every other",
                     peers->rank, r, r);
  }
  return {};
}

// How a registration ended: done (its window in `window`), failed at once (NCCL holds nothing), or left running
// (in progress past the bound, its progress unknown, or success without a window: NCCL may still write the window
// and read the buffer).
enum class Registered { done, failed, running };

// A nonblocking communicator's registration runs on after the call (ncclInProgress): wait for it, bounded.
Registered finish_registration(const NcclApi& api, ncclComm_t comm, NcclResult* result) {
  auto deadline = std::chrono::steady_clock::now() + kRegistrationWait;
  bool waited = false;
  while (*result == kNcclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) return Registered::running;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    waited = true;
    if (NcclResult r = api.ncclCommGetAsyncError(comm, result); r != 0) {
      *result = r;
      return Registered::running;
    }
  }
  if (*result != 0) return waited ? Registered::running : Registered::failed;
  return Registered::done;
}

// A window slot NCCL may still write (its registration may still be running): held for the life of the process.
void keep_for_nccl(ncclWindow_t* slot) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<ncclWindow_t>> kept;
  std::lock_guard<std::mutex> lock(mutex);
  kept.emplace_back(slot);
}

// The buffer registered as a symmetric window. NCCL writes the window through the pointer it is given, maybe after
// the call returns, so that slot lives on the heap; where the registration may still be running, the slot and the
// buffer are left to NCCL (never freed: freeing them could corrupt memory) and the message says so.
NcclFailure register_window(const NcclApi& api, NcclPeers* peers) {
  auto* window = new ncclWindow_t(nullptr);
  NcclResult r = api.ncclCommWindowRegister(peers->comm, peers->buffer, peers->bytes, window, kNcclWindowSymmetric);
  Registered how = finish_registration(api, peers->comm, &r);
  if (how == Registered::done && *window != nullptr) {
    peers->window = *window;
    delete window;
    return {};
  }
  if (how == Registered::failed) {
    delete window;
    api.ncclMemFree(peers->buffer);
    peers->buffer = nullptr;
    return nccl_failure(api, "ncclCommWindowRegister", r);
  }
  keep_for_nccl(window);
  peers->buffer = nullptr;  // NCCL's now: kept
  if (r == kNcclInProgress)
    return failure(mokTimeout,
                   "ncclCommWindowRegister did not finish within %lld s (a nonblocking communicator whose peers did "
                   "not all register): abort the communicator (ncclCommAbort); the %zu-byte buffer stays allocated, "
                   "as NCCL may still use it",
                   static_cast<long long>(kRegistrationWait.count()), peers->bytes);
  if (r != 0)
    return failure(mokNcclError,
                   "ncclCommWindowRegister failed after it began: NCCL error %d (%s); the %zu-byte buffer stays "
                   "allocated, as NCCL may still use it",
                   r, api.ncclGetErrorString(r), peers->bytes);
  return failure(mokUnsupported,
                 "ncclCommWindowRegister gave no window: the call was made inside ncclGroupStart/ncclGroupEnd (it "
                 "must not be), or the communicator has no symmetric memory; the %zu-byte buffer stays allocated, as "
                 "NCCL may still register it",
                 peers->bytes);
}

}  // namespace

NcclFailure open_nccl_peers(const NcclApi& api, ncclComm_t comm, size_t bytes, int current_device, NcclPeers* out) {
  NcclPeers peers;
  peers.comm = comm;
  peers.bytes = bytes;
  if (NcclFailure f = read_communicator(api, comm, current_device, &peers); f.status != mokSuccess) return f;
  if (NcclResult r = api.ncclMemAlloc(&peers.buffer, bytes); r != 0) return nccl_failure(api, "ncclMemAlloc", r);
  if (NcclFailure f = register_window(api, &peers); f.status != mokSuccess) return f;
  if (NcclFailure f = address_peers(api, &peers); f.status != mokSuccess) {
    close_nccl_peers(api, &peers);
    return f;
  }
  *out = std::move(peers);
  return {};
}

NcclFailure close_nccl_peers(const NcclApi& api, NcclPeers* peers) {
  NcclFailure first;
  if (peers->window != nullptr) {
    if (NcclResult r = api.ncclCommWindowDeregister(peers->comm, peers->window); r != 0)
      first = nccl_failure(api, "ncclCommWindowDeregister", r);
    peers->window = nullptr;
  }
  if (peers->buffer != nullptr) {
    if (NcclResult r = api.ncclMemFree(peers->buffer); r != 0 && first.status == mokSuccess)
      first = nccl_failure(api, "ncclMemFree", r);
    peers->buffer = nullptr;
  }
  peers->bases.clear();
  return first;
}

}  // namespace mok::cuda
