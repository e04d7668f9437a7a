// NCCL, loaded at run time: libmok links no NCCL, so it loads where NCCL is absent. The peer table for C++
// trainers (cuda/nccl_peers.hpp: each rank's buffer from ncclMemAlloc, registered as a symmetric window, and every
// peer's address of it from ncclGetPeerDevicePointer) calls these entry points. Pinned: PyPI nvidia-nccl-cu13==2.32.3,
// whose libnccl.so.2 lies in <site-packages>/nvidia/nccl/lib. The library is MOK_NCCL_LIBRARY when that is set (a
// path), else "libnccl.so.2" as the dynamic loader finds it (LD_LIBRARY_PATH, the runpath, ldconfig). No CUDA needed to
// load it or to read its version, so this module is plain C++.
#pragma once

#include <cstddef>

// NCCL's opaque handles, as nccl.h declares them (compatible declarations: a unit may include both).
typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;

namespace mok::cuda {

using NcclResult = int;  // nccl.h's ncclResult_t, an int-sized enum; 0 is ncclSuccess

struct NcclApi {
  NcclResult (*ncclGetVersion)(int* version) = nullptr;
  const char* (*ncclGetErrorString)(NcclResult result) = nullptr;
  NcclResult (*ncclCommCount)(const ncclComm_t comm, int* count) = nullptr;
  NcclResult (*ncclCommUserRank)(const ncclComm_t comm, int* rank) = nullptr;
  NcclResult (*ncclCommCuDevice)(const ncclComm_t comm, int* device) = nullptr;
  NcclResult (*ncclMemAlloc)(void** ptr, size_t size) = nullptr;
  NcclResult (*ncclMemFree)(void* ptr) = nullptr;
  NcclResult (*ncclCommWindowRegister)(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                       int flags) = nullptr;
  NcclResult (*ncclCommWindowDeregister)(ncclComm_t comm, ncclWindow_t win) = nullptr;
  NcclResult (*ncclGetPeerDevicePointer)(ncclWindow_t win, size_t offset, int peer, void** ptr) = nullptr;
  NcclResult (*ncclCommGetAsyncError)(ncclComm_t comm, NcclResult* state) = nullptr;
  int version = 0;  // NCCL_VERSION_CODE of the loaded library (2.32.3: 23203)
};

// The oldest NCCL with every entry point above: ncclGetPeerDevicePointer, the host's view of a window's peers,
// came in 2.29.
constexpr int kNcclMinVersion = 22900;  // 2.29.0

// nccl.h's NCCL_WIN_COLL_SYMMETRIC: a window every rank registers with the same size, which its peers address by
// loads and stores.
constexpr int kNcclWindowSymmetric = 0x01;

// nccl.h's ncclInProgress: a call on a nonblocking communicator still running (ncclCommGetAsyncError says when not).
constexpr NcclResult kNcclInProgress = 7;

// What loading found: `loaded` when the library opened and every entry point above is in it and its version is
// at least kNcclMinVersion; otherwise `message` says why (the library that did not open and dlerror's words, each
// missing symbol by name, or the version), and the entry points that were found are still set.
struct NcclLoad {
  bool loaded = false;
  char library[512] = "";  // the path or name dlopen was given
  char message[1024] = "";
};

// Loads NCCL once per process (later calls return the first outcome; thread-safe). The library stays loaded.
const NcclLoad& load_nccl(const NcclApi** api);

// Loads `library` (a path or a soname) without the process-wide cache: for tests of each failure.
NcclLoad load_nccl_from(const char* library, NcclApi* api);

}  // namespace mok::cuda
