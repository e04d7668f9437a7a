// Why a host executor call failed, in words for the caller. The call fills it; api/ (api/host_executor.cpp)
// turns it into the returned status's detail (mokGetLastError). The executor keeps none of the C ABI's
// thread-local state.
#pragma once

#include <cstdarg>
#include <cstdio>

#include "mok/mok.h"

namespace mok::host {

struct Detail {
  char text[1024] = "";
};

// Write `fmt` into `detail` and return `status`.
__attribute__((format(printf, 3, 4))) inline mokStatus_t fail(Detail& detail, mokStatus_t status, const char* fmt,
                                                              ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(detail.text, sizeof(detail.text), fmt, args);
  va_end(args);
  return status;
}

}  // namespace mok::host
