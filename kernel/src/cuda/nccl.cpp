// NCCL at run time (cuda/nccl.hpp).
#include "cuda/nccl.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace mok::cuda {
namespace {

constexpr const char* kInstall =
    "pip install nvidia-nccl-cu13==2.32.3, then set MOK_NCCL_LIBRARY=<site-packages>/nvidia/nccl/lib/libnccl.so.2 "
    "or put that directory on LD_LIBRARY_PATH";

void append(char* out, size_t size, const char* fmt, const char* arg) {
  size_t used = std::strlen(out);
  if (used < size) std::snprintf(out + used, size - used, fmt, arg);
}

template <class F>
void find(void* handle, const char* name, F** slot, char* missing, size_t size) {
  *slot = reinterpret_cast<F*>(dlsym(handle, name));
  if (!*slot) append(missing, size, missing[0] ? ", %s" : "%s", name);
}

}  // namespace

NcclLoad load_nccl_from(const char* library, NcclApi* api) {
  NcclLoad load;
  *api = NcclApi{};
  std::snprintf(load.library, sizeof(load.library), "%s", library);
  // RTLD_LOCAL: NCCL's symbols serve libmok only, not the rest of the process.
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    std::snprintf(load.message, sizeof(load.message), "NCCL not loaded: dlopen(%s) failed: %s; %s", library,
                  why ? why : "no reason given", kInstall);
    return load;
  }
  char missing[512] = "";
  find(handle, "ncclGetVersion", &api->ncclGetVersion, missing, sizeof(missing));
  find(handle, "ncclGetErrorString", &api->ncclGetErrorString, missing, sizeof(missing));
  find(handle, "ncclCommCount", &api->ncclCommCount, missing, sizeof(missing));
  find(handle, "ncclCommUserRank", &api->ncclCommUserRank, missing, sizeof(missing));
  find(handle, "ncclCommCuDevice", &api->ncclCommCuDevice, missing, sizeof(missing));
  find(handle, "ncclMemAlloc", &api->ncclMemAlloc, missing, sizeof(missing));
  find(handle, "ncclMemFree", &api->ncclMemFree, missing, sizeof(missing));
  find(handle, "ncclCommWindowRegister", &api->ncclCommWindowRegister, missing, sizeof(missing));
  find(handle, "ncclCommWindowDeregister", &api->ncclCommWindowDeregister, missing, sizeof(missing));
  find(handle, "ncclGetPeerDevicePointer", &api->ncclGetPeerDevicePointer, missing, sizeof(missing));
  find(handle, "ncclCommGetAsyncError", &api->ncclCommGetAsyncError, missing, sizeof(missing));
  if (api->ncclGetVersion && api->ncclGetVersion(&api->version) != 0) api->version = 0;
  if (missing[0]) {
    std::snprintf(load.message, sizeof(load.message), "NCCL at %s lacks %s (the peer table needs NCCL >= 2.29; %s)",
                  library, missing, kInstall);
    return load;
  }
  if (api->version < kNcclMinVersion) {
    std::snprintf(load.message, sizeof(load.message),
                  "NCCL at %s is version %d.%d.%d; the peer table needs NCCL >= 2.29 (%s)", library,
                  api->version / 10000, api->version / 100 % 100, api->version % 100, kInstall);
    return load;
  }
  load.loaded = true;
  std::snprintf(load.message, sizeof(load.message), "NCCL %d.%d.%d from %s", api->version / 10000,
                api->version / 100 % 100, api->version % 100, library);
  return load;
}

const NcclLoad& load_nccl(const NcclApi** api) {
  static NcclApi loaded_api;
  static NcclLoad load;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("MOK_NCCL_LIBRARY");
    load = load_nccl_from(path && path[0] ? path : "libnccl.so.2", &loaded_api);
  });
  if (api) *api = &loaded_api;
  return load;
}

}  // namespace mok::cuda
