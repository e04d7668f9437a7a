// A stand-in NCCL for test_nccl_peers: the entry points cuda/nccl.hpp loads, over host memory, for a group of
// ranks as threads of one process. Its window registration and deregistration each wait for every rank, as NCCL's
// collectives do (bounded: a rank that never comes fails them); its LSA teams are blocks of `lsa_size` ranks, and a
// peer outside the block gets a NULL pointer, as NCCL gives. fake_nccl_fail makes one call fail, or makes the
// registration behave as a nonblocking communicator's ("nonblocking": ncclInProgress for three polls of
// ncclCommGetAsyncError, the window written only when it is done) or as one without symmetric memory ("no_window":
// success and no window). The fake_nccl_* calls set it up, say what is still allocated and free what a test left.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#define FAKE_API extern "C" __attribute__((visibility("default")))

struct ncclWindow_vidmem;  // NCCL's window type, defined below

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
  int polls_left;                    // of a nonblocking registration: ncclCommGetAsyncError says in progress until 0
  ncclWindow_vidmem** pending_slot;  // where that registration writes its window when done
  ncclWindow_vidmem* pending_window;
};

struct Window {
  Comm* comm;
};

std::mutex state_mutex;
int version = 23203;
int live = 0;  // buffers and windows not yet released
std::set<void*> buffers_alive;
std::string failing_call;
std::vector<std::unique_ptr<Group>> groups;

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

namespace {
std::vector<std::unique_ptr<ncclComm>> communicators;  // every fake_nccl_group's, under state_mutex
}  // namespace

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
// Frees every buffer still allocated (what a refusal deliberately left to NCCL), so the next test starts from none.
FAKE_API void fake_nccl_free_all() {
  std::lock_guard<std::mutex> lock(state_mutex);
  for (void* buffer : buffers_alive) std::free(buffer);
  live -= static_cast<int>(buffers_alive.size());
  buffers_alive.clear();
}
// `world` communicators of one group on CUDA device `device`, LSA teams of `lsa_size` ranks. They live as long as
// the process (held here, so a leak checker sees them reachable).
FAKE_API void fake_nccl_group(int world, int lsa_size, int device, ncclComm** comms) {
  std::lock_guard<std::mutex> lock(state_mutex);
  groups.push_back(std::make_unique<Group>());
  Group* group = groups.back().get();
  group->world = world;
  group->lsa_size = lsa_size;
  group->device = device;
  group->buffers.assign(world, nullptr);
  for (int r = 0; r < world; ++r) {
    communicators.push_back(std::make_unique<ncclComm>(ncclComm{{group, r, 0, nullptr, nullptr}}));
    comms[r] = communicators.back().get();
  }
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
  std::lock_guard<std::mutex> lock(state_mutex);
  buffers_alive.insert(*ptr);
  ++live;
  return kSuccess;
}
FAKE_API int ncclMemFree(void* ptr) {
  std::lock_guard<std::mutex> lock(state_mutex);
  if (buffers_alive.erase(ptr) == 0) return kInvalidArgument;  // not a live buffer: a double free
  std::free(ptr);
  --live;
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
  auto* made = new ncclWindow_vidmem{{comm}};
  count(1);
  if (!fails("nonblocking")) {
    *window = made;
    return kSuccess;
  }
  comm->polls_left = 3;
  comm->pending_slot = window;
  comm->pending_window = made;
  return kInProgress;
}
FAKE_API int ncclCommGetAsyncError(ncclComm* comm, int* state) {
  if (comm->polls_left > 0 && --comm->polls_left == 0) *comm->pending_slot = comm->pending_window;
  *state = comm->polls_left > 0 ? kInProgress : kSuccess;
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
