// cuda/nccl.cpp: NCCL loaded at run time. Each way it can be missing gives a message naming what is missing; the
// pinned wheel's library (MOK_TEST_NCCL_WHEEL, from CMake) loads and reports its version, on a machine without GPU.
// `test_nccl_loader wheel` runs only that case and exits 77 (skipped, saying why) without the wheel.
#include <cstdlib>
#include <cstring>
#include <string>

#include "check.hpp"
#include "cuda/nccl.hpp"

namespace nccl = mok::cuda;

namespace {

bool has(const char* text, const char* part) {
  return std::strstr(text, part) != nullptr;
}

const char* wheel() {
  const char* path = std::getenv("MOK_TEST_NCCL_WHEEL");
  return path && path[0] ? path : nullptr;
}

}  // namespace

TEST(absent_library_is_named_with_the_install_hint) {
  nccl::NcclApi api;
  nccl::NcclLoad load = nccl::load_nccl_from("/nonexistent/libnccl.so.2", &api);
  CHECK(!load.loaded);
  CHECK_MSG(has(load.message, "dlopen(/nonexistent/libnccl.so.2) failed"), "%s", load.message);
  CHECK_MSG(has(load.message, "nvidia-nccl-cu13==2.32.3"), "%s", load.message);
  CHECK(api.ncclGetVersion == nullptr && api.version == 0);
}

TEST(a_library_without_ncclsymbols_names_each_missing_one) {
  nccl::NcclApi api;
  nccl::NcclLoad load = nccl::load_nccl_from("libm.so.6", &api);  // loads, but holds no NCCL
  CHECK(!load.loaded);
  for (const char* name :
       {"ncclGetVersion", "ncclMemAlloc", "ncclMemFree", "ncclCommWindowRegister", "ncclCommWindowDeregister",
        "ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice", "ncclGetPeerDevicePointer", "ncclCommGetAsyncError"})
    CHECK_MSG(has(load.message, name), "%s missing from: %s", name, load.message);
}

TEST(process_wide_load_follows_MOK_NCCL_LIBRARY) {
  setenv("MOK_NCCL_LIBRARY", "/nonexistent/from-env/libnccl.so.2", 1);
  const nccl::NcclApi* api = nullptr;
  const nccl::NcclLoad& load = nccl::load_nccl(&api);
  CHECK(!load.loaded && api != nullptr);
  CHECK_MSG(has(load.message, "/nonexistent/from-env/libnccl.so.2"), "%s", load.message);
  CHECK(&nccl::load_nccl(nullptr) == &load);  // loaded once per process
}

TEST(pinned_wheel_loads_and_reports_its_version) {
  if (!wheel()) {
    std::printf("  skipped: nvidia-nccl-cu13 is not installed in the Python that configured this build\n");
    return;
  }
  nccl::NcclApi api;
  nccl::NcclLoad load = nccl::load_nccl_from(wheel(), &api);
  CHECK_MSG(load.loaded, "%s", load.message);
  CHECK_MSG(api.version == 23203, "version %d, the pin is 2.32.3", api.version);
  CHECK_MSG(has(load.message, "NCCL 2.32.3 from "), "%s", load.message);
  CHECK(api.ncclMemAlloc && api.ncclCommWindowRegister && api.ncclGetErrorString && api.ncclGetPeerDevicePointer &&
        api.ncclCommGetAsyncError);
  CHECK(std::strcmp(api.ncclGetErrorString(0), "no error") == 0);
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "wheel") == 0 && !wheel()) {
    std::printf(
        "skipped: PyPI nvidia-nccl-cu13==2.32.3 is not installed in the Python that configured this build "
        "(pip install nvidia-nccl-cu13==2.32.3, then reconfigure)\n");
    return 77;
  }
  if (argc > 1 && std::strcmp(argv[1], "wheel") == 0) {
    const char* only[] = {argv[0], "pinned_wheel"};
    return mok_test::run_all(2, const_cast<char**>(only));
  }
  return mok_test::run_all(argc, argv);
}
