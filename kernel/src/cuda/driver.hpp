// The CUDA driver's entry points that libmok's device runtime calls (TMA descriptors, peer and multicast memory),
// reached through the runtime's cudaGetDriverEntryPointByVersion: libmok never links libcuda, so it loads on a
// machine without a driver and says so through a status. Each entry is asked for at the CUDA version whose
// signature its PFN_*_v<version> typedef (cudaTypedefs.h) has.
#pragma once

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

namespace mok::cuda {

// name, the CUDA version of its signature
#define MOK_DRIVER_ENTRY_POINTS(X)         \
  X(cuGetErrorName, 6000)                  \
  X(cuPointerGetAttribute, 4000)           \
  X(cuTensorMapEncodeTiled, 12000)         \
  X(cuMemCreate, 10020)                    \
  X(cuMemRelease, 10020)                   \
  X(cuMemMap, 10020)                       \
  X(cuMemUnmap, 10020)                     \
  X(cuMemSetAccess, 10020)                 \
  X(cuMemAddressReserve, 10020)            \
  X(cuMemAddressFree, 10020)               \
  X(cuMemGetAllocationGranularity, 10020)  \
  X(cuMemExportToShareableHandle, 10020)   \
  X(cuMemImportFromShareableHandle, 10020) \
  X(cuMulticastCreate, 12010)              \
  X(cuMulticastAddDevice, 12010)           \
  X(cuMulticastBindMem, 12010)             \
  X(cuMulticastUnbind, 12010)              \
  X(cuMulticastGetGranularity, 12010)

struct DriverApi {
#define MOK_DRIVER_FIELD(name, version) PFN_##name##_v##version name = nullptr;
  MOK_DRIVER_ENTRY_POINTS(MOK_DRIVER_FIELD)
#undef MOK_DRIVER_FIELD
};

// What loading found. `error`: a runtime failure that is no missing symbol (cudaErrorInsufficientDriver without a
// driver): nothing was loaded. Otherwise `missing` names every entry point the driver lacks, each with why
// ("cuMulticastCreate (driver older than CUDA 12.1)"), comma-separated; "" when all were found.
struct DriverLoad {
  cudaError_t error = cudaSuccess;
  int missing_count = 0;
  char missing[768] = "";
};

DriverLoad load_driver_api(DriverApi* api);

}  // namespace mok::cuda
