// Status strings and the thread-local error detail.
#include <cstdio>

#include "api/c_enum.hpp"
#include "api/error.hpp"

namespace mok::api {
namespace {
thread_local char last_error[1024] = "";
}

mokStatus_t fail(mokStatus_t status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(last_error, sizeof(last_error), fmt, args);
  va_end(args);
  return status;
}

void clear_error() {
  last_error[0] = '\0';
}

const char* last_error_message() {
  return last_error;
}

}  // namespace mok::api

extern "C" {

MOK_API const char* mokGetStatusString(mokStatus_t status) {
  int32_t bits = mok::api::enum_bits(status);  // any int from a C caller; no enum-typed load before the check
  if (!mok::api::enum_in_range(bits, mokNumStatus)) return "unknown mokStatus_t value";
  switch (static_cast<mokStatus_t>(bits)) {
    case mokSuccess: return "mokSuccess: no error";
    case mokInvalidArgument: return "mokInvalidArgument: an argument breaks a documented rule";
    case mokInvalidUsage: return "mokInvalidUsage: call made in the wrong order or state";
    case mokNotCompiled: return "mokNotCompiled: this executor is not built into libmok";
    case mokNoDevice: return "mokNoDevice: no usable GPU or driver";
    case mokUnsupported: return "mokUnsupported: device or configuration not supported";
    case mokCudaError: return "mokCudaError: a CUDA runtime call failed";
    case mokSystemError: return "mokSystemError: an operating-system call failed";
    case mokOutOfMemory: return "mokOutOfMemory: an allocation failed";
    case mokTimeout: return "mokTimeout: a bounded wait ran out";
    case mokPeerAbort: return "mokPeerAbort: another rank or worker aborted";
    case mokInternalError: return "mokInternalError: internal error";
    case mokNcclError: return "mokNcclError: an NCCL call failed";
    case mokNumStatus: break;
  }
  return "unknown mokStatus_t value";
}

MOK_API const char* mokGetLastError(void) {
  return mok::api::last_error_message();
}

}  // extern "C"
