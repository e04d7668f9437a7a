// cuda/nccl_peers.cpp, the peer table from an NCCL communicator, over a stand-in NCCL (fake_nccl.cpp, host memory,
// ranks as threads, its collectives waiting for every rank), so it runs without a GPU: every rank gets every rank's
// buffer in rank order, a nonblocking communicator's registration is waited for, and each refusal (a peer outside
// the LSA team, another device current, too many ranks, a failed NCCL call, a registration that gives no window) is
// named and keeps nothing. Then the C ABI, mokNcclPeersCreate: its argument rules, and here the status a machine
// without a GPU (or a build without CUDA) gives; on a GPU, two ranks through it over the stand-in.
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "check.hpp"
#include "cuda/nccl_peers.hpp"
#include "mok/mok.h"
#include "mok/mok.hpp"

namespace nccl = mok::cuda;

namespace {

// The stand-in's own calls, found in the library the loader opened (dlopen gives the same handle back).
struct Fake {
  void (*set_version)(int);
  void (*fail)(const char*);
  int (*live)();
  void (*free_all)();
  void (*group)(int, int, int, ncclComm_t*);
};

const char* fake_path() {
  const char* path = std::getenv("MOK_TEST_FAKE_NCCL");
  return path && path[0] ? path : nullptr;
}

const Fake& fake() {
  static Fake f = [] {
    void* handle = dlopen(fake_path(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      std::printf("cannot open the stand-in NCCL %s: %s\n", fake_path(), dlerror());
      std::exit(1);
    }
    Fake made;
    made.set_version = reinterpret_cast<void (*)(int)>(dlsym(handle, "fake_nccl_set_version"));
    made.fail = reinterpret_cast<void (*)(const char*)>(dlsym(handle, "fake_nccl_fail"));
    made.live = reinterpret_cast<int (*)()>(dlsym(handle, "fake_nccl_live"));
    made.free_all = reinterpret_cast<void (*)()>(dlsym(handle, "fake_nccl_free_all"));
    made.group = reinterpret_cast<void (*)(int, int, int, ncclComm_t*)>(dlsym(handle, "fake_nccl_group"));
    return made;
  }();
  return f;
}

const nccl::NcclApi& api() {
  static nccl::NcclApi loaded;
  static bool once = [] {
    nccl::NcclLoad load = nccl::load_nccl_from(fake_path(), &loaded);
    if (!load.loaded) std::printf("the stand-in did not load: %s\n", load.message);
    return load.loaded;
  }();
  (void)once;
  return loaded;
}

bool has(const char* text, const char* part) {
  return std::strstr(text, part) != nullptr;
}

// Every rank of a fresh group of `world` (LSA teams of `lsa_size`) opens its table on its own thread.
std::vector<nccl::NcclFailure> open_group(int world, int lsa_size, size_t bytes, std::vector<nccl::NcclPeers>* peers) {
  std::vector<ncclComm_t> comms(world);
  fake().group(world, lsa_size, 0, comms.data());
  std::vector<nccl::NcclFailure> failures(world);
  peers->assign(world, {});
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] { failures[r] = nccl::open_nccl_peers(api(), comms[r], bytes, 0, &(*peers)[r]); });
  for (std::thread& rank : ranks) rank.join();
  return failures;
}

// Every rank closes its table on its own thread (the deregistration is collective); each must succeed.
void close_group(std::vector<nccl::NcclPeers>* peers) {
  std::vector<nccl::NcclFailure> failures(peers->size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < peers->size(); ++r)
    ranks.emplace_back([&, r] { failures[r] = nccl::close_nccl_peers(api(), &(*peers)[r]); });
  for (std::thread& rank : ranks) rank.join();
  for (size_t r = 0; r < failures.size(); ++r)
    CHECK_MSG(failures[r].status == mokSuccess, "rank %zu closing: %s", r, failures[r].message);
}

// One rank alone (world 1) opens its table.
nccl::NcclFailure open_alone(nccl::NcclPeers* peers) {
  ncclComm_t comm = nullptr;
  fake().group(1, 1, 0, &comm);
  return nccl::open_nccl_peers(api(), comm, 1024, 0, peers);
}

}  // namespace

TEST(every_rank_addresses_every_buffer_in_rank_order) {
  const int world = 5;
  const size_t bytes = 4096;
  std::vector<nccl::NcclPeers> peers;
  std::vector<nccl::NcclFailure> failures = open_group(world, world, bytes, &peers);
  std::mt19937_64 random(mok_test::seed());
  std::vector<uint64_t> marks(world);
  bool opened = true;
  for (int r = 0; r < world; ++r) {
    CHECK_MSG(failures[r].status == mokSuccess, "rank %d: %s", r, failures[r].message);
    opened = opened && failures[r].status == mokSuccess;
  }
  if (!opened) return close_group(&peers);  // what did open is closed: the next cases start from nothing
  for (int r = 0; r < world; ++r) {
    CHECK(peers[r].world == world && peers[r].rank == r && peers[r].device == 0 && peers[r].bytes == bytes);
    CHECK(peers[r].bases.size() == static_cast<size_t>(world));
    marks[r] = random();
    std::memcpy(peers[r].buffer, &marks[r], sizeof(marks[r]));  // each rank writes only its own buffer
  }
  for (int q = 0; q < world; ++q)
    for (int r = 0; r < world; ++r) {
      uint64_t seen = 0;
      std::memcpy(&seen, peers[q].bases[r], sizeof(seen));
      CHECK_MSG(seen == marks[r], "rank %d's entry %d reads %llx, rank %d wrote %llx", q, r,
                static_cast<unsigned long long>(seen), r, static_cast<unsigned long long>(marks[r]));
    }
  CHECK(fake().live() == 2 * world);  // a buffer and a window per rank
  close_group(&peers);
  CHECK_MSG(fake().live() == 0, "%d buffers or windows left after closing", fake().live());
}

TEST(a_peer_outside_the_lsa_team_is_named_and_nothing_kept) {
  std::vector<nccl::NcclPeers> peers;
  std::vector<nccl::NcclFailure> failures = open_group(4, 2, 1024, &peers);  // LSA teams {0, 1}, {2, 3}
  for (int r = 0; r < 4; ++r) {
    CHECK_MSG(failures[r].status == mokUnsupported, "rank %d: status %d", r, failures[r].status);
    CHECK_MSG(has(failures[r].message, "cannot reach rank") && has(failures[r].message, "LSA team"), "%s",
              failures[r].message);
  }
  for (int r = 0; r < 4; ++r) {  // each names the first rank outside its block
    char named[64];
    std::snprintf(named, sizeof(named), "rank %d of 'nccl_comm' cannot reach rank %d", r, r < 2 ? 2 : 0);
    CHECK_MSG(has(failures[r].message, named), "rank %d: %s", r, failures[r].message);
  }
  CHECK_MSG(fake().live() == 0, "%d buffers or windows kept", fake().live());
}

TEST(the_communicators_device_must_be_current) {
  ncclComm_t comm = nullptr;
  fake().group(1, 1, 1, &comm);  // on device 1
  nccl::NcclPeers peers;
  nccl::NcclFailure f = nccl::open_nccl_peers(api(), comm, 1024, 0, &peers);
  CHECK(f.status == mokInvalidArgument);
  CHECK_MSG(has(f.message, "on CUDA device 1 but the current device is 0") && has(f.message, "cudaSetDevice(1)"), "%s",
            f.message);
  CHECK(fake().live() == 0);
}

TEST(a_group_larger_than_72_ranks_is_refused_before_any_collective) {
  std::vector<ncclComm_t> comms(73);
  fake().group(73, 73, 0, comms.data());
  nccl::NcclPeers peers;
  nccl::NcclFailure f = nccl::open_nccl_peers(api(), comms[0], 1024, 0, &peers);  // alone: it must not wait
  CHECK(f.status == mokInvalidArgument);
  CHECK_MSG(has(f.message, "has 73 ranks; a layer's group has 1..72"), "%s", f.message);
  CHECK(fake().live() == 0);
}

TEST(a_failed_nccl_call_is_named_and_nothing_kept) {
  for (const char* call : {"ncclCommCount", "ncclMemAlloc", "ncclCommWindowRegister"}) {
    fake().fail(call);
    ncclComm_t comm = nullptr;
    fake().group(1, 1, 0, &comm);
    nccl::NcclPeers peers;
    nccl::NcclFailure f = nccl::open_nccl_peers(api(), comm, 1024, 0, &peers);
    fake().fail(nullptr);
    CHECK_MSG(f.status == mokNcclError, "%s: status %d", call, f.status);
    CHECK_MSG(has(f.message, call) && has(f.message, "failed: NCCL error"), "%s: %s", call, f.message);
    CHECK_MSG(fake().live() == 0, "%s: %d buffers or windows kept", call, fake().live());
  }
}

// The window appears only when the registration is done (three polls later): it must be read then, not before.
TEST(a_nonblocking_registration_is_waited_for) {
  fake().fail("nonblocking");
  std::vector<nccl::NcclPeers> peers(1);
  nccl::NcclFailure f = open_alone(&peers[0]);
  fake().fail(nullptr);
  CHECK_MSG(f.status == mokSuccess, "%s", f.message);
  CHECK(peers[0].bases.size() == 1 && peers[0].bases[0] == peers[0].buffer);
  close_group(&peers);
  CHECK(fake().live() == 0);
}

// NCCL gives no window inside ncclGroupStart/End and registers the buffer at ncclGroupEnd: it must stay allocated.
TEST(a_registration_without_a_window_is_unsupported_and_leaves_the_buffer_to_nccl) {
  fake().fail("no_window");
  nccl::NcclPeers peers;
  nccl::NcclFailure f = open_alone(&peers);
  fake().fail(nullptr);
  CHECK(f.status == mokUnsupported);
  CHECK_MSG(has(f.message, "gave no window") && has(f.message, "ncclGroupStart") && has(f.message, "stays allocated"),
            "%s", f.message);
  CHECK_MSG(fake().live() == 1, "%d buffers or windows kept, the buffer alone wanted", fake().live());
  fake().free_all();
}

TEST(the_loader_refuses_an_nccl_older_than_2_29) {
  fake().set_version(22809);  // 2.28.9: window registration, but no ncclGetPeerDevicePointer of its own
  nccl::NcclApi old;
  nccl::NcclLoad load = nccl::load_nccl_from(fake_path(), &old);
  fake().set_version(23203);
  CHECK(!load.loaded);
  CHECK_MSG(has(load.message, "version 2.28.9") && has(load.message, "NCCL >= 2.29"), "%s", load.message);
}

TEST(c_abi_rules_and_the_status_without_a_gpu) {
  mokNcclPeers_t peers = reinterpret_cast<mokNcclPeers_t>(1);
  int dummy = 0;
  CHECK(mokNcclPeersCreate(nullptr, 1024, &peers) == mokInvalidArgument && peers == nullptr);
  CHECK_MSG(has(mokGetLastError(), "'nccl_comm'"), "%s", mokGetLastError());
  CHECK(mokNcclPeersCreate(&dummy, 0, &peers) == mokInvalidArgument);
  CHECK_MSG(has(mokGetLastError(), "'bytes'"), "%s", mokGetLastError());
  CHECK(mokNcclPeersCreate(&dummy, 1024, nullptr) == mokInvalidArgument);
  CHECK(mokNcclPeersGetBases(nullptr, nullptr, nullptr, nullptr) == mokInvalidArgument);
  CHECK(mokNcclPeersDestroy(nullptr) == mokSuccess);
  CHECK(std::strcmp(mokGetStatusString(mokNcclError), "mokNcclError: an NCCL call failed") == 0);

  mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
  mokStatus_t device = mokGetDeviceInfo(0, &info);
  if (device == mokNotCompiled || device == mokNoDevice) {  // before NCCL is looked for: no call reaches it
    CHECK_MSG(mokNcclPeersCreate(&dummy, 1024, &peers) == device, "%s", mokGetLastError());
    CHECK(peers == nullptr);
    try {
      mok::NcclPeers owned(&dummy, 1024);
      CHECK_MSG(false, "mok::NcclPeers was made without a GPU");
    } catch (const mok::Error& e) {
      CHECK(e.status() == device);
    }
    std::printf("  without a GPU the C ABI answered \"%s\" (%s)\n", mokGetStatusString(device), mokGetLastError());
    return;
  }
  // A GPU: two ranks through the C ABI over the stand-in (MOK_NCCL_LIBRARY, set by CTest), on device 0.
  std::vector<ncclComm_t> comms(2);
  fake().group(2, 2, 0, comms.data());
  std::vector<mokNcclPeers_t> tables(2, nullptr);
  std::vector<mokStatus_t> statuses(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] { statuses[r] = mokNcclPeersCreate(comms[r], 4096, &tables[r]); });
  for (std::thread& rank : ranks) rank.join();
  for (int r = 0; r < 2; ++r) {
    CHECK_MSG(statuses[r] == mokSuccess, "rank %d: %s", r, mokGetStatusString(statuses[r]));
    void* const* bases = nullptr;
    int world = 0, rank = -1;
    CHECK(mokNcclPeersGetBases(tables[r], &bases, &world, &rank) == mokSuccess);
    CHECK(world == 2 && rank == r && bases != nullptr && bases[0] != nullptr && bases[1] != nullptr);
  }
  ranks.clear();
  for (int r = 0; r < 2; ++r) ranks.emplace_back([&, r] { statuses[r] = mokNcclPeersDestroy(tables[r]); });
  for (std::thread& rank : ranks) rank.join();
  CHECK(statuses[0] == mokSuccess && statuses[1] == mokSuccess);
  CHECK(fake().live() == 0);
}

int main(int argc, char** argv) {
  if (!fake_path()) {
    std::printf("MOK_TEST_FAKE_NCCL is not set: CTest sets it to the stand-in NCCL it builds\n");
    return 1;
  }
  return mok_test::run_all(argc, argv);
}
