// What a C++ trainer writes to use libmok: version check and executor discovery through the C++ wrapper.
#include <cstdio>
#include <mok/mok.hpp>

int main() {
  mok::Version v = mok::version();
  std::printf("libmok %d.%d.%d (header %s)\n", v.major, v.minor, v.patch, MOK_VERSION_STRING);
  if (MOK_VERSION_CODE(v.major, v.minor, v.patch) != MOK_VERSION) {
    std::fprintf(stderr, "header and library versions differ\n");
    return 1;
  }
  std::printf("CUDA architectures: %s\n", mokCudaArchitectures()[0] ? mokCudaArchitectures() : "(none)");
  for (const mok::ExecutorStatus& e : mok::executors()) {
    std::printf("executor %-8s compiled=%d usable=%d%s%s\n", e.name.c_str(), e.compiled, e.supported,
                e.reason.empty() ? "" : "  ", e.reason.c_str());
  }
  return 0;
}
