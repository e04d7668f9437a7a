// A failed libmok call as the Python exception that fits its status.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "mok/mok.h"

namespace mok::python {

// mokInvalidArgument -> ValueError, mokTimeout -> TimeoutError, everything else -> RuntimeError; the message
// carries the status name and libmok's detail (which argument, which rule, which wait).
[[noreturn]] inline void raise_status(mokStatus_t status) {
  std::string message = std::string(mokGetStatusString(status)) + ": " + mokGetLastError();
  if (status == mokInvalidArgument) throw nanobind::value_error(message.c_str());
  if (status == mokTimeout) {
    PyErr_SetString(PyExc_TimeoutError, message.c_str());
    throw nanobind::python_error();
  }
  throw std::runtime_error(message);
}

inline void check(mokStatus_t status) {
  if (status != mokSuccess) raise_status(status);
}

// Run a libmok call without the GIL (passes block until the whole group is done), then check its status.
template <typename Call>
void released(Call&& call) {
  mokStatus_t status;
  {
    nanobind::gil_scoped_release release;
    status = call();
  }
  check(status);
}

}  // namespace mok::python
