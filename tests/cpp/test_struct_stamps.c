/* Struct stamps from C (docs/c-api.md, "Struct compatibility"): every stamped struct of mok.h is passed at
 * each size a caller can have: this header's (accepted), an older header's smaller layout where the struct has
 * grown (accepted, the fields it lacks get their defaults), a newer header's larger one (mokInvalidArgument
 * naming the version it came from, nothing written), and no stamp or a size that no header gave (rejected,
 * naming the MOK_*_INIT macro). Built as C so the structs are laid out as a C caller's. Exit status: the number
 * of failed checks. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c_checks.h"
#include "mok/mok.h"

static void expect(mokStatus_t got, mokStatus_t want, const char* needle, const char* call, int line) {
  const char* detail = mokGetLastError();
  if (got != want || (needle != NULL && strstr(detail, needle) == NULL)) {
    printf("line %d: %s: got %s with '%s'; want %s%s%s\n", line, call, mokGetStatusString(got), detail,
           mokGetStatusString(want), needle ? " naming " : "", needle ? needle : "");
    ++failures;
  }
}
#define EXPECT(call, want, needle) expect((call), (want), (needle), #call, __LINE__)

/* The version a newer mok.h would stamp, and how the library names it. */
#define NEWER_VERSION MOK_VERSION_CODE(MOK_VERSION_MAJOR, MOK_VERSION_MINOR + 1, 3)
static char newer_name[64];

/* mokLayerMemory_t as its first layout had it (before peer_bytes): what a caller built against that mok.h
 * passes. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  void* const* peer_bases;
  const char* shm_name;
  void* workspace;
  size_t workspace_bytes;
} memory_v0_t;

/* A struct from a newer mok.h: this header's fields and one more. */
#define NEWER(type) \
  struct {          \
    type now;       \
    int64_t added;  \
  }

static void stamp_newer(void* s, size_t size) {
  size_t* p = (size_t*)s;
  unsigned int* stamp = (unsigned int*)(p + 1);
  p[0] = size;
  stamp[1] = NEWER_VERSION;
}

/* Bytes of `s` from `from` to `to` all still `canary`. */
static int untouched(const void* s, size_t from, size_t to, unsigned char canary) {
  const unsigned char* b = (const unsigned char*)s;
  size_t i;
  for (i = from; i < to; ++i)
    if (b[i] != canary) return 0;
  return 1;
}

static uint32_t rng = 1;
static float uniform(void) { /* in [-1, 1) */
  rng = rng * 1664525u + 1013904223u;
  return (float)(rng >> 8) / (float)(1 << 23) - 1.0f;
}

enum { E = 2, H = 16, I = 8, K = 2, T = 4 };

static void config_sizes(void) {
  mokLayerConfig_t c = small_config();
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  NEWER(mokLayerConfig_t) newer;
  NEWER(mokLayerSizes_t) newer_sizes;
  EXPECT(mokLayerGetSizes(&c, &s), mokSuccess, NULL);
  CHECK(s.peer_bytes > 0 && s.workspace_bytes > 0);

  memset(&newer, 0, sizeof(newer));
  newer.now = c;
  newer.added = 7;
  stamp_newer(&newer, sizeof(newer));
  s.peer_bytes = s.workspace_bytes = 12345;
  EXPECT(mokLayerGetSizes(&newer.now, &s), mokInvalidArgument, newer_name);
  EXPECT(mokLayerGetSizes(&newer.now, &s), mokInvalidArgument, "argument 'config'");
  CHECK(s.peer_bytes == 12345 && s.workspace_bytes == 12345);

  c.magic = 0; /* a struct that no MOK_*_INIT stamped (an unstamped caller's 'world' sits here) */
  EXPECT(mokLayerGetSizes(&c, &s), mokInvalidArgument, "MOK_LAYER_CONFIG_INIT");
  c = small_config();
  c.size -= 4; /* between the second layout (96 bytes) and this one */
  EXPECT(mokLayerGetSizes(&c, &s), mokInvalidArgument, "MOK_LAYER_CONFIG_INIT");
  c = small_config();
  c.size -= 24; /* smaller than the first layout (88 bytes) */
  EXPECT(mokLayerGetSizes(&c, &s), mokInvalidArgument, "MOK_LAYER_CONFIG_INIT");
  CHECK(s.peer_bytes == 12345);

  c = small_config();
  memset(&newer_sizes, 0xab, sizeof(newer_sizes));
  newer_sizes.now.magic = MOK_STRUCT_MAGIC;
  stamp_newer(&newer_sizes, sizeof(newer_sizes));
  EXPECT(mokLayerGetSizes(&c, &newer_sizes.now), mokInvalidArgument, newer_name);
  EXPECT(mokLayerGetSizes(&c, &newer_sizes.now), mokInvalidArgument, "argument 'sizes'");
  CHECK(untouched(&newer_sizes, 16, sizeof(newer_sizes), 0xab));
}

/* mokLayerConfig_t's first layout, before activation and swiglu_alpha: its sizeof has 4 bytes of tail padding
 * where activation now lies. Garbage there (0xab: no activation) is not read: the layer gets swiglu. */
static void config_first_layout(void) {
  mokLayerConfig_t c = small_config(), first;
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT, want = MOK_LAYER_SIZES_INIT;
  size_t end = offsetof(mokLayerConfig_t, activation);
  size_t size = (end + sizeof(size_t) - 1) / sizeof(size_t) * sizeof(size_t);
  CHECK(size == 88 || sizeof(size_t) != 8);
  EXPECT(mokLayerGetSizes(&c, &want), mokSuccess, NULL);
  memset(&first, 0xab, sizeof(first));
  memcpy(&first, &c, end);
  first.size = size;
  EXPECT(mokLayerGetSizes(&first, &s), mokSuccess, NULL);
  CHECK(s.peer_bytes == want.peer_bytes && s.workspace_bytes == want.workspace_bytes);
  /* this layout's own activation field must be in range: the same garbage there is rejected, named */
  memset(&c.activation, 0xab, sizeof(c.activation));
  EXPECT(mokLayerGetSizes(&c, &s), mokInvalidArgument, "config.activation");
}

/* mokLayerConfig_t's second layout, up to swiglu_alpha: its sizeof (96) has 4 bytes of tail padding where
 * backward_comm_workers now lies. Garbage there (0xab: out of range) is not read: the layer gets 0. */
static void config_second_layout(void) {
  mokLayerConfig_t c = small_config(), second;
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT, want = MOK_LAYER_SIZES_INIT;
  size_t end = offsetof(mokLayerConfig_t, backward_comm_workers);
  size_t size = (end + sizeof(size_t) - 1) / sizeof(size_t) * sizeof(size_t);
  CHECK(size == 96 || sizeof(size_t) != 8);
  CHECK(size < sizeof(mokLayerConfig_t));
  EXPECT(mokLayerGetSizes(&c, &want), mokSuccess, NULL);
  memset(&second, 0xab, sizeof(second));
  memcpy(&second, &c, end);
  second.size = size;
  EXPECT(mokLayerGetSizes(&second, &s), mokSuccess, NULL);
  CHECK(s.peer_bytes == want.peer_bytes && s.workspace_bytes == want.workspace_bytes);
  /* this layout's own fields are read: the same garbage there is rejected, named */
  memset(&c.backward_comm_workers, 0xab, sizeof(c.backward_comm_workers));
  EXPECT(mokLayerGetSizes(&c, &s), mokInvalidArgument, "config.backward_comm_workers");
  c = small_config();
  /* routing_scale: 0 is mokRoutingScaleOutput (what a zeroed struct means), and a value past the enum is
     rejected, named (a C caller may store any int there) */
  CHECK(offsetof(mokLayerConfig_t, routing_scale) == offsetof(mokLayerConfig_t, backward_comm_workers) + sizeof(int));
  CHECK(mokRoutingScaleOutput == 0);
  *(int*)&c.routing_scale = 0;
  EXPECT(mokLayerGetSizes(&c, &s), mokSuccess, NULL);
  c.routing_scale = mokRoutingScaleInput;
  EXPECT(mokLayerGetSizes(&c, &s), mokSuccess, NULL);
  *(int*)&c.routing_scale = 2;
  EXPECT(mokLayerGetSizes(&c, &s), mokInvalidArgument, "config.routing_scale");
  *(int*)&c.routing_scale = -1;
  EXPECT(mokLayerGetSizes(&c, &s), mokInvalidArgument, "mokRoutingScaleInput (1)");
}

/* A world-1 layer over heap memory, created through `memory` (any layout); NULL when creation failed. */
static mokLayer_t create(const void* memory, mokStatus_t want, const char* needle, int line) {
  mokLayerConfig_t c = small_config();
  mokLayer_t layer = NULL;
  expect(mokLayerCreate(&c, (const mokLayerMemory_t*)memory, &layer), want, needle, "mokLayerCreate", line);
  return layer;
}

static void memory_layouts(void) {
  mokLayerConfig_t c = small_config();
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  void *peer, *workspace;
  void* bases[1];
  mokLayer_t layer;
  struct {
    memory_v0_t v0;
    size_t after; /* where this header's peer_bytes would be: must not be read */
  } old;
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  NEWER(mokLayerMemory_t) newer;
  CHECK(mokLayerGetSizes(&c, &s) == mokSuccess);
  peer = aligned_fill(s.peer_bytes, 0);
  workspace = aligned_fill(s.workspace_bytes, 0);
  bases[0] = peer;

  CHECK(sizeof(memory_v0_t) < sizeof(mokLayerMemory_t));
  memset(&old, 0, sizeof(old));
  old.v0.size = sizeof(memory_v0_t);
  old.v0.magic = MOK_STRUCT_MAGIC;
  old.v0.version = MOK_VERSION;
  old.v0.peer_bases = bases;
  old.v0.workspace = workspace;
  old.v0.workspace_bytes = s.workspace_bytes;
  old.after = 1; /* read as peer_bytes it would be refused as too small */
  layer = create(&old, mokSuccess, NULL, __LINE__);
  CHECK(layer != NULL);
  mokLayerDestroy(layer);

  m.peer_bases = bases;
  m.workspace = workspace;
  m.workspace_bytes = s.workspace_bytes;
  m.peer_bytes = s.peer_bytes;
  layer = create(&m, mokSuccess, NULL, __LINE__);
  CHECK(layer != NULL);
  mokLayerDestroy(layer);
  m.peer_bytes = s.peer_bytes - 1;
  create(&m, mokInvalidArgument, "'memory.peer_bytes'", __LINE__);
  m.peer_bytes = 0; /* not given: not checked */
  layer = create(&m, mokSuccess, NULL, __LINE__);
  mokLayerDestroy(layer);
  m.peer_bases = NULL;
  m.shm_name = "mok-stamps";
  m.peer_bytes = s.peer_bytes;
  create(&m, mokInvalidArgument, "'memory.peer_bytes'", __LINE__);

  m.peer_bases = bases;
  m.shm_name = NULL;
  memset(&newer, 0, sizeof(newer));
  newer.now = m;
  stamp_newer(&newer, sizeof(newer));
  create(&newer, mokInvalidArgument, newer_name, __LINE__);
  old.v0.size = sizeof(memory_v0_t) + 4; /* between the layouts: no header gave it */
  create(&old, mokInvalidArgument, "MOK_LAYER_MEMORY_INIT", __LINE__);
  free(peer);
  free(workspace);
}

/* Weights, grads and the error record on a live layer. */
static void pass_structs(void) {
  mokLayerConfig_t c = small_config();
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
  mokLayerError_t e = MOK_LAYER_ERROR_INIT;
  NEWER(mokLayerWeights_t) newer_w;
  NEWER(mokLayerGrads_t) newer_g;
  NEWER(mokLayerError_t) newer_e;
  uint16_t *weight[3], *grad[3], x[T * H], out[T * H], dout[T * H], dx[T * H];
  float tw[T * K], dtw[T * K];
  int32_t ids[T * K];
  void* bases[1];
  mokLayer_t layer = NULL;
  int i, j, n = E * I * H;
  CHECK(mokLayerGetSizes(&c, &s) == mokSuccess);
  bases[0] = aligned_fill(s.peer_bytes, 0);
  m.peer_bases = bases;
  m.workspace = aligned_fill(s.workspace_bytes, 0);
  m.workspace_bytes = s.workspace_bytes;
  if (mokLayerCreate(&c, &m, &layer) != mokSuccess) {
    printf("mokLayerCreate: %s\n", mokGetLastError());
    ++failures;
    return;
  }
  for (i = 0; i < 3; ++i) {
    weight[i] = (uint16_t*)aligned_fill(n * sizeof(uint16_t), 0);
    grad[i] = (uint16_t*)aligned_fill(n * sizeof(uint16_t), 0);
    for (j = 0; j < n; ++j) weight[i][j] = bf16(uniform());
  }
  for (i = 0; i < T * H; ++i) x[i] = bf16(uniform()), dout[i] = bf16(uniform());
  for (i = 0; i < T * K; ++i) ids[i] = (int32_t)((rng = rng * 1664525u + 1013904223u) >> 16) % E, tw[i] = uniform();
  w.gate = weight[0], w.up = weight[1], w.down = weight[2];
  g.dx = dx, g.dtopk_weights = dtw, g.dgate = grad[0], g.dup = grad[1], g.ddown = grad[2];
  EXPECT(mokLayerBuildSchedule(layer, ids, mokIndexInt32, T, NULL), mokSuccess, NULL);

  memset(&newer_w, 0, sizeof(newer_w));
  newer_w.now = w;
  stamp_newer(&newer_w, sizeof(newer_w));
  memset(out, 0xcd, sizeof(out));
  EXPECT(mokLayerForward(layer, &newer_w.now, x, tw, out, NULL), mokInvalidArgument, newer_name);
  CHECK(untouched(out, 0, sizeof(out), 0xcd));
  w.size -= 4;
  EXPECT(mokLayerForward(layer, &w, x, tw, out, NULL), mokInvalidArgument, "MOK_LAYER_WEIGHTS_INIT");
  w.size += 4;
  /* The layout before shared_router: its bytes past the struct are not read (here a stray pointer that,
     read, is refused: this layer has no shared expert). */
  w.shared_router = x;
  EXPECT(mokLayerForward(layer, &w, x, tw, out, NULL), mokInvalidArgument, "weights.shared_router");
  w.size -= sizeof(void*);
  EXPECT(mokLayerForward(layer, &w, x, tw, out, NULL), mokSuccess, NULL);
  w.size += sizeof(void*);
  w.shared_router = NULL;
  EXPECT(mokLayerForward(layer, &w, x, tw, out, NULL), mokSuccess, NULL);
  CHECK(!untouched(out, 0, sizeof(out), 0xcd));

  memset(&newer_g, 0, sizeof(newer_g));
  newer_g.now = g;
  stamp_newer(&newer_g, sizeof(newer_g));
  memset(dx, 0xcd, sizeof(dx));
  EXPECT(mokLayerBackward(layer, &w, tw, dout, &newer_g.now, NULL), mokInvalidArgument, newer_name);
  CHECK(untouched(dx, 0, sizeof(dx), 0xcd));
  g.dshared_router = dx;
  EXPECT(mokLayerBackward(layer, &w, tw, dout, &g, NULL), mokInvalidArgument, "grads.dshared_router");
  g.size -= sizeof(void*);
  EXPECT(mokLayerBackward(layer, &w, tw, dout, &g, NULL), mokSuccess, NULL);
  g.size += sizeof(void*);
  g.dshared_router = NULL;
  EXPECT(mokLayerBackward(layer, &w, tw, dout, &g, NULL), mokSuccess, NULL);
  CHECK(!untouched(dx, 0, sizeof(dx), 0xcd));

  /* An older caller's weights and grads (mok.h before the expert biases): the bytes past its layout are
   * another object's (0xab here, which as a pointer is misaligned and refused) and are not read: no biases. */
  {
    struct {
      mokLayerWeights_t w;
      mokLayerGrads_t g;
    } old;
    uint16_t old_out[T * H];
    memset(&old, 0xab, sizeof(old));
    memcpy(&old.w, &w, offsetof(mokLayerWeights_t, gate_bias));
    memcpy(&old.g, &g, offsetof(mokLayerGrads_t, dgate_bias));
    old.w.size = offsetof(mokLayerWeights_t, gate_bias);
    old.g.size = offsetof(mokLayerGrads_t, dgate_bias);
    EXPECT(mokLayerForward(layer, &w, x, tw, out, NULL), mokSuccess, NULL);
    EXPECT(mokLayerForward(layer, &old.w, x, tw, old_out, NULL), mokSuccess, NULL);
    CHECK(memcmp(out, old_out, sizeof(out)) == 0);
    EXPECT(mokLayerBackward(layer, &old.w, tw, dout, &old.g, NULL), mokSuccess, NULL);
  }

  memset(&newer_e, 0xab, sizeof(newer_e));
  newer_e.now.magic = MOK_STRUCT_MAGIC;
  stamp_newer(&newer_e, sizeof(newer_e));
  EXPECT(mokLayerGetError(layer, &newer_e.now), mokInvalidArgument, newer_name);
  CHECK(untouched(&newer_e, 16, sizeof(newer_e), 0xab));
  e.status = mokInternalError;
  EXPECT(mokLayerGetError(layer, &e), mokSuccess, NULL);
  CHECK(e.status == mokSuccess && e.size == sizeof(e) && e.version == MOK_VERSION);
  e.magic = 0;
  EXPECT(mokLayerGetError(layer, &e), mokInvalidArgument, "MOK_LAYER_ERROR_INIT");

  mokLayerDestroy(layer);
  for (i = 0; i < 3; ++i) free(weight[i]), free(grad[i]);
  free(bases[0]);
  free(m.workspace);
}

static void device_info(void) {
  mokDeviceInfo_t info = MOK_DEVICE_INFO_INIT;
  NEWER(mokDeviceInfo_t) newer;
  mokStatus_t s = mokGetDeviceInfo(0, &info);
  CHECK(s == mokSuccess || s == mokNoDevice || s == mokNotCompiled);
  memset(&newer, 0xab, sizeof(newer));
  newer.now.magic = MOK_STRUCT_MAGIC;
  stamp_newer(&newer, sizeof(newer));
  EXPECT(mokGetDeviceInfo(0, &newer.now), mokInvalidArgument, newer_name);
  CHECK(untouched(&newer, 16, sizeof(newer), 0xab));
}

/* The self-test's options and report: a newer header's larger ones are refused, nothing written or run. */
static void selftest_structs(void) {
  mokSelftestReport_t report = MOK_SELFTEST_REPORT_INIT;
  NEWER(mokSelftestOptions_t) newer_o;
  NEWER(mokSelftestReport_t) newer_r;
  memset(&newer_o, 0, sizeof(newer_o));
  newer_o.now = (mokSelftestOptions_t)MOK_SELFTEST_OPTIONS_INIT;
  stamp_newer(&newer_o, sizeof(newer_o));
  EXPECT(mokSelftestRun(mokSelftestProbe, &newer_o.now, &report), mokInvalidArgument, newer_name);
  EXPECT(mokSelftestRun(mokSelftestProbe, &newer_o.now, &report), mokInvalidArgument, "argument 'options'");
  memset(&newer_r, 0xab, sizeof(newer_r));
  newer_r.now.magic = MOK_STRUCT_MAGIC;
  stamp_newer(&newer_r, sizeof(newer_r));
  EXPECT(mokSelftestRun(mokSelftestProbe, NULL, &newer_r.now), mokInvalidArgument, newer_name);
  CHECK(untouched(&newer_r, 16, sizeof(newer_r), 0xab));
}

int main(void) {
  rng = (uint32_t)time(NULL);
  printf("seed %u\n", rng);
  snprintf(newer_name, sizeof(newer_name), "from mok.h %d.%d.3", MOK_VERSION_MAJOR, MOK_VERSION_MINOR + 1);
  config_sizes();
  config_first_layout();
  config_second_layout();
  memory_layouts();
  pass_structs();
  device_info();
  selftest_structs();
  printf("%d failed checks\n", failures);
  return failures;
}
