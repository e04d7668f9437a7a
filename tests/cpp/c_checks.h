/* What the C tests share: the failure count their exit status reports, CHECK / CHECK_MSG, and small_config.h. C99, so
 * each test sees mok.h as a C caller does. */
#ifndef MOK_TESTS_C_CHECKS_H
#define MOK_TESTS_C_CHECKS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mok/mok.h"
#include "small_config.h"

static int failures = 0;

#define CHECK_MSG(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) {                                            \
      printf("line %d: CHECK failed: %s: ", __LINE__, #cond); \
      printf(__VA_ARGS__);                                    \
      printf("\n");                                           \
      ++failures;                                             \
    }                                                         \
  } while (0)
#define CHECK(cond) CHECK_MSG(cond, "%s", "")

/* f's high half: a bf16 value (truncated; the tests need bf16 values, not a rounding rule). */
static inline uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return (uint16_t)(u >> 16);
}

/* bytes (at least 64) 64-byte aligned, each one `fill`; NULL when out of memory. */
static inline void* aligned_fill(size_t bytes, int fill) {
  void* p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
  memset(p, fill, bytes ? bytes : 64);
  return p;
}

#endif
