// The shared-memory setup of ranks as processes: space reserved up front, two groups using one name,
// a rank killed during setup, a config that differs between ranks. Every forked child is bounded
// (alarm) and reaped; every test checks that nothing of its names stays in /dev/shm.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "group.hpp"

using namespace mok_test;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string unique_name(const char* what) {
  static int serial = 0;
  return std::string("mok-") + what + "-" + std::to_string(getpid()) + "-" + std::to_string(seed() % 100000) + "-" +
         std::to_string(serial++);
}

// Entries of /dev/shm that belong to `name`'s segments.
std::vector<std::string> leftovers(const std::string& name) {
  std::vector<std::string> found;
  DIR* d = opendir("/dev/shm");
  if (!d) return found;
  std::string prefix = name + "-";
  while (dirent* e = readdir(d))
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) found.push_back(e->d_name);
  closedir(d);
  return found;
}

// Checks that nothing of `name` is left, and removes what is, so a failing test leaves no trace.
void check_clean(const std::string& name) {
  for (const std::string& f : leftovers(name)) {
    CHECK_MSG(false, "/dev/shm/%s was left behind", f.c_str());
    unlink(("/dev/shm/" + f).c_str());
  }
}

// A child process running `body` (its exit code), killed by SIGALRM after `limit_s` in any case.
template <class Body>
pid_t spawn(unsigned limit_s, Body body) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(limit_s);
    int code = body();
    std::fflush(stdout);
    _exit(code);
  }
  CHECK_MSG(pid > 0, "fork failed");
  return pid;
}

// The child's wait status; after `limit_s` it is killed (and reported as killed).
int reap(pid_t pid, double limit_s) {
  auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (seconds_since(t0) > limit_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    usleep(2000);
  }
  return status;
}

bool same_rank(const Outputs& a, const Outputs& b, int r) {
  return a.out[r] == b.out[r] && a.dx[r] == b.dx[r] && a.dw[r] == b.dw[r] && a.dgate[r] == b.dgate[r] &&
         a.dup[r] == b.dup[r] && a.ddown[r] == b.ddown[r];
}

// What a forked rank tells its parent.
enum Exit { kMatched = 0, kWrongData = 1, kCollisionReported = 2, kOtherFailure = 3 };

// One rank of `p` in this process: exit code from its outcome against the threads run `want`.
int rank_process(const ref::Problem& p, const Knobs& k, int r, const Outputs& want, bool quiet) {
  mokLayerSizes_t sizes = sizes_for(p, k);
  AlignedBuffer work(sizes.workspace_bytes);
  Outputs o = empty_outputs(p.world);
  run_rank(p, k, r, nullptr, work.p, sizes.workspace_bytes, o);
  if (o.status[r] == mokSuccess) return same_rank(o, want, r) ? kMatched : kWrongData;
  if (!quiet) std::printf("  rank %d (pid %d): %s\n", r, getpid(), o.detail[r].c_str());
  return std::strstr(o.detail[r].c_str(), "in use by another group") ? kCollisionReported : kOtherFailure;
}

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

// A segment larger than free /dev/shm was created sparse, so setup succeeded and a later pass died
// with SIGBUS. The size is chosen above the whole of /dev/shm, so the check never fills it even
// for a moment.
TEST(segment_larger_than_free_shm_fails_at_create) {
  struct statvfs v{};
  CHECK(statvfs("/dev/shm", &v) == 0);
  uint64_t total = static_cast<uint64_t>(v.f_blocks) * v.f_frsize, free_bytes = uint64_t(v.f_bavail) * v.f_frsize;
  mokLayerConfig_t c = MOK_LAYER_CONFIG_INIT;
  c.experts_per_rank = c.intermediate = c.top_k = 1;
  c.hidden = 1 << 14;
  c.expert_padding = c.minibatch = c.macrobatch = 8;
  mokLayerSizes_t sizes = MOK_LAYER_SIZES_INIT;
  for (c.max_tokens = 1024; c.max_tokens < (1 << 24); c.max_tokens *= 2) {
    CHECK(mokLayerGetSizes(&c, &sizes) == mokSuccess);
    if (sizes.peer_bytes > total + total / 4) break;
  }
  if (sizes.peer_bytes <= total) {
    std::printf("  skipped: /dev/shm (%llu bytes) is larger than any config's peer buffer\n",
                static_cast<unsigned long long>(total));
    return;
  }
  // The workspace is only reserved address space: creation fails before touching it.
  void* work =
      mmap(nullptr, sizes.workspace_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (work == MAP_FAILED) {
    std::printf("  skipped: cannot reserve %zu bytes of address space for the workspace\n", sizes.workspace_bytes);
    return;
  }
  std::string name = unique_name("space");
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  m.shm_name = name.c_str();
  m.workspace = work;
  m.workspace_bytes = sizes.workspace_bytes;
  mokLayer_t layer = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  mokStatus_t s = mokLayerCreate(&c, &m, &layer);
  double took = seconds_since(t0);
  std::string detail = mokGetLastError();
  std::printf("  asked %zu bytes, /dev/shm %llu free of %llu: %s (%.3f s)\n", sizes.peer_bytes,
              static_cast<unsigned long long>(free_bytes), static_cast<unsigned long long>(total), detail.c_str(),
              took);
  CHECK_MSG(s == mokOutOfMemory, "status %s", mokGetStatusString(s));
  CHECK_MSG(detail.find(std::to_string(sizes.peer_bytes) + " bytes") != std::string::npos, "bytes asked missing");
  CHECK_MSG(detail.find("free") != std::string::npos, "free space missing");
  CHECK_MSG(detail.find("/dev/shm/" + name + "-0") != std::string::npos, "segment name missing");
  CHECK_MSG(took < 2.0, "took %.3f s", took);  // the check comes before any page is reserved
  if (s == mokSuccess) mokLayerDestroy(layer);
  munmap(work, sizes.workspace_bytes);
  check_clean(name);
}

// Two groups of 2 or 3 processes use one name at the same time, many times. The rank at one index
// (drawn per trial) is held back in both groups, so no set of ranks can complete its setup before
// every other rank of both groups has claimed its name: the overlap the documented guarantee
// covers. The others start at once (a few random microseconds apart), so who wins which index
// differs from trial to trial; the stragglers start together once the losers are done. No rank may
// succeed (with the other group's data or at all: every rank met the collision), and every rank
// reports it.
TEST(two_groups_sharing_a_name_never_cross_wire) {
  std::mt19937_64 rng(seed() + 7);
  int counts[4] = {}, died = 0, trials = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (; trials < 30 && seconds_since(t0) < 30; ++trials) {
    Spec s;
    s.world = 2 + trials % 2;
    s.max_tokens = 6;
    s.ragged = false;  // the same config in both groups: only the data tells them apart
    ref::Problem group[2] = {make_problem(s, rng), make_problem(s, rng)};
    Knobs heap;
    Outputs want[2] = {run_layer(group[0], heap), run_layer(group[1], heap)};
    CHECK(all_ok(want[0]) && all_ok(want[1]));
    std::string name = unique_name("collide");
    Knobs k;
    k.shm_name = name.c_str();
    k.timeout_ms = 2500;  // the winners wait for the stragglers meanwhile; colliding ranks linger this long
    int late = static_cast<int>(rng() % s.world);
    int go[2][2];
    for (auto& pipe_ends : go) CHECK(pipe(pipe_ends) == 0);
    std::vector<pid_t> pids(2 * s.world);
    for (int g = 0; g < 2; ++g)
      for (int r = 0; r < s.world; ++r) {
        unsigned delay_us = static_cast<unsigned>(rng() % 500);
        int wave = r == late;
        pids[g * s.world + r] = spawn(30, [&, g, r, wave, delay_us] {
          for (auto& pipe_ends : go) close(pipe_ends[1]);
          char byte;
          (void)!read(go[wave][0], &byte, 1);  // starts when the parent closes its wave's pipe
          usleep(delay_us);
          return rank_process(group[g], k, r, want[g], true);
        });
      }
    for (auto& pipe_ends : go) close(pipe_ends[0]);
    close(go[0][1]);
    // Wait for the first wave's losers (one per index but `late`): they fail as soon as they meet the name.
    std::vector<int> code(pids.size(), -1);
    int losers = 0;
    auto wave0 = std::chrono::steady_clock::now();
    while (losers < s.world - 1 && seconds_since(wave0) < 10) {
      for (size_t i = 0; i < pids.size(); ++i) {
        int status = 0;
        if (code[i] < 0 && static_cast<int>(i) % s.world != late && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
          code[i] = exit_code(status);
          ++losers;
        }
      }
      usleep(500);
    }
    CHECK_MSG(losers == s.world - 1, "trial %d: %d of %d first-wave losers ended", trials, losers, s.world - 1);
    close(go[1][1]);
    for (size_t i = 0; i < pids.size(); ++i) {
      if (code[i] < 0) code[i] = exit_code(reap(pids[i], 30));
      int g = static_cast<int>(i) / s.world, r = static_cast<int>(i) % s.world;
      CHECK_MSG(code[i] != kWrongData, "trial %d: group %d rank %d succeeded with the other group's data", trials, g,
                r);
      CHECK_MSG(code[i] != kMatched, "trial %d: group %d rank %d succeeded despite the collision", trials, g, r);
      CHECK_MSG(code[i] == kCollisionReported || code[i] == kWrongData || code[i] == kMatched,
                "trial %d: group %d rank %d ended with code %d, not the collision", trials, g, r, code[i]);
      if (code[i] >= 100)
        ++died;
      else
        ++counts[code[i]];
    }
    check_clean(name);
  }
  std::printf(
      "  %d trials in %.1f s: ranks matched %d, wrong %d, reported the collision %d, failed otherwise %d, "
      "died %d\n",
      trials, seconds_since(t0), counts[kMatched], counts[kWrongData], counts[kCollisionReported],
      counts[kOtherFailure], died);
}

// A rank killed during setup (its segment made, its peer never coming) leaked its segment for
// good, and the next group with the name failed on it. Twice: the next group's rank 0 comes first
// (it meets the leftover under its own name), then its rank 1 (a peer meets it).
TEST(rank_killed_during_setup_leaves_nothing_for_the_next_group) {
  std::mt19937_64 rng(seed() + 11);
  Spec s;
  s.world = 2;
  ref::Problem p = make_problem(s, rng);
  Outputs want = run_layer(p, Knobs{});
  CHECK(all_ok(want));
  for (int first : {0, 1}) {
    std::string name = unique_name("killed");
    std::string segment = "/dev/shm/" + name + "-0";
    Knobs k;
    k.shm_name = name.c_str();
    k.timeout_ms = 15000;
    pid_t lonely = spawn(30, [&] { return rank_process(p, k, 0, want, true); });
    auto t0 = std::chrono::steady_clock::now();
    while (access(segment.c_str(), F_OK) != 0 && seconds_since(t0) < 10) usleep(1000);
    CHECK_MSG(access(segment.c_str(), F_OK) == 0, "rank 0 never created %s", segment.c_str());
    kill(lonely, SIGKILL);
    int status = reap(lonely, 10);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    CHECK_MSG(access(segment.c_str(), F_OK) == 0, "the killed rank's segment is expected to stay until reclaimed");
    pid_t ranks[2];
    ranks[first] = spawn(30, [&] { return rank_process(p, k, first, want, false); });
    usleep(20000);
    ranks[1 - first] = spawn(30, [&] { return rank_process(p, k, 1 - first, want, false); });
    for (int r = 0; r < 2; ++r)
      CHECK_MSG(exit_code(reap(ranks[r], 40)) == kMatched, "rank %d of the next group (rank %d first)", r, first);
    check_clean(name);
  }
}

// A config that differs between ranks in a field that sizes the peer buffer was reported as a
// timeout ("segment did not appear") after the full timeout. Twice: all ranks at once, and rank 1
// coming late, when ranks 0 and 2 have already failed (so rank 1 meets a failed segment first).
TEST(config_differing_between_ranks_is_named_at_create) {
  std::mt19937_64 rng(seed() + 13);
  Spec s;
  s.world = 3;
  ref::Problem p = make_problem(s, rng);
  for (int late_ms : {0, 100}) {
    std::string name = unique_name("shape");
    Knobs k;
    k.shm_name = name.c_str();
    k.timeout_ms = 10000;
    k.edit_config = [late_ms](int r, mokLayerConfig_t& c) {
      if (r == 2) c.hidden /= 2;  // smaller, so rank 2's workspace (sized for rank 0) stays large enough
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
    };
    auto t0 = std::chrono::steady_clock::now();
    Outputs o = run_layer(p, k);
    double took = seconds_since(t0);
    for (int r = 0; r < s.world; ++r) {
      std::printf("  rank %d: %s: %s\n", r, mokGetStatusString(o.status[r]), o.detail[r].c_str());
      CHECK_MSG(o.status[r] == mokInvalidArgument, "rank %d: %s", r, mokGetStatusString(o.status[r]));
      CHECK_MSG(o.detail[r].find("mokLayerCreate: argument 'config.hidden' differs between rank") != std::string::npos,
                "rank %d: %s", r, o.detail[r].c_str());
    }
    CHECK_MSG(took < 3.0, "rank 1 %d ms late: took %.2f s of a %d ms timeout", late_ms, took, k.timeout_ms);
    check_clean(name);
  }
}

// The same name for consecutive groups (create, destroy, create) is reuse, not a collision: three
// processes run five groups in a row with one name, each rank starting its next group as soon as it
// is done, while its peers may still be finishing the previous setup.
TEST(consecutive_groups_reuse_a_name) {
  std::mt19937_64 rng(seed() + 17);
  Spec s;
  s.world = 3;
  ref::Problem p = make_problem(s, rng);
  Outputs want = run_layer(p, Knobs{});
  CHECK(all_ok(want));
  std::string name = unique_name("again");
  Knobs k;
  k.shm_name = name.c_str();
  k.timeout_ms = 10000;
  std::vector<pid_t> pids;
  for (int r = 0; r < s.world; ++r)
    pids.push_back(spawn(60, [&, r] {
      for (int round = 0; round < 5; ++round)
        if (int code = rank_process(p, k, r, want, false); code != kMatched) return code;
      return static_cast<int>(kMatched);
    }));
  for (int r = 0; r < s.world; ++r) CHECK_MSG(exit_code(reap(pids[r], 70)) == kMatched, "rank %d", r);
  check_clean(name);
}

MOK_TEST_MAIN

// Fills /dev/shm until it is full: a file of real pages (written, not sparse), removed by check_clean.
void fill_shm(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return;
  static char chunk[1 << 16];
  std::memset(chunk, 0x5a, sizeof(chunk));
  while (std::fwrite(chunk, 1, sizeof(chunk), f) == sizeof(chunk)) {
  }
  std::fclose(f);
}

// The space of a segment is reserved when it is created, so /dev/shm filling up afterwards (another job, a
// second group) cannot make a pass die with SIGBUS on a page it writes for the first time. Meaningful in a
// small /dev/shm only: tests/library/test_cpp_suite.py runs it in a private 64 MiB tmpfs.
TEST(reserved_segment_survives_a_full_shm) {
  struct statvfs v{};
  CHECK(statvfs("/dev/shm", &v) == 0);
  uint64_t free_bytes = uint64_t(v.f_bavail) * v.f_frsize;
  if (uint64_t(v.f_blocks) * v.f_frsize > (256ull << 20)) {
    std::printf(
        "  skipped: /dev/shm is larger than 256 MiB (run in a small private tmpfs, as test_cpp_suite.py does)\n");
    return;
  }
  Spec s;
  s.world = 1;
  s.hidden = 256;
  s.ragged = false;
  s.max_tokens = static_cast<int>(free_bytes / 2 / (s.hidden * 2 * (2 + 2 * s.top_k)));  // about half of free
  std::mt19937_64 rng(seed());
  ref::Problem p = make_problem(s, rng);
  std::string name = unique_name("full");
  std::string filler = "/dev/shm/" + name + "-filler";
  Knobs k;
  k.shm_name = name.c_str();
  k.created = [&](int, mokLayer_t) { fill_shm(filler); };  // after setup, before the first pass writes
  mokLayerSizes_t sizes = sizes_for(p, k);
  std::printf("  segment %zu bytes, /dev/shm %llu free\n", sizes.peer_bytes,
              static_cast<unsigned long long>(free_bytes));
  CHECK(sizes.peer_bytes < free_bytes);
  pid_t child = spawn(60, [&] {
    AlignedBuffer work(sizes.workspace_bytes);
    Outputs o = empty_outputs(1);
    run_rank(p, k, 0, nullptr, work.p, sizes.workspace_bytes, o);
    if (o.status[0] != mokSuccess) std::printf("  rank 0: %s\n", o.detail[0].c_str());
    return o.status[0] == mokSuccess ? 0 : 3;
  });
  int code = exit_code(reap(child, 60));
  CHECK_MSG(code == 0, "the pass over a full /dev/shm exited with %d (%d + signal: %d is SIGBUS)", code, 100, SIGBUS);
  unlink(filler.c_str());
  check_clean(name);
}
