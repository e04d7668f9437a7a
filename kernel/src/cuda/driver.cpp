// Driver entry points through the runtime (cuda/driver.hpp).
#include "cuda/driver.hpp"

#include <cstdio>
#include <cstring>

namespace mok::cuda {
namespace {

// Appends "name (why)" to the report's list.
void note_missing(DriverLoad* load, const char* name, const char* why) {
  size_t used = std::strlen(load->missing);
  std::snprintf(load->missing + used, sizeof(load->missing) - used, "%s%s (%s)", used ? ", " : "", name, why);
  ++load->missing_count;
}

// One entry point; false when the runtime call itself failed (load->error set, nothing usable loaded).
bool load_one(const char* name, unsigned version, void** slot, DriverLoad* load) {
  // Set by the runtime only when it reached the driver: a value outside the enum means it did not.
  auto found = static_cast<cudaDriverEntryPointQueryResult>(-1);
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, slot, version, cudaEnableDefault, &found);
  cudaGetLastError();  // leave no error behind for the caller's next runtime call
  if (err == cudaSuccess && found == cudaDriverEntryPointSuccess && *slot) return true;
  *slot = nullptr;
  if (found == cudaDriverEntryPointVersionNotSufficent) {
    char why[64];
    std::snprintf(why, sizeof(why), "driver older than CUDA %u.%u", version / 1000, version % 1000 / 10);
    note_missing(load, name, why);
    return true;
  }
  if (found == cudaDriverEntryPointSymbolNotFound || (err == cudaSuccess && found == cudaDriverEntryPointSuccess)) {
    note_missing(load, name, "not in this driver");
    return true;
  }
  load->error = err != cudaSuccess ? err : cudaErrorSymbolNotFound;
  return false;
}

}  // namespace

DriverLoad load_driver_api(DriverApi* api) {
  DriverLoad load;
  DriverApi found;
#define MOK_DRIVER_LOAD(name, version) \
  if (!load_one(#name, version, reinterpret_cast<void**>(&found.name), &load)) return load;
  MOK_DRIVER_ENTRY_POINTS(MOK_DRIVER_LOAD)
#undef MOK_DRIVER_LOAD
  *api = found;
  return load;
}

}  // namespace mok::cuda
