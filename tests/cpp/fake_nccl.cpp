// A stand-in NCCL for test_nccl_peers: the entry points cuda/nccl.hpp loads, over host memory, for a group of
// ranks as threads of one process. Its window registration and deregistration each wait for every rank, as NCCL's
// collectives do (bounded: a rank that never comes fails them); its LSA teams are blocks of `lsa_size` ranks, and a
// peer outside the block gets a NULL pointer, as NCCL gives. fake_nccl_fail makes one call fail, or makes the
// registration behave as a nonblocking communicator's ("nonblocking": ncclInProgress, then done at the first
// ncclCommGetAsyncError) or as one without symmetric memory ("no_window": success and no window). The fake_nccl_*
// calls set it up and say what is still allocated.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kSuccess = 0, kSystemError = 2, kInternalError = 3, kInvalidArgument = 4, kInProgress = 7;

struct Group {
  int world = 0, lsa_size = 0, device = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<void*> buffers;  // each rank's registered buffer
  int registered = 0, deregistered = 0;
};

// Waits, bounded, until `count` reaches the group's size: a collective call every rank must make.
bool all_came(Group& g, std::unique_lock<std::mutex>& lock, const int& count) {
  g.changed.notify_all();
  return g.changed.wait_for(lock, std::chrono::seconds(20), [&] { return count >= g.world; });
}

struct Comm {
  Group* group;
  int rank;
  int async_state;  // what ncclCommGetAsyncError says next
};

struct Window {
  Comm* comm;
};

std::mutex state_mutex;
int version = 23203;
int live = 0;  // buffers and windows not yet released
std::string failing_call;

bool fails(const char* call) {
  std::lock_guard<std::mutex> lock(state_mutex);
  return failing_call == call;
}

void count(int delta) {
  std::lock_guard<std::mutex> lock(state_mutex);
  live += delta;
}

}  // namespace

struct ncclComm : Comm {};
struct ncclWindow_vidmem : Window {};

FAKE_API void fake_nccl_set_version(int code) {
  version = code;
}
FAKE_API void fake_nccl_fail(const char* call) {
  std::lock_guard<std::mutex> lock(state_mutex);
  failing_call = call ? call : "";
}
FAKE_API int fake_nccl_live() {
  std::lock_guard<std::mutex> lock(state_mutex);
  return live;
}
// `world` communicators of one group on CUDA device `device`, LSA teams of `lsa_size` ranks.
FAKE_API void fake_nccl_group(int world, int lsa_size, int device, ncclComm** comms) {
  auto* group = new Group;  // lives as long as the test process
  group->world = world;
  group->lsa_size = lsa_size;
  group->device = device;
  group->buffers.assign(world, nullptr);
  for (int r = 0; r < world; ++r) comms[r] = new ncclComm{{group, r, kSuccess}};
}

FAKE_API int ncclGetVersion(int* code) {
  *code = version;
  return kSuccess;
}
FAKE_API const char* ncclGetErrorString(int result) {
  switch (result) {
    case kSuccess: return "no error";
    case kSystemError: return "unhandled system error";
    case kInternalError: return "internal error - please report this issue to the NCCL developers";
    case kInvalidArgument: return "invalid argument";
  }
  return "unknown result code";
}
FAKE_API int ncclCommCount(const ncclComm* comm, int* count) {
  *count = comm->group->world;
  return fails("ncclCommCount") ? kInternalError : kSuccess;
}
FAKE_API int ncclCommUserRank(const ncclComm* comm, int* rank) {
  *rank = comm->rank;
  return kSuccess;
}
FAKE_API int ncclCommCuDevice(const ncclComm* comm, int* device) {
  *device = comm->group->device;
  return kSuccess;
}
FAKE_API int ncclMemAlloc(void** ptr, size_t size) {
  if (fails("ncclMemAlloc")) return kSystemError;
  *ptr = std::calloc(1, size);
  count(1);
  return kSuccess;
}
FAKE_API int ncclMemFree(void* ptr) {
  std::free(ptr);
  count(-1);
  return kSuccess;
}
FAKE_API int ncclCommWindowRegister(ncclComm* comm, void* buffer, size_t, ncclWindow_vidmem** window, int flags) {
  if (fails("ncclCommWindowRegister") || flags != 0x01) return kInvalidArgument;
  Group& g = *comm->group;
  std::unique_lock<std::mutex> lock(g.mutex);
  g.buffers[comm->rank] = buffer;
  ++g.registered;
  if (!all_came(g, lock, g.registered)) return kSystemError;  // a rank never registered: the test's bug, not a hang
  if (fails("no_window")) return kSuccess;
  *window = new ncclWindow_vidmem{{comm}};
  count(1);
  if (!fails("nonblocking")) return kSuccess;
  comm->async_state = kSuccess;  // done by the first poll
  return kInProgress;
}
FAKE_API int ncclCommGetAsyncError(ncclComm* comm, int* state) {
  *state = comm->async_state;
  return kSuccess;
}
FAKE_API int ncclCommWindowDeregister(ncclComm* comm, ncclWindow_vidmem* window) {
  Group& g = *comm->group;
  std::unique_lock<std::mutex> lock(g.mutex);
  ++g.deregistered;
  bool matched = all_came(g, lock, g.deregistered);
  delete window;
  count(-1);
  return matched ? kSuccess : kSystemError;  // a rank that deregisters alone: a mismatched collective
}
FAKE_API int ncclGetPeerDevicePointer(ncclWindow_vidmem* window, size_t offset, int peer, void** ptr) {
  const Comm& comm = *window->comm;
  Group& g = *comm.group;
  if (peer < 0 || peer >= g.world) return kInvalidArgument;
  std::lock_guard<std::mutex> lock(g.mutex);
  bool same_team = peer / g.lsa_size == comm.rank / g.lsa_size;
  *ptr = same_team ? static_cast<char*>(g.buffers[peer]) + offset : nullptr;
  return kSuccess;
}
