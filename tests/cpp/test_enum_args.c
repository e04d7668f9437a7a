/* Enum arguments from C: a C enum object may hold any int, so every mokXxx_t parameter and field is
 * passed values outside its enumerators (the first past the end, small, negative, INT_MAX, INT_MIN).
 * Each call must return mokInvalidArgument with a detail naming the argument, and write nothing.
 * Built as C so the values arrive exactly as a C caller stores them; under
 * -fsanitize=undefined,enum the library must not report an enum load either. Exit status: the
 * number of failed checks. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign (c_checks.h) */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c_checks.h"
#include "mok/mok.h"

static void expect(mokStatus_t got, const char* names, const char* call, int value, int line) {
  const char* detail = mokGetLastError();
  if (got != mokInvalidArgument || strstr(detail, names) == NULL) {
    printf("line %d: %s with %d: got %s with '%s'; want mokInvalidArgument naming %s\n", line, call, value,
           mokGetStatusString(got), detail, names);
    ++failures;
  }
}
#define EXPECT(call, names, value) expect((call), (names), #call, (value), __LINE__)

/* 64-byte aligned view of a zeroed allocation (C99 has no aligned_alloc). */
static void* aligned(void* raw) {
  return (void*)(((uintptr_t)raw + 63) / 64 * 64);
}

/* Out-of-range values of an enum with `count` enumerators 0..count-1. */
static int bad_values(int count, int* v) {
  v[0] = count;
  v[1] = count > 7 ? 99 : 7; /* 7 is a real mokStatus_t */
  v[2] = -5;
  v[3] = INT_MAX;
  v[4] = INT_MIN;
  return 5;
}

static void executor_parameters(void) {
  int v[5], n = bad_values(mokNumExecutors, v), i;
  for (i = 0; i < n; ++i) {
    int compiled = -7, supported = -7;
    CHECK(mokExecutorName((mokExecutor_t)v[i]) == NULL);
    EXPECT(mokExecutorCompiled((mokExecutor_t)v[i], &compiled), "'executor'", v[i]);
    CHECK(compiled == -7);
    EXPECT(mokExecutorSupportsDevice((mokExecutor_t)v[i], -1, &supported), "'executor'", v[i]);
    CHECK(supported == 0); /* documented: *supported = 0 on every failure */
  }
}

static void config_fields(void) {
  int v[5], n = bad_values(mokNumPrecisions, v), i;
  for (i = 0; i < n; ++i) {
    mokLayerConfig_t c = small_config();
    mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
    c.precision = (mokPrecision_t)v[i];
    EXPECT(mokLayerGetSizes(&c, &s), "'config.precision'", v[i]);
    CHECK(s.peer_bytes == 0 && s.workspace_bytes == 0);
  }
  n = bad_values(mokNumExecutors, v);
  for (i = 0; i < n; ++i) {
    mokLayerConfig_t c = small_config();
    mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
    mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
    mokLayer_t layer = NULL;
    c.executor = (mokExecutor_t)v[i];
    EXPECT(mokLayerGetSizes(&c, &s), "'config.executor'", v[i]);
    CHECK(s.peer_bytes == 0 && s.workspace_bytes == 0);
    EXPECT(mokLayerCreate(&c, &m, &layer), "'config.executor'", v[i]);
    CHECK(layer == NULL);
  }
}

static void index_type_parameter(void) {
  mokLayerConfig_t c = small_config();
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  mokLayer_t layer = NULL;
  void *peer_raw, *work_raw, *bases[1];
  int32_t ids[8] = {0, 1, 1, 0, 0, -1, 1, 1};
  int v[5], n = bad_values(2, v), i;
  if (mokLayerGetSizes(&c, &s) != mokSuccess) {
    printf("mokLayerGetSizes: %s\n", mokGetLastError());
    ++failures;
    return;
  }
  peer_raw = calloc(1, s.peer_bytes + 64);
  work_raw = calloc(1, s.workspace_bytes + 64);
  bases[0] = aligned(peer_raw);
  m.peer_bases = bases;
  m.workspace = aligned(work_raw);
  m.workspace_bytes = s.workspace_bytes;
  if (mokLayerCreate(&c, &m, &layer) != mokSuccess) {
    printf("mokLayerCreate: %s\n", mokGetLastError());
    ++failures;
  } else {
    for (i = 0; i < n; ++i)
      EXPECT(mokLayerBuildSchedule(layer, ids, (mokIndexType_t)v[i], 4, NULL), "'index_type'", v[i]);
    CHECK(mokLayerBuildSchedule(layer, ids, mokIndexInt32, 4, NULL) == mokSuccess); /* the context still works */
  }
  mokLayerDestroy(layer);
  free(peer_raw);
  free(work_raw);
}

static void dtype_parameter(void) {
  float src[64];
  uint8_t data[64], scales[2];
  int v[5], n = bad_values(2, v), i, k;
  srand((unsigned)time(NULL));
  for (k = 0; k < 64; ++k) src[k] = (float)(rand() % 2001 - 1000) / 100.0f;
  memset(data, 0x5a, sizeof data);
  for (i = 0; i < n; ++i)
    EXPECT(mokMxfp8Quantize(src, (mokDataType_t)v[i], 1, 2, 32, data, scales, NULL, NULL, NULL), "'dtype'", v[i]);
  for (k = 0; k < 64; ++k) CHECK(data[k] == 0x5a); /* nothing written */
}

static void status_parameter(void) {
  int v[5], n = bad_values(mokNumStatus, v), i;
  for (i = 0; i < n; ++i) CHECK(strcmp(mokGetStatusString((mokStatus_t)v[i]), "unknown mokStatus_t value") == 0);
  CHECK(strstr(mokGetStatusString(mokTimeout), "mokTimeout") != NULL);
}

int main(void) {
  executor_parameters();
  config_fields();
  index_type_parameter();
  dtype_parameter();
  status_parameter();
  printf("%d failed checks\n", failures);
  return failures;
}
