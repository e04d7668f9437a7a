/* Capability queries from C: for every executor, mokExecutorCompiled and mokExecutorSupportsDevice say exactly
 * what mokLayerGetSizes and mokLayerCreate then do. An executor that reports itself compiled and supported on a
 * device creates a layer there; one that does not fails creation with the status the query gave. Exit status:
 * the number of failed checks. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_checks.h"
#include "mok/mok.h"

static mokLayerConfig_t config_for(mokExecutor_t executor) {
  mokLayerConfig_t c = small_config();
  c.executor = executor;
  return c;
}

/* mokLayerCreate with `executor` over heap memory sized by its own sizes, or where it has none (an executor that
 * is not compiled) by the host executor's; the detail of a failure goes to `detail`. */
static mokStatus_t create(mokExecutor_t executor, char* detail, size_t n) {
  mokLayerConfig_t host = small_config(), c = config_for(executor);
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  mokLayer_t layer = NULL;
  void *peer = NULL, *workspace = NULL;
  mokStatus_t status;
  if (mokLayerGetSizes(&c, &s) != mokSuccess && mokLayerGetSizes(&host, &s) != mokSuccess) return mokInternalError;
  if (posix_memalign(&peer, 256, s.peer_bytes) != 0 || posix_memalign(&workspace, 256, s.workspace_bytes) != 0)
    return mokInternalError;
  m.peer_bases = &peer;
  m.workspace = workspace;
  m.workspace_bytes = s.workspace_bytes;
  status = mokLayerCreate(&c, &m, &layer);
  snprintf(detail, n, "%s", mokGetLastError());
  if (status == mokSuccess) {
    CHECK_MSG(layer != NULL, "a created layer");
    mokLayerDestroy(layer);
  }
  free(peer);
  free(workspace);
  return status;
}

/* Every query of `executor` against what creating a layer with it does. */
static void executor_agrees(mokExecutor_t executor) {
  const char* name = mokExecutorName(executor);
  const int devices[] = {-1, 0, 1};
  int compiled = -7, supported_anywhere = 0, i;
  mokStatus_t not_supported = mokNotCompiled;
  char detail[1024];
  mokLayerConfig_t c = config_for(executor);
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  mokStatus_t sizes, created;
  CHECK_MSG(name != NULL, "executor %d has a name", (int)executor);
  CHECK_MSG(mokExecutorCompiled(executor, &compiled) == mokSuccess && (compiled == 0 || compiled == 1),
            "mokExecutorCompiled(%s): %d, '%s'", name, compiled, mokGetLastError());
  for (i = 0; i < 3; ++i) {
    int supported = -7;
    mokStatus_t st = mokExecutorSupportsDevice(executor, devices[i], &supported);
    CHECK_MSG(supported == (st == mokSuccess), "mokExecutorSupportsDevice(%s, %d): %s, supported %d", name, devices[i],
              mokGetStatusString(st), supported);
    CHECK_MSG(st == mokSuccess || strstr(mokGetLastError(), "mokExecutorSupportsDevice") != NULL,
              "the detail names the call: '%s'", mokGetLastError());
    if (!compiled)
      CHECK_MSG(st == mokNotCompiled && strstr(mokGetLastError(), name) != NULL,
                "a not compiled executor is supported nowhere: %s on device %d says %s, '%s'", name, devices[i],
                mokGetStatusString(st), mokGetLastError());
    if (supported) supported_anywhere = 1;
    if (st != mokSuccess && devices[i] == (executor == mokExecutorHost ? -1 : 0)) not_supported = st;
  }
  sizes = mokLayerGetSizes(&c, &s);
  created = create(executor, detail, sizeof(detail));
  printf("%-8s compiled %d, supported somewhere %d; mokLayerGetSizes %s; mokLayerCreate %s%s%s\n", name, compiled,
         supported_anywhere, mokGetStatusString(sizes), mokGetStatusString(created), detail[0] ? ": " : "", detail);
  if (compiled && supported_anywhere && executor == mokExecutorHost) {
    CHECK_MSG(sizes == mokSuccess && created == mokSuccess, "%s claims it runs, but: sizes %s, create %s ('%s')", name,
              mokGetStatusString(sizes), mokGetStatusString(created), detail);
  } else if (compiled && supported_anywhere) {
    /* A device executor on a GPU: the heap memory create() gives it is refused, by name (test_cuda_layer creates
     * one on device memory). */
    CHECK_MSG(sizes == mokSuccess && created == mokInvalidArgument && strstr(detail, "'memory.workspace' (") != NULL &&
                  strstr(detail, "device memory") != NULL,
              "%s on a GPU must refuse host memory: sizes %s, create %s ('%s')", name, mokGetStatusString(sizes),
              mokGetStatusString(created), detail);
  } else if (compiled) {
    /* Compiled, but no device here runs it: sized (sizes need no device), and refused at creation as the query. */
    CHECK_MSG(sizes == mokSuccess && created == not_supported,
              "%s: the queries say %s, mokLayerGetSizes %s, mokLayerCreate %s ('%s')", name,
              mokGetStatusString(not_supported), mokGetStatusString(sizes), mokGetStatusString(created), detail);
    CHECK_MSG(strstr(detail, name) != NULL && strstr(detail, "mokLayerCreate: argument 'config.executor'") != NULL,
              "the refusal names the call, the argument and the executor: '%s'", detail);
  } else {
    CHECK_MSG(created == not_supported && sizes == created,
              "%s: the queries say %s, mokLayerGetSizes %s, mokLayerCreate %s ('%s')", name,
              mokGetStatusString(not_supported), mokGetStatusString(sizes), mokGetStatusString(created), detail);
    CHECK_MSG(strstr(detail, name) != NULL && strstr(detail, "mokLayerCreate: argument 'config.executor'") != NULL,
              "the refusal names the call, the argument and the executor: '%s'", detail);
  }
}

int main(void) {
  int e, compiled = 0, supported = 0;
  for (e = 0; e < mokNumExecutors; ++e) executor_agrees((mokExecutor_t)e);
  /* The host executor runs here, on the CPU only. */
  CHECK_MSG(mokExecutorCompiled(mokExecutorHost, &compiled) == mokSuccess && compiled == 1, "host compiled");
  CHECK_MSG(mokExecutorSupportsDevice(mokExecutorHost, -1, &supported) == mokSuccess && supported == 1, "host on -1");
  CHECK_MSG(mokExecutorSupportsDevice(mokExecutorHost, 0, &supported) == mokUnsupported && supported == 0,
            "host on device 0");
  /* Device queries: a failure names the C call first (the CUDA call that failed, if any, comes after it). */
  {
    mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
    int devices[] = {0, -5}, i;
    for (i = 0; i < 2; ++i) {
      mokStatus_t st = mokGetDeviceInfo(devices[i], &info);
      printf("mokGetDeviceInfo(%d): %s %s\n", devices[i], mokGetStatusString(st), mokGetLastError());
      CHECK_MSG(st == mokSuccess || strncmp(mokGetLastError(), "mokGetDeviceInfo: ", 18) == 0, "'%s'",
                mokGetLastError());
      CHECK_MSG(st != mokSuccess || info.device == devices[i], "device %d", info.device);
    }
  }
  printf("%d failed checks\n", failures);
  return failures;
}
