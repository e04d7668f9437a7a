// The thread-local detail behind mokGetLastError(), and the one way API code reports a failure.
#pragma once

#include <cstdarg>

#include "mok/mok.h"

namespace mok::api {

// Record `fmt` as this thread's detail message and return `status`.
mokStatus_t fail(mokStatus_t status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Clear the detail at the start of every API call, so a stale message never describes a success.
void clear_error();

// This thread's detail message; "" when the last call succeeded.
const char* last_error_message();

// The usual first line of an API call that takes an output pointer.
#define MOK_REQUIRE_OUT(ptr)                                                                             \
  do {                                                                                                   \
    if ((ptr) == nullptr)                                                                                \
      return ::mok::api::fail(mokInvalidArgument, "%s: argument '%s' must not be NULL", __func__, #ptr); \
  } while (0)

}  // namespace mok::api
