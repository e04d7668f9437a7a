// A layer's peer memory from a trainer's NCCL communicator (mokNcclPeersCreate, api/nccl_peers.cpp): each rank's
// buffer from ncclMemAlloc, registered as a symmetric window, and every rank's address of every buffer from
// ncclGetPeerDevicePointer, in the communicator's rank order (memory.peer_bases). Plain C++ over the loaded
// NcclApi, so a test drives it with a stand-in NCCL on a machine without a GPU.
#pragma once

#include <cstddef>
#include <vector>

#include "cuda/nccl.hpp"
#include "mok/mok.h"

namespace mok::cuda {

struct NcclPeers {
  ncclComm_t comm = nullptr;
  void* buffer = nullptr;  // this rank's, from ncclMemAlloc
  ncclWindow_t window = nullptr;
  size_t bytes = 0;
  int world = 0, rank = -1, device = -1;  // ncclCommCount, ncclCommUserRank, ncclCommCuDevice
  std::vector<void*> bases;               // rank r's buffer as this rank's kernels address it
};

// Why a call failed: its status and a message naming the rule or the NCCL call and NCCL's words.
struct NcclFailure {
  mokStatus_t status = mokSuccess;
  char message[512] = "";
};

// Collective over `comm`, as ncclCommWindowRegister is: every rank calls it with the same `bytes`, on the
// communicator's CUDA device, which must be `current_device`. On failure nothing is kept.
NcclFailure open_nccl_peers(const NcclApi& api, ncclComm_t comm, size_t bytes, int current_device, NcclPeers* peers);

// Collective (ncclCommWindowDeregister): deregisters the window and frees the buffer, reporting the first failure.
NcclFailure close_nccl_peers(const NcclApi& api, NcclPeers* peers);

}  // namespace mok::cuda
