// A minimal test runner: TEST(name) { CHECK(...); } and main() from MOK_TEST_MAIN. A failed CHECK
// reports and fails the test; the process exit status is the number of failed tests.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace mok_test {

struct Case {
  const char* name;
  void (*fn)();
};

inline std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}

inline std::atomic<int>& failures() {
  static std::atomic<int> n{0};
  return n;
}

struct Register {
  Register(const char* name, void (*fn)()) { cases().push_back({name, fn}); }
};

// Fresh random inputs every run; the seed is printed so a failure can be replayed with MOK_TEST_SEED.
inline uint64_t seed() {
  static uint64_t s = [] {
    const char* env = std::getenv("MOK_TEST_SEED");
    uint64_t v = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("seed %llu (replay with MOK_TEST_SEED)\n", static_cast<unsigned long long>(v));
    return v;
  }();
  return s;
}

inline int run_all(int argc, char** argv) {
  seed();
  int failed = 0;
  for (const Case& c : cases()) {
    if (argc > 1 && std::strstr(c.name, argv[1]) == nullptr) continue;
    int before = failures().load();
    std::printf("[ RUN  ] %s\n", c.name);
    std::fflush(stdout);
    c.fn();
    bool ok = failures().load() == before;
    failed += !ok;
    std::printf("[ %s ] %s\n", ok ? " OK " : "FAIL", c.name);
    std::fflush(stdout);
  }
  std::printf("%d of %zu tests failed\n", failed, cases().size());
  return failed;
}

}  // namespace mok_test

#define TEST(name)                                           \
  static void name();                                        \
  static mok_test::Register name##_registered(#name, &name); \
  static void name()

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::printf("  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++mok_test::failures();                                                \
    }                                                                        \
  } while (0)

#define CHECK_MSG(cond, ...)                                                 \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::printf("  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                              \
      std::printf("\n");                                                     \
      ++mok_test::failures();                                                \
    }                                                                        \
  } while (0)

#define MOK_TEST_MAIN                     \
  int main(int argc, char** argv) {       \
    return mok_test::run_all(argc, argv); \
  }
