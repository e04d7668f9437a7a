// Header-only C++ wrapper over mok.h: exceptions instead of status codes, RAII for handles.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "mok/mok.h"

namespace mok {

// A failed libmok call: the status, its name and libmok's detail message.
class Error : public std::runtime_error {
 public:
  Error(mokStatus_t status, const std::string& detail)
      : std::runtime_error(std::string(mokGetStatusString(status)) + (detail.empty() ? "" : ": " + detail)),
        status_(status) {}
  mokStatus_t status() const noexcept { return status_; }

 private:
  mokStatus_t status_;
};

// Throw mok::Error unless `status` is mokSuccess.
inline void check(mokStatus_t status) {
  if (status != mokSuccess) throw Error(status, mokGetLastError());
}

struct Version {
  int major, minor, patch;
};

// The loaded library's version (may differ from the header's MOK_VERSION_* if the .so was swapped).
inline Version version() {
  int v = 0;
  check(mokGetVersion(&v));
  return {v / 10000, v / 100 % 100, v % 100};
}

struct ExecutorStatus {
  mokExecutor_t executor;
  std::string name;
  bool compiled;
  bool supported;      // can run here: on the CPU for the host executor, on CUDA device 0 for GPU ones
  std::string reason;  // why not, when !supported
};

// Every executor with whether it is compiled in and whether it can run on this machine. Never throws for a
// missing GPU: that is a reason.
inline std::vector<ExecutorStatus> executors() {
  std::vector<ExecutorStatus> out;
  for (int e = 0; e < mokNumExecutors; ++e) {
    auto executor = static_cast<mokExecutor_t>(e);
    int compiled = 0, supported = 0;
    check(mokExecutorCompiled(executor, &compiled));
    mokStatus_t s = mokExecutorSupportsDevice(executor, executor == mokExecutorHost ? -1 : 0, &supported);
    std::string reason = s == mokSuccess ? "" : std::string(mokGetStatusString(s)) + ": " + mokGetLastError();
    out.push_back({executor, mokExecutorName(executor), compiled != 0, supported != 0, reason});
  }
  return out;
}

// CUDA device `device`; throws mok::Error(mokNoDevice) when there is none.
inline mokDeviceInfo_t device_info(int device = 0) {
  mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
  check(mokGetDeviceInfo(device, &info));
  return info;
}

}  // namespace mok
