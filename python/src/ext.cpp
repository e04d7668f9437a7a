// mok._mok: libmok's C ABI as Python functions. Thin by design: every rule lives in libmok.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>

#include "errors.hpp"
#include "mok/mok.h"

namespace nb = nanobind;
using mok::python::check;

void bind_layer(nb::module_& m);  // layer.cpp
#ifdef MOK_WITH_TASK_GRAPH
void bind_task_graph(nb::module_& m);  // task_graph.cpp
#endif

namespace {

nb::dict device_info_dict(const mokDeviceInfo_t& info) {
  nb::dict d;
  d["device_count"] = info.device_count;
  d["device"] = info.device;
  d["name"] = std::string(info.name);
  d["compute_capability"] = nb::make_tuple(info.cc_major, info.cc_minor);
  d["multiprocessors"] = info.multiprocessors;
  d["total_memory"] = info.total_memory;
  d["driver_version"] = info.driver_version;
  d["runtime_version"] = info.runtime_version;
  return d;
}

}  // namespace

NB_MODULE(_mok, m) {
  m.doc() = "libmok's C ABI (see kernel/include/mok/mok.h)";
  m.attr("HEADER_VERSION") = MOK_VERSION;
  m.attr("NUM_STATUS") = static_cast<int>(mokNumStatus);
  m.attr("NUM_EXECUTORS") = static_cast<int>(mokNumExecutors);

  m.def(
      "version",
      [] {
        int v = 0;
        check(mokGetVersion(&v));
        return v;
      },
      "libmok's version as MOK_VERSION_CODE(major, minor, patch)");

  m.def("status_string", [](int status) { return std::string(mokGetStatusString(static_cast<mokStatus_t>(status))); });

  m.def("cuda_architectures", [] { return std::string(mokCudaArchitectures()); });

  m.def("executor_name", [](int executor) {
    const char* name = mokExecutorName(static_cast<mokExecutor_t>(executor));
    if (!name) throw nb::value_error("executor: not a mokExecutor_t value");
    return std::string(name);
  });

  m.def("executor_compiled", [](int executor) {
    int compiled = 0;
    check(mokExecutorCompiled(static_cast<mokExecutor_t>(executor), &compiled));
    return compiled != 0;
  });

  // (status, detail, info): never raises for a missing GPU, so callers can report it.
  m.def("device_info", [](int device) {
    mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
    mokStatus_t s = mokGetDeviceInfo(device, &info);
    return nb::make_tuple(static_cast<int>(s), std::string(mokGetLastError()), device_info_dict(info));
  });

  // (status, detail, supported)
  m.def("executor_supports_device", [](int executor, int device) {
    int supported = 0;
    mokStatus_t s = mokExecutorSupportsDevice(static_cast<mokExecutor_t>(executor), device, &supported);
    return nb::make_tuple(static_cast<int>(s), std::string(mokGetLastError()), supported != 0);
  });

  // The self-test (mok.selftest): one stage, (status, message, seconds); the GIL is released while it runs.
  m.attr("NUM_SELFTEST_STAGES") = static_cast<int>(mokNumSelftestStages);
  m.def("selftest_stage_name", [](int stage) {
    const char* name = mokSelftestStageName(static_cast<mokSelftestStage_t>(stage));
    if (!name) throw nb::value_error("stage: not a mokSelftestStage_t value");
    return std::string(name);
  });
  m.def("selftest_run", [](int stage, int device, int timeout_ms, uint64_t seed) {
    mokSelftestOptions_t options = MOK_SELFTEST_OPTIONS_INIT;
    options.device = device;
    options.timeout_ms = timeout_ms;
    options.seed = seed;
    mokSelftestReport_t report = MOK_SELFTEST_REPORT_INIT;
    mokStatus_t s;
    {
      nb::gil_scoped_release release;
      s = mokSelftestRun(static_cast<mokSelftestStage_t>(stage), &options, &report);
    }
    std::string message = report.message[0] ? report.message : mokGetLastError();
    return nb::make_tuple(static_cast<int>(s), message, report.seconds);
  });

  bind_layer(m);
#ifdef MOK_WITH_TASK_GRAPH
  bind_task_graph(m);
#endif
}
