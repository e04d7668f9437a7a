// The peer table from an NCCL communicator (cuda/nccl_peers.hpp).
#include "cuda/nccl_peers.hpp"

#include <cstdarg>
#include <cstdio>
#include <utility>

#include "core/shape.hpp"

namespace mok::cuda {
namespace {

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

// Every rank's address of the window. NCCL gives NULL for a rank outside this rank's LSA team (not reachable by
// loads and stores: another NVLink domain). Its LSA teams cut the world into equal blocks, so either every rank
// reaches every peer or every rank fails here; each then deregisters, which keeps that collective call matched.
NcclFailure address_peers(const NcclApi& api, NcclPeers* peers) {
  peers->bases.assign(peers->world, nullptr);
  for (int r = 0; r < peers->world; ++r) {
    if (NcclResult res = api.ncclGetPeerDevicePointer(peers->window, 0, r, &peers->bases[r]); res != 0)
      return nccl_failure(api, "ncclGetPeerDevicePointer", res);
    if (peers->bases[r] == nullptr)
      return failure(mokUnsupported,
                     "rank %d of 'nccl_comm' cannot reach rank %d's memory by loads and stores (NCCL gives no "
                     "pointer: it lies outside this rank's NVLink domain); a layer's group must lie in one",
                     peers->rank, r);
  }
  return {};
}

}  // namespace

NcclFailure open_nccl_peers(const NcclApi& api, ncclComm_t comm, size_t bytes, int current_device, NcclPeers* out) {
  NcclPeers peers;
  peers.comm = comm;
  peers.bytes = bytes;
  if (NcclFailure f = read_communicator(api, comm, current_device, &peers); f.status != mokSuccess) return f;
  if (NcclResult r = api.ncclMemAlloc(&peers.buffer, bytes); r != 0) return nccl_failure(api, "ncclMemAlloc", r);
  if (NcclResult r = api.ncclCommWindowRegister(comm, peers.buffer, bytes, &peers.window, kNcclWindowSymmetric);
      r != 0) {
    api.ncclMemFree(peers.buffer);
    return nccl_failure(api, "ncclCommWindowRegister", r);
  }
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
