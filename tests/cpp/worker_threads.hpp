// This process's libmok worker threads, as /proc/self/task lists them, for tests of when a layer makes and
// stops them.
#pragma once

#include <dirent.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>

namespace mok_test {

// The ids of the threads named mok-worker (a sanitizer or the C++ runtime may run threads of its own).
inline std::set<std::string> worker_threads() {
  std::set<std::string> ids;
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return ids;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    char name[64] = {};
    std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      if (std::fgets(name, sizeof(name), f) && std::string(name) == "mok-worker\n") ids.insert(e->d_name);
      std::fclose(f);
    }
  }
  closedir(dir);
  return ids;
}

// The worker threads once they equal `want`, or as they are after 10 s. pthread_join returns when the kernel
// clears the thread's tid, a moment before it drops the thread from /proc/self/task (on a loaded machine, long
// enough for a count to see it): the kernel gets a bounded while, and a thread that was not stopped never goes.
template <class Want>
std::set<std::string> worker_threads_when(Want want) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::set<std::string> now = worker_threads();
  while (!want(now) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    now = worker_threads();
  }
  return now;
}

}  // namespace mok_test
