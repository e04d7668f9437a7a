// The self-test's probe stage (cuda/selftest.hpp): the first thing a user runs on a GPU.
#include <cuda_runtime_api.h>
#include <time.h>

#include "api/build_config.hpp"
#include "core/platform.hpp"
#include "cuda/driver.hpp"
#if MOK_WITH_GROUPED_GEMM
#include "cuda/grouped_gemm.hpp"
#endif
#include "cuda/mapped_record.hpp"
#include "cuda/nccl.hpp"
#include "cuda/probe.hpp"
#include "cuda/runtime.hpp"
#include "cuda/selftest.hpp"
#include "cuda/wait.hpp"

namespace mok::cuda {

mokStatus_t cuda_failed(Text* text, const char* what, cudaError_t e) {
  text->add("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  cudaGetLastError();
  return e == cudaErrorMemoryAllocation ? mokOutOfMemory : mokCudaError;
}

namespace {

// What the probe allocates; freed unless a wait ran out (cudaFree would wait for the kernel that did not end).
struct ProbeResources {
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  MappedBlock arch;
  MappedRecord record;
  bool keep = false;
  ~ProbeResources() {
    if (keep) return;
    if (done) cudaEventDestroy(done);
    if (stream) cudaStreamDestroy(stream);
    free_mapped(&arch);
    destroy_mapped_record(&record);
  }
};

// The record the probe kernel wrote, as it should read.
bool record_as_written(const core::ErrorRecord& r, int rank) {
  core::Failure f = probe_record_failure(rank);
  return r.claimed == 1 && r.published == 1 && r.outcome == static_cast<int32_t>(f.outcome) && r.rank == rank &&
         r.task_kind == -1 && r.task_index == kProbeRecordTask && r.wait == static_cast<int32_t>(f.wait) &&
         r.peer == f.peer && std::strcmp(r.detail, "probe") == 0;
}

mokStatus_t check_driver(Text* text) {
  DriverApi api;
  DriverLoad load = load_driver_api(&api);
  if (load.error != cudaSuccess) return cuda_failed(text, "cudaGetDriverEntryPointByVersion", load.error);
  if (load.missing_count) {
    text->add("the driver lacks %d entry points libmok's device runtime needs: %s", load.missing_count, load.missing);
    return mokUnsupported;
  }
  return mokSuccess;
}

// The kernels, run: the arch probe into mapped memory, the record probe into the mapped record, which the host
// reads before it synchronises with the stream (the record must reach it at system scope, while work runs).
mokStatus_t run_kernels(const SelftestSetup& setup, const mokDeviceInfo_t& info, Text* text) {
  ProbeResources res;
  cudaError_t e = cudaStreamCreateWithFlags(&res.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&res.done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = alloc_mapped(sizeof(int), &res.arch);
  if (e == cudaSuccess) e = create_mapped_record(&res.record);
  if (e != cudaSuccess) return cuda_failed(text, "allocating the probe's stream and host-mapped memory", e);
  uint64_t deadline = core::now_ns() + static_cast<uint64_t>(setup.timeout_ms) * 1000000ull;
  e = launch_arch_probe(static_cast<int*>(res.arch.device), res.stream);
  if (e == cudaSuccess) e = launch_record_probe(res.record.device, 0, res.stream);
  if (e == cudaSuccess) e = cudaEventRecord(res.done, res.stream);
  if (e != cudaSuccess) return cuda_failed(text, "launching the probe kernels", e);
  // The record is polled while the stream runs: it must reach the host at system scope, without a sync.
  core::ErrorRecord seen{};
  bool published = false;
  while (!(published = read_mapped_record(res.record, &seen)) && cudaEventQuery(res.done) == cudaErrorNotReady &&
         core::now_ns() < deadline) {
    timespec ts{0, 100000};
    nanosleep(&ts, nullptr);
  }
  e = wait_event(res.done, deadline);
  if (e == cudaErrorNotReady) {
    res.keep = true;
    text->add("the probe kernels did not finish within %d ms (options.timeout_ms): the GPU may be busy or hung",
              setup.timeout_ms);
    return mokTimeout;
  }
  if (e != cudaSuccess) return cuda_failed(text, "running the probe kernels", e);
  if (!published && !read_mapped_record(res.record, &seen)) {
    text->add("the error record in host-mapped memory shows no failure though the record probe finished");
    return mokInternalError;
  }
  int arch = *static_cast<volatile int*>(res.arch.host);
  int expected = info.cc_major * 100 + info.cc_minor * 10;
  if (arch != expected) {
    text->add("the probe kernel ran as __CUDA_ARCH__ %d on a device of compute capability %d.%d (expected %d)", arch,
              info.cc_major, info.cc_minor, expected);
    return mokInternalError;
  }
  if (!record_as_written(seen, 0)) {
    text->add(
        "the error record in host-mapped memory does not read as the device wrote it (outcome %d, task %d, "
        "wait %d, peer %d, detail '%.32s')",
        seen.outcome, seen.task_index, seen.wait, seen.peer, seen.detail);
    return mokInternalError;
  }
  text->add(
      "the probe kernel ran as __CUDA_ARCH__ %d; the error record in host-mapped memory read as the device "
      "wrote it, before the host synchronised",
      arch);
  return mokSuccess;
}

}  // namespace

mokStatus_t open_device(const SelftestSetup& setup, mokDeviceInfo_t* info, Text* text) {
  *info = MOK_DEVICE_INFO_INIT;
  QueryFailure f = device_info(setup.device, info);
  if (f.call) {
    text->add("%s: %s (%s)", f.call, f.error_text, f.error_name);
    return f.no_device ? mokNoDevice : mokCudaError;
  }
  if (f.bad_device) {
    text->add("argument 'options.device' (%d) must be in [0, %d): the CUDA devices of this machine", setup.device,
              f.device_count);
    return mokInvalidArgument;
  }
  if (cudaError_t e = probe_attributes(setup.device); e != cudaSuccess) {
    cudaGetLastError();
    text->add("device %d (%s, sm_%d%d) cannot load libmok's device code, built for %s: %s (%s)", setup.device,
              info->name, info->cc_major, info->cc_minor, api::kCudaArchitectures, cudaGetErrorString(e),
              cudaGetErrorName(e));
    return mokUnsupported;
  }
  if (cudaError_t e = cudaSetDevice(setup.device); e != cudaSuccess) return cuda_failed(text, "cudaSetDevice", e);
  return mokSuccess;
}

mokStatus_t open_gemm_device(const SelftestSetup& setup, Text* text, int* cc_major) {
  mokDeviceInfo_t info;
  if (mokStatus_t s = open_device(setup, &info, text); s != mokSuccess) return s;
  if (cc_major) *cc_major = info.cc_major;
#if MOK_WITH_GROUPED_GEMM
  if (gemm_architecture(info.cc_major) != GemmArchitecture::none) return mokSuccess;
#endif
  text->add(
      "this libmok's grouped GEMMs run on compute capability 10.x (B200, GB200, B300, GB300: built for 100a or 103a) "
      "and 9.0 (H100, H200: built for 90a); it was built for %s, and device %d (%s) is sm_%d%d",
      api::kCudaArchitectures, setup.device, info.name, info.cc_major, info.cc_minor);
  return mokUnsupported;
}

mokStatus_t selftest_probe(const SelftestSetup& setup, Text* text) {
  mokDeviceInfo_t info;
  if (mokStatus_t s = open_device(setup, &info, text); s != mokSuccess) return s;
  text->add("device %d of %d: %s (sm_%d%d, %d SMs, %.0f GiB), driver %d.%d, runtime %d.%d; ", info.device,
            info.device_count, info.name, info.cc_major, info.cc_minor, info.multiprocessors,
            static_cast<double>(info.total_memory) / (1u << 30), info.driver_version / 1000,
            info.driver_version % 1000 / 10, info.runtime_version / 1000, info.runtime_version % 1000 / 10);
  if (mokStatus_t s = check_driver(text); s != mokSuccess) return s;
  text->add("every driver entry point found; ");
  if (mokStatus_t s = run_kernels(setup, info, text); s != mokSuccess) return s;
  // NCCL is for the peer-table helper of C++ trainers only: its absence is worth a word, not a failure.
  text->add("; %s", load_nccl(nullptr).message);
  return mokSuccess;
}

}  // namespace mok::cuda
