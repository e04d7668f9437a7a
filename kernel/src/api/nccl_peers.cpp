// C ABI: a layer's peer memory from an NCCL communicator (mok.h, mokNcclPeersCreate; cuda/nccl_peers.hpp).
#include <new>

#include "api/error.hpp"

#if MOK_WITH_CUDA
#include "cuda/nccl_peers.hpp"
#include "cuda/runtime.hpp"

struct mokNcclPeers {
  mok::cuda::NcclPeers table;
};
#else
struct mokNcclPeers {};
#endif

using mok::api::fail;

extern "C" {

MOK_API mokStatus_t mokNcclPeersCreate(void* nccl_comm, size_t bytes, mokNcclPeers_t* peers) {
  mok::api::clear_error();
  MOK_REQUIRE_OUT(peers);
  *peers = nullptr;
  if (nccl_comm == nullptr) return fail(mokInvalidArgument, "%s: argument 'nccl_comm' must not be NULL", __func__);
  if (bytes == 0)
    return fail(mokInvalidArgument, "%s: argument 'bytes' must be at least 1 (mokLayerGetSizes' peer_bytes)", __func__);
#if MOK_WITH_CUDA
  int device = -1;
  if (mok::cuda::QueryFailure q = mok::cuda::current_device(&device); q.call)
    return fail(q.no_device ? mokNoDevice : mokCudaError, "%s: %s: %s (%s)", __func__, q.call, q.error_text,
                q.error_name);
  const mok::cuda::NcclApi* api = nullptr;
  if (const mok::cuda::NcclLoad& load = mok::cuda::load_nccl(&api); !load.loaded)
    return fail(mokUnsupported, "%s: %s", __func__, load.message);
  auto* made = new (std::nothrow) mokNcclPeers;
  if (made == nullptr) return fail(mokOutOfMemory, "%s: the table's allocation failed", __func__);
  mok::cuda::NcclFailure f =
      mok::cuda::open_nccl_peers(*api, static_cast<ncclComm_t>(nccl_comm), bytes, device, &made->table);
  if (f.status != mokSuccess) {
    delete made;
    return fail(f.status, "%s: %s", __func__, f.message);
  }
  *peers = made;
  return mokSuccess;
#else
  return fail(mokNotCompiled,
              "%s: this libmok was built without CUDA (MOK_ENABLE_CUDA=OFF): no layer of it reads "
              "device memory",
              __func__);
#endif
}

MOK_API mokStatus_t mokNcclPeersGetBases(mokNcclPeers_t peers, void* const** peer_bases, int* world, int* rank) {
  mok::api::clear_error();
  if (peers == nullptr) return fail(mokInvalidArgument, "%s: argument 'peers' must not be NULL", __func__);
#if MOK_WITH_CUDA
  if (peer_bases) *peer_bases = peers->table.bases.data();
  if (world) *world = peers->table.world;
  if (rank) *rank = peers->table.rank;
  return mokSuccess;
#else
  (void)peer_bases, (void)world, (void)rank;
  return fail(mokNotCompiled, "%s: this libmok was built without CUDA", __func__);  // no table was ever made
#endif
}

MOK_API mokStatus_t mokNcclPeersDestroy(mokNcclPeers_t peers) {
  mok::api::clear_error();
  if (peers == nullptr) return mokSuccess;
#if MOK_WITH_CUDA
  const mok::cuda::NcclApi* api = nullptr;
  mok::cuda::load_nccl(&api);  // loaded: the table was made with it
  mok::cuda::NcclFailure f = mok::cuda::close_nccl_peers(*api, &peers->table);
  delete peers;
  if (f.status != mokSuccess) return fail(f.status, "%s: %s", __func__, f.message);
#else
  delete peers;
#endif
  return mokSuccess;
}

}  // extern "C"
