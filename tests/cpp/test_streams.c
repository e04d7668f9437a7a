/* Streams, the error record's pass counter and mokLayerAbort's reason, from C (docs/c-api.md, "Streams,
 * completion and errors"): the host executor refuses a non-NULL stream on each of the six calls that take one
 * (mokInvalidArgument naming 'stream', nothing written, the group aborted as for any rejected argument); the
 * record's `pass` counts every collective call and names the failing one; an abort's reason and rank reach the
 * peer (two ranks as threads); a caller built against the 0.1 mok.h, whose mokLayerError_t ends at `detail`,
 * still reads its record. Exit status: the number of failed checks. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign, pthread_barrier_t */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_checks.h"
#include "mok/mok.h"

enum { W = 2, E = 2, H = 16, I = 8, K = 2, T = 4, EIH = E * I * H };
#define SENTINEL 0xcd

/* mokLayerError_t as the 0.1 mok.h laid it out (up to detail): what an older caller passes. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  mokStatus_t status;
  int rank;
  char task[32];
  int task_index;
  char wait[48];
  char detail[256];
} error_v1_t;

static uint32_t seed = 12345;
static uint32_t next_random(void) {
  seed = seed * 1664525u + 1013904223u;
  return seed >> 8;
}
static float uniform(float a) { /* in [-a, a) */
  return a * ((float)next_random() / (float)(1 << 23) - 1.0f);
}
/* Every byte of p[0, n) still SENTINEL. */
static int untouched(const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  size_t i;
  for (i = 0; i < n; ++i)
    if (b[i] != SENTINEL) return 0;
  return 1;
}
static int contains(const char* text, const char* needle) {
  return strstr(text, needle) != NULL;
}

/* Any non-NULL stream: the host executor must refuse it without ever touching it. */
static int not_a_stream;
#define STREAM ((void*)&not_a_stream)

/* One rank's context, its inputs (random, drawn fresh) and its outputs (pre-filled with SENTINEL). */
typedef struct {
  int rank, world;
  mokLayer_t layer;
  mokLayerWeights_t weights;
  mokLayerGrads_t grads;
  int32_t ids[T * K];
  float topk_weights[T * K];
  uint16_t *x, *dout, *out, *slots, *gate, *up, *down, *dgate, *dup, *ddown, *dx;
  float* dtopk_weights;
  void* workspace;
} rank_t;

static void* peer_bases[W];
static pthread_barrier_t meet;

static mokLayerConfig_t config_of(int world, int rank) {
  mokLayerConfig_t c = small_config();
  c.world = world;
  c.rank = rank;
  c.experts_per_rank = E, c.hidden = H, c.intermediate = I, c.top_k = K, c.max_tokens = T;
  c.comm_workers = 1, c.compute_workers = 1;
  c.timeout_ms = 20000;
  return c;
}

static uint16_t* bf16_array(size_t n, float a) {
  uint16_t* p = (uint16_t*)aligned_fill(n * 2, SENTINEL);
  size_t i;
  for (i = 0; i < n; ++i) p[i] = bf16(uniform(a));
  return p;
}

static void fill_outputs(rank_t* r) {
  memset(r->out, SENTINEL, T * H * 2);
  memset(r->slots, SENTINEL, T * K * H * 2);
  memset(r->dx, SENTINEL, T * H * 2);
  memset(r->dtopk_weights, SENTINEL, T * K * 4);
  memset(r->dgate, SENTINEL, EIH * 2), memset(r->dup, SENTINEL, EIH * 2), memset(r->ddown, SENTINEL, EIH * 2);
}

static int outputs_untouched(const rank_t* r) {
  return untouched(r->out, T * H * 2) && untouched(r->slots, T * K * H * 2) && untouched(r->dx, T * H * 2) &&
         untouched(r->dtopk_weights, T * K * 4) && untouched(r->dgate, EIH * 2) && untouched(r->dup, EIH * 2) &&
         untouched(r->ddown, EIH * 2);
}

/* Every rank's peer buffer of a `world`-rank group, as mokLayerGetSizes asks. */
static void make_peers(int world) {
  mokLayerConfig_t c = config_of(world, 0);
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  int q;
  CHECK(mokLayerGetSizes(&c, &s) == mokSuccess);
  for (q = 0; q < world; ++q) peer_bases[q] = aligned_fill(s.peer_bytes, SENTINEL);
}

/* Rank `rank` of a `world`-rank group over peer_bases (heap), with its inputs drawn. */
static int make_rank(rank_t* r, int world, int rank) {
  mokLayerConfig_t c = config_of(world, rank);
  mokLayerSizes_t s = MOK_LAYER_SIZES_INIT;
  mokLayerMemory_t m = MOK_LAYER_MEMORY_INIT;
  mokLayerWeights_t w = MOK_LAYER_WEIGHTS_INIT;
  mokLayerGrads_t g = MOK_LAYER_GRADS_INIT;
  int i;
  memset(r, 0, sizeof(*r));
  r->rank = rank, r->world = world;
  if (mokLayerGetSizes(&c, &s) != mokSuccess) return 0;
  m.peer_bases = peer_bases;
  m.peer_bytes = s.peer_bytes;
  m.workspace = r->workspace = aligned_fill(s.workspace_bytes, SENTINEL);
  m.workspace_bytes = s.workspace_bytes;
  if (mokLayerCreate(&c, &m, &r->layer) != mokSuccess) {
    printf("rank %d: mokLayerCreate: %s\n", rank, mokGetLastError());
    ++failures;
    free(r->workspace);
    return 0;
  }
  for (i = 0; i < T * K; ++i)
    r->ids[i] = (int32_t)(next_random() % (uint32_t)(world * E)), r->topk_weights[i] = 0.05f + uniform(0.5f) + 0.5f;
  r->x = bf16_array(T * H, 1.0f), r->dout = bf16_array(T * H, 1.0f);
  r->gate = bf16_array(EIH, 0.25f), r->up = bf16_array(EIH, 0.25f), r->down = bf16_array(EIH, 0.35f);
  r->out = (uint16_t*)aligned_fill(T * H * 2, SENTINEL), r->slots = (uint16_t*)aligned_fill(T * K * H * 2, SENTINEL);
  r->dx = (uint16_t*)aligned_fill(T * H * 2, SENTINEL), r->dtopk_weights = (float*)aligned_fill(T * K * 4, SENTINEL);
  r->dgate = (uint16_t*)aligned_fill(EIH * 2, SENTINEL), r->dup = (uint16_t*)aligned_fill(EIH * 2, SENTINEL),
  r->ddown = (uint16_t*)aligned_fill(EIH * 2, SENTINEL);
  w.gate = r->gate, w.up = r->up, w.down = r->down;
  g.dx = r->dx, g.dtopk_weights = r->dtopk_weights, g.dgate = r->dgate, g.dup = r->dup, g.ddown = r->ddown;
  r->weights = w, r->grads = g;
  return 1;
}

static void free_rank(rank_t* r) {
  mokLayerDestroy(r->layer);
  free(r->x), free(r->dout), free(r->out), free(r->slots), free(r->gate), free(r->up), free(r->down);
  free(r->dx), free(r->dtopk_weights), free(r->dgate), free(r->dup), free(r->ddown);
  free(r->workspace);
}

static mokLayerError_t record_of(const rank_t* r) {
  mokLayerError_t e = MOK_LAYER_ERROR_INIT;
  if (mokLayerGetError(r->layer, &e) != mokSuccess) {
    printf("line %d: mokLayerGetError: %s\n", __LINE__, mokGetLastError());
    ++failures;
  }
  return e;
}

/* A refused stream: mokInvalidArgument, the detail naming the call, 'stream' and the rule. */
static void expect_refused(mokStatus_t s, const char* func, int line) {
  const char* d = mokGetLastError();
  if (s != mokInvalidArgument || !contains(d, func) || !contains(d, "'stream'") || !contains(d, "must be NULL")) {
    printf("line %d: %s with a stream: got %s, '%s'; want mokInvalidArgument naming 'stream' and the rule\n", line,
           func, mokGetStatusString(s), d);
    ++failures;
  }
}
#define REFUSED(call, func) expect_refused((call), (func), __LINE__)
#define OK(call) CHECK_MSG((call) == mokSuccess, "%s", mokGetLastError())

/* Is the last byte of `s` the end of a whole UTF-8 character (no sequence cut short)? */
static int whole_utf8(const char* s) {
  size_t n = strlen(s), i = n, cont = 0;
  while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) --i, ++cont;
  if (i == 0) return cont == 0;
  {
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead < 0x80 ? 0 : lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : 1;
    return need == cont;
  }
}

/* ---- one rank: each call refuses a stream, writes nothing, and the record counts every call ---------------- */

static void one_rank(void) {
  rank_t r;
  mokLayerError_t e;
  uint8_t *rd, *rs, *cd, *cs;
  float src[2 * 64];
  int i;
  make_peers(1);
  if (!make_rank(&r, 1, 0)) return;
  e = record_of(&r);
  CHECK_MSG(e.status == mokSuccess && e.pass == 0 && e.abort_rank == -1, "fresh record: pass %llu abort_rank %d",
            (unsigned long long)e.pass, e.abort_rank);

  REFUSED(mokLayerBuildSchedule(r.layer, r.ids, mokIndexInt32, T, STREAM), "mokLayerBuildSchedule"); /* pass 1 */
  CHECK(mokLayerForward(r.layer, &r.weights, r.x, r.topk_weights, r.out, NULL) == mokInvalidUsage);  /* pass 2 */
  OK(mokLayerBuildSchedule(r.layer, r.ids, mokIndexInt32, T, NULL));                                 /* pass 3 */
  fill_outputs(&r);
  REFUSED(mokLayerForward(r.layer, &r.weights, r.x, r.topk_weights, r.out, STREAM), "mokLayerForward"); /* pass 4 */
  CHECK_MSG(outputs_untouched(&r), "a refused mokLayerForward wrote");
  OK(mokLayerForward(r.layer, &r.weights, r.x, r.topk_weights, r.out, NULL)); /* pass 5 */
  CHECK_MSG(!untouched(r.out, T * H * 2), "mokLayerForward wrote no output");
  fill_outputs(&r);
  REFUSED(mokLayerGetSlots(r.layer, r.slots, STREAM), "mokLayerGetSlots"); /* not collective: no pass */
  CHECK_MSG(outputs_untouched(&r), "a refused mokLayerGetSlots wrote");
  REFUSED(mokLayerRecompute(r.layer, &r.weights, r.x, STREAM), "mokLayerRecompute"); /* pass 6 */
  REFUSED(mokLayerBackward(r.layer, &r.weights, r.topk_weights, r.dout, &r.grads, STREAM), "mokLayerBackward");
  CHECK_MSG(outputs_untouched(&r), "a refused mokLayerRecompute or mokLayerBackward wrote"); /* pass 7 */
  e = record_of(&r);
  CHECK_MSG(e.status == mokSuccess && e.pass == 7, "after 7 collective calls: status %d pass %llu", e.status,
            (unsigned long long)e.pass);
  OK(mokLayerGetSlots(r.layer, r.slots, NULL));
  CHECK_MSG(!untouched(r.slots, T * K * H * 2), "mokLayerGetSlots wrote no slots");
  OK(mokLayerRecompute(r.layer, &r.weights, r.x, NULL));                             /* pass 8 */
  OK(mokLayerBackward(r.layer, &r.weights, r.topk_weights, r.dout, &r.grads, NULL)); /* pass 9 */
  CHECK_MSG(!untouched(r.dx, T * H * 2) && !untouched(r.dgate, EIH * 2), "mokLayerBackward wrote no gradient");
  e = record_of(&r);
  CHECK_MSG(e.status == mokSuccess && e.pass == 9 && e.abort_rank == -1, "after 9 calls: pass %llu abort_rank %d",
            (unsigned long long)e.pass, e.abort_rank);

  /* A group of one aborted after pass 9: the record is about pass 9, this rank, its reason; later calls fail
     with mokPeerAbort and leave it as it is. */
  OK(mokLayerAbort(r.layer, "stopped by the test"));
  e = record_of(&r);
  CHECK_MSG(e.status == mokPeerAbort && e.pass == 9 && e.abort_rank == 0 &&
                strcmp(e.detail, "rank 0 aborted the group: stopped by the test") == 0,
            "own abort: status %d pass %llu abort_rank %d detail '%s'", e.status, (unsigned long long)e.pass,
            e.abort_rank, e.detail);
  CHECK(mokLayerBuildSchedule(r.layer, r.ids, mokIndexInt32, T, NULL) == mokPeerAbort); /* pass 10 */
  e = record_of(&r);
  CHECK_MSG(e.pass == 9, "the record moved on to pass %llu", (unsigned long long)e.pass);
  free_rank(&r);
  free(peer_bases[0]);

  /* mokMxfp8Quantize runs on the host: a stream is refused before anything is written. */
  for (i = 0; i < 2 * 64; ++i) src[i] = uniform(4.0f);
  rd = (uint8_t*)aligned_fill(2 * 64, SENTINEL), cd = (uint8_t*)aligned_fill(2 * 64, SENTINEL),
  rs = (uint8_t*)aligned_fill(512, SENTINEL), cs = (uint8_t*)aligned_fill(1024, SENTINEL);
  REFUSED(mokMxfp8Quantize(src, mokDataFloat32, 1, 2, 64, rd, rs, cd, cs, STREAM), "mokMxfp8Quantize");
  CHECK_MSG(untouched(rd, 128) && untouched(rs, 512) && untouched(cd, 128) && untouched(cs, 1024),
            "a refused mokMxfp8Quantize wrote");
  OK(mokMxfp8Quantize(src, mokDataFloat32, 1, 2, 64, rd, rs, cd, cs, NULL));
  CHECK_MSG(!untouched(rd, 128) && !untouched(cs, 1024), "mokMxfp8Quantize wrote nothing");
  free(rd), free(rs), free(cd), free(cs);
}

/* ---- two ranks as threads ----------------------------------------------------------------------------- */

typedef struct {
  int rank;
  rank_t* r;
  const char* reason; /* abort_body: rank 1's reason */
  mokStatus_t forward;
  mokLayerError_t record, later; /* later: abort_body's, after a second mokLayerAbort */
  error_v1_t old;
  unsigned char old_tail[32]; /* right after `old`: must stay SENTINEL */
  int untouched;
} run_t;

/* Rank 1 passes a stream to the group's second call (mokLayerForward): it is rejected there, and the group with
   it. Then both make a third call, which the aborted group refuses, before they read their records. */
static void* stream_body(void* arg) {
  run_t* run = (run_t*)arg;
  rank_t* r = run->r;
  CHECK_MSG(mokLayerBuildSchedule(r->layer, r->ids, mokIndexInt32, T, NULL) == mokSuccess, "rank %d: %s", run->rank,
            mokGetLastError());
  fill_outputs(r);
  run->forward = mokLayerForward(r->layer, &r->weights, r->x, r->topk_weights, r->out, run->rank == 1 ? STREAM : NULL);
  if (run->rank == 1) {
    expect_refused(run->forward, "mokLayerForward", __LINE__);
    run->untouched = outputs_untouched(r);
  }
  /* The third call is refused by the aborted group; the record, read only now, is still about the second. */
  CHECK(mokLayerBackward(r->layer, &r->weights, r->topk_weights, r->dout, &r->grads, NULL) == mokPeerAbort);
  run->record = record_of(r);
  memset(&run->old, SENTINEL, sizeof(run->old) + sizeof(run->old_tail));
  run->old.size = sizeof(run->old), run->old.magic = MOK_STRUCT_MAGIC, run->old.version = MOK_VERSION_CODE(0, 1, 0);
  CHECK_MSG(mokLayerGetError(r->layer, (mokLayerError_t*)(void*)&run->old) == mokSuccess, "0.1 layout: %s",
            mokGetLastError());
  return NULL;
}

/* Rank 1 aborts the group between the first call and the second, with run->reason; both then call forward. Rank 0
   then aborts too: the first reason stands. */
static void* abort_body(void* arg) {
  run_t* run = (run_t*)arg;
  rank_t* r = run->r;
  CHECK_MSG(mokLayerBuildSchedule(r->layer, r->ids, mokIndexInt32, T, NULL) == mokSuccess, "rank %d: %s", run->rank,
            mokGetLastError());
  pthread_barrier_wait(&meet);
  if (run->rank == 1) CHECK(mokLayerAbort(r->layer, run->reason) == mokSuccess);
  pthread_barrier_wait(&meet);
  run->forward = mokLayerForward(r->layer, &r->weights, r->x, r->topk_weights, r->out, NULL);
  run->record = record_of(r);
  pthread_barrier_wait(&meet);
  if (run->rank == 0) CHECK(mokLayerAbort(r->layer, "a second reason") == mokSuccess);
  pthread_barrier_wait(&meet);
  run->later = record_of(r);
  return NULL;
}

/* Both contexts are made here (with peer_bases, creation is not collective) and destroyed once both threads are
   done, so neither frees memory its peer may still read. */
static void run_two(void* (*body)(void*), run_t runs[W]) {
  pthread_t threads[W];
  rank_t ranks[W];
  int q, made = 0, ok[W];
  make_peers(W);
  for (q = 0; q < W; ++q) made += ok[q] = make_rank(&ranks[q], W, q);
  if (made == W) {
    pthread_barrier_init(&meet, NULL, W);
    for (q = 0; q < W; ++q) {
      runs[q].rank = q, runs[q].r = &ranks[q];
      pthread_create(&threads[q], NULL, body, &runs[q]);
    }
    for (q = 0; q < W; ++q) pthread_join(threads[q], NULL);
    pthread_barrier_destroy(&meet);
  }
  for (q = 0; q < W; ++q)
    if (ok[q]) free_rank(&ranks[q]);
  for (q = 0; q < W; ++q) free(peer_bases[q]);
}

static void stream_aborts_the_group(void) {
  run_t runs[W];
  const char* why = "mokLayerForward: argument 'stream'";
  int q;
  memset(runs, 0, sizeof(runs));
  CHECK(sizeof(error_v1_t) == offsetof(mokLayerError_t, pass));
  run_two(stream_body, runs);
  CHECK_MSG(runs[1].untouched, "rank 1's refused forward wrote");
  CHECK_MSG(runs[0].forward == mokPeerAbort, "rank 0's forward: %d", runs[0].forward);
  for (q = 0; q < W; ++q) {
    const mokLayerError_t* e = &runs[q].record;
    mokStatus_t want = q == 1 ? mokInvalidArgument : mokPeerAbort;
    CHECK_MSG(e->status == want && e->pass == 2 && e->abort_rank == 1 && contains(e->detail, why),
              "rank %d: status %d pass %llu abort_rank %d detail '%s'", q, e->status, (unsigned long long)e->pass,
              e->abort_rank, e->detail);
    CHECK_MSG(q == 1 || contains(e->detail, "rank 1 rejected its arguments: "), "rank 0's detail: '%s'", e->detail);
    /* The 0.1 layout: the same record as far as it reaches, and not a byte beyond. */
    CHECK_MSG(runs[q].old.status == want && runs[q].old.rank == q && contains(runs[q].old.detail, why) &&
                  runs[q].old.size == sizeof(error_v1_t) && runs[q].old.version == MOK_VERSION_CODE(0, 1, 0),
              "rank %d, 0.1 layout: status %d detail '%s'", q, runs[q].old.status, runs[q].old.detail);
    CHECK_MSG(untouched(runs[q].old_tail, sizeof(runs[q].old_tail)), "rank %d: written past a 0.1 mokLayerError_t", q);
  }
}

static void abort_reaches_the_peer(const char* reason, const char* want_reason) {
  run_t runs[W];
  char want[512];
  int q;
  memset(runs, 0, sizeof(runs));
  runs[1].reason = reason;
  snprintf(want, sizeof(want), "rank 1 aborted the group: %s", want_reason);
  run_two(abort_body, runs);
  for (q = 0; q < W; ++q) {
    const mokLayerError_t* e = &runs[q].record;
    const char* d = e->detail;
    /* The whole reason where it fits, else as much as the detail holds, cut between characters. */
    int fits = strlen(want) < sizeof(e->detail);
    int same = fits ? strcmp(d, want) == 0 : strncmp(d, want, strlen(d)) == 0 && strlen(d) >= 150 && whole_utf8(d);
    CHECK_MSG(runs[q].forward == mokPeerAbort, "rank %d: forward %d", q, runs[q].forward);
    /* Rank 1 aborted after its first call (pass 1); rank 0 learnt it in its second. */
    CHECK_MSG(e->status == mokPeerAbort && e->abort_rank == 1 && e->pass == (uint64_t)(q == 0 ? 2 : 1) && same,
              "rank %d: status %d abort_rank %d pass %llu detail '%s'", q, e->status, e->abort_rank,
              (unsigned long long)e->pass, d);
    CHECK_MSG(strcmp(runs[q].later.detail, d) == 0 && runs[q].later.abort_rank == 1,
              "rank %d: a second mokLayerAbort replaced the first reason: '%s', abort_rank %d", q, runs[q].later.detail,
              runs[q].later.abort_rank);
  }
  CHECK_MSG(strcmp(runs[1].record.wait, "aborted by mokLayerAbort") == 0, "rank 1's wait: '%s'", runs[1].record.wait);
}

int main(void) {
  char long_reason[600];
  size_t i;
  one_rank();
  stream_aborts_the_group();
  abort_reaches_the_peer("the data loader died", "the data loader died");
  abort_reaches_the_peer(NULL, "no reason given");
  /* 2-byte characters from an even offset: a cut at the reason's size (165 bytes after the prefix) falls inside
     one. */
  long_reason[0] = 'x', long_reason[1] = 'y';
  for (i = 2; i + 2 < sizeof(long_reason); i += 2) long_reason[i] = (char)0xC3, long_reason[i + 1] = (char)0xA9;
  long_reason[i] = '\0';
  abort_reaches_the_peer(long_reason, long_reason);
  if (failures) printf("%d checks failed\n", failures);
  return failures;
}
