// Ranks as processes: forked children meet through the shared-memory rendezvous and must produce,
// bit for bit, what the same ranks produce as threads over heap memory.
#include <sys/wait.h>
#include <unistd.h>

#include "group.hpp"

using namespace mok_test;

namespace {

bool same_rank(const Outputs& a, const Outputs& b, int r) {
  return a.out[r] == b.out[r] && a.dx[r] == b.dx[r] && a.dw[r] == b.dw[r] && a.dgate[r] == b.dgate[r] &&
         a.dup[r] == b.dup[r] && a.ddown[r] == b.ddown[r];
}

}  // namespace

TEST(forked_ranks_match_threads_bitwise) {
  std::mt19937_64 rng(seed() + 3);
  Spec s;
  s.world = 3;
  s.max_tokens = 10;
  ref::Problem p = make_problem(s, rng);
  Knobs k;
  Outputs threads = run_layer(p, k);
  CHECK(all_ok(threads));
  std::string name = "mok-proc-" + std::to_string(getpid()) + "-" + std::to_string(seed());
  k.shm_name = name.c_str();
  k.timeout_ms = 20000;
  mokLayerSizes_t sizes = sizes_for(p, k);
  std::vector<pid_t> children;
  for (int r = 0; r < p.world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {  // the child: one rank, then exit with 0 when it matched
      alarm(60);     // bounded even if the rendezvous hangs: the parent's waitpid then returns
      AlignedBuffer work(sizes.workspace_bytes);
      Outputs o = empty_outputs(p.world);
      run_rank(p, k, r, nullptr, work.p, sizes.workspace_bytes, o);
      if (o.status[r] != mokSuccess) std::printf("  child rank %d: %s\n", r, o.detail[r].c_str());
      _exit(o.status[r] == mokSuccess && same_rank(o, threads, r) ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (int r = 0; r < p.world; ++r) {
    int status = 0;
    waitpid(children[r], &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d (pid %d) exited with %d", r, children[r], status);
  }
  for (int r = 0; r < p.world; ++r) {
    std::string path = "/dev/shm/" + name + "-" + std::to_string(r);
    CHECK_MSG(access(path.c_str(), F_OK) != 0, "%s was left behind", path.c_str());
  }
}

MOK_TEST_MAIN
