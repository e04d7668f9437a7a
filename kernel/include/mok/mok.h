/*
 * libmok C ABI. Stable, C-callable, for C++ trainers that do not use Python.
 *
 * Conventions (as in nccl.h):
 *  - every call returns a mokStatus_t; mokGetStatusString() names it and mokGetLastError() gives the
 *    thread-local detail of this thread's last failed call (which argument, which rule);
 *  - every struct a call reads or fills starts with a stamp (size, magic, version) written by its
 *    MOK_*_INIT macro, as nccl.h's ncclConfig_t: a caller built against an older mok.h passes its
 *    smaller struct and gets defaults for the fields it lacks; a struct larger than this libmok
 *    knows (from a newer mok.h) is rejected with mokInvalidArgument naming the version it came from
 *    (docs/c-api.md, "Struct compatibility");
 *  - objects are opaque handles.
 */
#ifndef MOK_H_
#define MOK_H_

#include <stddef.h>
#include <stdint.h>

#include "mok/mok_version.h"

#if defined(__GNUC__)
#define MOK_API __attribute__((visibility("default")))
#else
#define MOK_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------ */
typedef enum {
  mokSuccess = 0,
  mokInvalidArgument = 1, /* an argument breaks a documented rule; nothing was written */
  mokInvalidUsage = 2,    /* calls in the wrong order, or a handle in the wrong state */
  mokNotCompiled = 3,     /* the requested executor was not built into this libmok */
  mokNoDevice = 4,        /* no usable GPU or driver on this machine */
  mokUnsupported = 5,     /* the device or configuration is not supported by the executor */
  mokCudaError = 6,       /* a CUDA runtime call failed; the detail names it */
  mokSystemError = 7,     /* an OS call failed (shared memory, threads); the detail names it */
  mokOutOfMemory = 8,
  mokTimeout = 9,    /* a bounded wait on another worker or rank ran out */
  mokPeerAbort = 10, /* another rank or worker aborted the pass */
  mokInternalError = 11,
  mokNcclError = 12, /* an NCCL call failed (mokNcclPeersCreate); the detail names it and NCCL's error */
  mokNumStatus = 13
} mokStatus_t;

/* A static string naming the status ("mokSuccess: no error", ...); never NULL. */
MOK_API const char* mokGetStatusString(mokStatus_t status);
/* Detail of this thread's last failed call, "" if none; valid until the thread's next mok call. */
MOK_API const char* mokGetLastError(void);

/* ---- version ----------------------------------------------------------------------------- */
/* The version of the loaded library, as MOK_VERSION (compare with the header's MOK_VERSION). */
MOK_API mokStatus_t mokGetVersion(int* version);

/* ---- struct stamps ------------------------------------------------------------------------ */
/* Every stamped struct begins with these three fields; its MOK_*_INIT macro starts with MOK_STAMP. */
#define MOK_STRUCT_MAGIC 0x6d6f6b21u /* "mok!" */
#define MOK_STAMP(type) sizeof(type), MOK_STRUCT_MAGIC, MOK_VERSION

/* ---- executors and devices --------------------------------------------------------------- */
typedef enum {
  mokExecutorHost = 0,     /* CPU threads; always compiled */
  mokExecutorSm100 = 1,    /* the fused executor: the cuda executor's layer with the whole pass as one persistent
                              kernel, on sm_100a / sm_103a; its tiles on CUDA cores for now (docs/gpu.md, "The fused
                              executor"); never run on a GPU yet */
  mokExecutorPortable = 2, /* any sm_80+ GPU (later) */
  mokExecutorCuda = 3,     /* the split executor: a pass as a sequence of kernels on the caller's stream, a group of
                              BF16 or MXFP8 ranks, expert biases or not, on sm_100a / sm_103a or sm_90a
                              (docs/gpu.md, "The cuda executor"); never run on a GPU yet */
  mokNumExecutors = 4
} mokExecutor_t;

/* "host", "sm100", "portable", "cuda"; NULL for an unknown value. */
MOK_API const char* mokExecutorName(mokExecutor_t executor);
/*
 * *compiled = 1 when this libmok carries the code that runs a layer with `executor`: mokExecutorHost always,
 * mokExecutorCuda in a CUDA build with the grouped GEMMs (CUTLASS's headers); device code built in for queries
 * alone does not count. mokExecutorCompiled, mokExecutorSupportsDevice and
 * mokLayerCreate agree: an executor that is not compiled fails all three with mokNotCompiled.
 */
MOK_API mokStatus_t mokExecutorCompiled(mokExecutor_t executor, int* compiled);
/* The CUDA architectures the device code was compiled for, e.g. "100a;103a"; "" without CUDA. */
MOK_API const char* mokCudaArchitectures(void);

typedef struct {
  size_t size;            /* sizeof(mokDeviceInfo_t), set by MOK_DEVICE_INFO_INIT */
  unsigned int magic;     /* MOK_STRUCT_MAGIC */
  unsigned int version;   /* MOK_VERSION of the mok.h the caller was built with */
  int device_count;       /* visible CUDA devices (0 when there is no GPU or no driver) */
  int device;             /* the device described below, -1 if none */
  int cc_major, cc_minor; /* compute capability */
  int multiprocessors;
  int driver_version;  /* CUDA driver API version, 0 without a driver */
  int runtime_version; /* CUDA runtime version libmok was linked with */
  size_t total_memory; /* bytes */
  char name[256];
} mokDeviceInfo_t;
#define MOK_DEVICE_INFO_INIT {MOK_STAMP(mokDeviceInfo_t), 0, -1, 0, 0, 0, 0, 0, 0, {0}}

/*
 * Describe CUDA device `device`. Without a GPU or driver: mokNoDevice, with device_count 0 and the
 * driver and runtime versions filled in as far as they are known. Without CUDA: mokNotCompiled.
 */
MOK_API mokStatus_t mokGetDeviceInfo(int device, mokDeviceInfo_t* info);
/*
 * *supported = 1 when `executor` can run a layer on CUDA device `device` (it is compiled, see
 * mokExecutorCompiled, and its code carries an image that the device loads). The host executor
 * supports device -1 (the CPU) only. Never fails for a missing GPU: *supported = 0 and the status
 * says why (mokNoDevice, mokNotCompiled, mokUnsupported).
 */
MOK_API mokStatus_t mokExecutorSupportsDevice(mokExecutor_t executor, int device, int* supported);

/* ---- the layer (see docs/c-api.md; on a GPU, docs/gpu.md) ----------------------------------- */
/*
 * One MoE layer of an expert-parallel group of `world` ranks. Every rank creates its own context
 * and makes the same sequence of collective calls (mokLayerBuildSchedule, mokLayerForward,
 * mokLayerRecompute, mokLayerBackward); each returns when this rank's part is done, or with the
 * status of the first failure of the group (mokTimeout, mokPeerAbort). Ranks whose configs differ
 * fail with mokInvalidArgument, ranks making different calls with mokInvalidUsage, both naming the
 * field or the calls. A collective call whose arguments (or order) this rank rejects returns
 * mokInvalidArgument (mokInvalidUsage) and, with world > 1, aborts the group: its peers return
 * mokPeerAbort with its reason. Tensors are row-major and contiguous; bf16 tensors are passed as raw
 * 16-bit words.
 *
 * Streams: every pass call takes the stream it runs on as its last parameter, `void* stream`: a
 * cudaStream_t for a device executor (mokExecutorCuda; NULL is the legacy default stream), on which the call
 * is asynchronous: its status is that of the enqueueing (docs/c-api.md); the
 * host executor runs every call on the calling thread and requires NULL (any other stream:
 * mokInvalidArgument, nothing written, rejected as any other argument). On the host executor every
 * call is synchronous and its status is the pass's outcome (docs/c-api.md, "Streams, completion and
 * errors").
 */
typedef struct mokLayer* mokLayer_t;

typedef enum { mokPrecisionBF16 = 0, mokPrecisionMXFP8 = 1, mokNumPrecisions = 2 } mokPrecision_t;
typedef enum { mokIndexInt32 = 0, mokIndexInt64 = 1 } mokIndexType_t;
typedef enum { mokDataBF16 = 0, mokDataFloat32 = 1 } mokDataType_t;
/*
 * The experts' gated activation of g = x W_gate^T and u = x W_up^T, with the clamp L (swiglu_limit):
 * g' = min(g, L), u' = clamp(u, -L, L). docs/semantics.md gives the fp32 order of every operation.
 *   mokActivationSwiglu:    h = silu(g') * u'                            (Llama, Mixtral, Qwen, DeepSeek)
 *   mokActivationSwigluOai: h = g' * sigmoid(alpha * g') * (u' + 1)      (gpt-oss: alpha 1.702, L 7)
 */
typedef enum { mokActivationSwiglu = 0, mokActivationSwigluOai = 1, mokNumActivations = 2 } mokActivation_t;
/*
 * Where the routing weight w_k of a (token, k) route is applied (docs/semantics.md gives the rounding points):
 *   mokRoutingScaleOutput: out = shared(x) + sum_k w_k y_k(x)            (Mixtral, Qwen, DeepSeek, gpt-oss)
 *   mokRoutingScaleInput:  out = shared(x) + sum_k y_k(bf16(w_k x))      (Llama4: the expert sees the scaled row)
 */
typedef enum { mokRoutingScaleOutput = 0, mokRoutingScaleInput = 1, mokNumRoutingScales = 2 } mokRoutingScale_t;

/*
 * The layer's shapes and knobs. Every range a..b includes both ends. The products that size the
 * buffers are bounded too (exact integers, both bounds included):
 *   world * max_tokens * top_k + experts_per_rank * expert_padding <= 2^31 - 1 (receive rows, int32 indices);
 *   max_tokens * top_k * hidden, experts_per_rank * intermediate * hidden, macrobatch * hidden and
 *   macrobatch * intermediate <= 2^40 (elements of the largest tensors).
 * A field or product outside its rule: mokInvalidArgument, the detail naming it, its value and the rule.
 */
typedef struct {
  size_t size;              /* sizeof(mokLayerConfig_t), set by MOK_LAYER_CONFIG_INIT */
  unsigned int magic;       /* MOK_STRUCT_MAGIC */
  unsigned int version;     /* MOK_VERSION of the mok.h the caller was built with */
  int world;                /* ranks in the group, 1..72 */
  int rank;                 /* this rank, 0..world-1 */
  int experts_per_rank;     /* E_local, 1..2^20; global expert e lives on rank e / E_local */
  int hidden;               /* H, 1..2^20 */
  int intermediate;         /* I of the routed experts, 1..2^20 */
  int top_k;                /* K, 1..1024 */
  int max_tokens;           /* 1..2^24: the most tokens any rank passes to one call (sizes the buffers) */
  int shared_intermediate;  /* I_s of the shared expert, 0..2^20; 0 = no shared expert */
  mokPrecision_t precision; /* GEMM operands: bf16, or MXFP8 (then expert_padding % 32 == 0); no other value */
  float swiglu_limit;       /* SwiGLU clamp L > 0 (+inf allowed); 0 = no clamp; not negative, not NaN */
  int expert_padding;       /* 1..2^16: each expert's rows are padded to a multiple of this (tile height) */
  int minibatch;            /* 1..2^24: rows per readiness counter; a multiple of expert_padding */
  int macrobatch;           /* 1..2^26: rows of the receive ring buffer; >= minibatch and a multiple of it */
  int comm_workers;         /* host threads moving rows, 1..64 */
  int compute_workers;      /* host threads computing tiles, 1..256 */
  int timeout_ms;           /* 1..86400000 (24 h): every wait on another worker or rank gives up after this
                               long without progress of the ranks it waits for (tasks they finish);
                               docs/c-api.md, "Failures of the group" */
  mokExecutor_t executor;   /* mokExecutorHost, or mokExecutorCuda where compiled (others: mokNotCompiled) */
  /* Added after the first layout (a caller without them gets mokActivationSwiglu): */
  mokActivation_t activation; /* mokActivationSwiglu or mokActivationSwigluOai; no other value */
  float swiglu_alpha;         /* mokActivationSwigluOai's alpha: finite and > 0; ignored by mokActivationSwiglu */
  /* Added after activation and swiglu_alpha (a caller without them gets 0 for both): */
  int backward_comm_workers;       /* of the layer's comm_workers + compute_workers threads, those that move rows in
                                      mokLayerBackward (the rest compute), as a GPU splits its SMs differently per pass;
                                      0 (= comm_workers) or 1..comm_workers + compute_workers - 1. Forward and
                                      recompute use comm_workers. The results do not depend on it. */
  mokRoutingScale_t routing_scale; /* mokRoutingScaleOutput (0) or mokRoutingScaleInput; no other value. The
                                      previous layout's sizeof (96 on LP64) has 4 bytes of tail padding where
                                      backward_comm_workers lies; with this field the new layout's sizeof
                                      differs */
} mokLayerConfig_t;
#define MOK_LAYER_CONFIG_INIT   \
  {MOK_STAMP(mokLayerConfig_t), \
   1,                           \
   0,                           \
   0,                           \
   0,                           \
   0,                           \
   0,                           \
   0,                           \
   0,                           \
   mokPrecisionBF16,            \
   0.0f,                        \
   32,                          \
   256,                         \
   1024,                        \
   1,                           \
   1,                           \
   30000,                       \
   mokExecutorHost,             \
   mokActivationSwiglu,         \
   1.702f,                      \
   0,                           \
   mokRoutingScaleOutput}

typedef struct {
  size_t size;            /* sizeof(mokLayerSizes_t), set by MOK_LAYER_SIZES_INIT */
  unsigned int magic;     /* MOK_STRUCT_MAGIC */
  unsigned int version;   /* MOK_VERSION of the mok.h the caller was built with */
  size_t peer_bytes;      /* each rank's peer-visible buffer */
  size_t workspace_bytes; /* this rank's private workspace */
} mokLayerSizes_t;
#define MOK_LAYER_SIZES_INIT {MOK_STAMP(mokLayerSizes_t), 0, 0}

/* What the caller must allocate for `config`, before anything runs. */
MOK_API mokStatus_t mokLayerGetSizes(const mokLayerConfig_t* config, mokLayerSizes_t* sizes);

typedef struct {
  size_t size;          /* sizeof(mokLayerMemory_t), set by MOK_LAYER_MEMORY_INIT */
  unsigned int magic;   /* MOK_STRUCT_MAGIC */
  unsigned int version; /* MOK_VERSION of the mok.h the caller was built with */
  /* Either: every rank's peer buffer (world pointers, this rank's at [rank]; peer_bytes each,
     64-byte aligned, any contents: an earlier group's buffers may be reused as they are) ... */
  void* const* peer_bases;
  /* ... or a POSIX shared-memory rendezvous name (ranks as processes on one host; 1..200 letters,
     digits, '_', '-', '.'): rank r's buffer is /dev/shm/<name>-<r>, its space reserved at creation
     (mokOutOfMemory when /dev/shm lacks it); mokLayerCreate is then collective and unlinks every
     segment before it returns. Every group running at the same time needs a name of its own: a
     second group met during setup fails both (mokInvalidUsage); a crashed rank's segment is removed
     by the next group using the name. docs/c-api.md, "Shared memory", says what is guaranteed. */
  const char* shm_name;
  void* workspace; /* private, workspace_bytes, 64-byte aligned; owned by the caller */
  size_t workspace_bytes;
  /* Added after the first layout (a caller without it gets 0): the bytes of each peer_bases buffer,
     checked against mokLayerGetSizes' peer_bytes; 0 = not given, not checked. 0 with shm_name
     (libmok sizes the segments). */
  size_t peer_bytes;
} mokLayerMemory_t;
#define MOK_LAYER_MEMORY_INIT {MOK_STAMP(mokLayerMemory_t), NULL, NULL, NULL, 0, 0}

MOK_API mokStatus_t mokLayerCreate(const mokLayerConfig_t* config, const mokLayerMemory_t* memory, mokLayer_t* layer);
MOK_API mokStatus_t mokLayerDestroy(mokLayer_t layer);

/*
 * Collective. topk_ids [num_tokens, top_k] (int32 or int64), values in [0, world * experts_per_rank)
 * or -1 for no route; 0 <= num_tokens <= max_tokens (ranks may differ). The schedule is kept and
 * used by the following forward, recompute and backward calls.
 */
MOK_API mokStatus_t mokLayerBuildSchedule(mokLayer_t layer, const void* topk_ids, mokIndexType_t index_type,
                                          int num_tokens, void* stream);

typedef struct {
  const uint8_t* data;   /* e4m3fn bytes */
  const uint8_t* scales; /* e8m0 bytes (blocks of 32 along the stored last dim), as mokMxfp8Quantize lays them out */
} mokMxfp8Matrix_t;

typedef struct {
  size_t size;                  /* sizeof(mokLayerWeights_t), set by MOK_LAYER_WEIGHTS_INIT */
  unsigned int magic;           /* MOK_STRUCT_MAGIC */
  unsigned int version;         /* MOK_VERSION of the mok.h the caller was built with */
  const void *gate, *up, *down; /* bf16 [E, I, H], [E, I, H], [E, H, I] (bf16 precision) */
  /* MXFP8 precision: each weight as mokMxfp8Quantize writes it, rowwise and colwise (transposed) */
  mokMxfp8Matrix_t gate_rowwise, gate_colwise, up_rowwise, up_colwise, down_rowwise, down_colwise;
  const void *shared_gate, *shared_up, *shared_down; /* bf16 [I_s, H], [I_s, H], [H, I_s] */
  /* Routed expert biases, bf16 in both precisions, each optional (NULL: zero): [E, I], [E, I], [E, H].
   * g = x W_gate^T + gate_bias, u = x W_up^T + up_bias, y = h W_down^T + down_bias, each bias added to
   * the fp32 sum before it is rounded to bf16 (docs/semantics.md). */
  const void *gate_bias, *up_bias, *down_bias;
  /* bf16 [H] or NULL: the shared expert's gate (Qwen2-MoE): its output is scaled by sigmoid(x_t . r);
     only with a shared expert; NULL keeps it ungated (docs/semantics.md) */
  const void* shared_router;
} mokLayerWeights_t;
#define MOK_LAYER_WEIGHTS_INIT   \
  {MOK_STAMP(mokLayerWeights_t), \
   NULL,                         \
   NULL,                         \
   NULL,                         \
   {NULL, NULL},                 \
   {NULL, NULL},                 \
   {NULL, NULL},                 \
   {NULL, NULL},                 \
   {NULL, NULL},                 \
   {NULL, NULL},                 \
   NULL,                         \
   NULL,                         \
   NULL,                         \
   NULL,                         \
   NULL,                         \
   NULL,                         \
   NULL}

/*
 * Collective. x [num_tokens, H] bf16, topk_weights [num_tokens, K] fp32 -> out [num_tokens, H] bf16.
 * Keeps x and the expert outputs as the context the backward needs.
 */
MOK_API mokStatus_t mokLayerForward(mokLayer_t layer, const mokLayerWeights_t* weights, const void* x,
                                    const float* topk_weights, void* out, void* stream);
/*
 * Collective. Rebuilds the forward context from x (activation checkpointing) without an output. A layer with
 * mokRoutingScaleInput needs the routing weights for it (its experts read bf16(w_k x)): mokLayerRecompute
 * rejects that layer (mokInvalidArgument naming 'topk_weights'); use mokLayerRecomputeWeighted.
 */
MOK_API mokStatus_t mokLayerRecompute(mokLayer_t layer, const mokLayerWeights_t* weights, const void* x, void* stream);
/*
 * Collective. mokLayerRecompute with the forward's topk_weights [num_tokens, K] fp32: required (not NULL) with
 * mokRoutingScaleInput; with mokRoutingScaleOutput it is not read and may be NULL.
 */
MOK_API mokStatus_t mokLayerRecomputeWeighted(mokLayer_t layer, const mokLayerWeights_t* weights, const void* x,
                                              const float* topk_weights, void* stream);

typedef struct {
  size_t size;          /* sizeof(mokLayerGrads_t), set by MOK_LAYER_GRADS_INIT */
  unsigned int magic;   /* MOK_STRUCT_MAGIC */
  unsigned int version; /* MOK_VERSION of the mok.h the caller was built with */
  void* dx;             /* bf16 [num_tokens, H] */
  float* dtopk_weights; /* fp32 [num_tokens, K] */
  /* Weight gradients: bf16 outputs, or, with accumulate = 1, fp32 main_grad buffers added into. */
  int accumulate;
  void *dgate, *dup, *ddown;                      /* [E, I, H], [E, I, H], [E, H, I] */
  void *dshared_gate, *dshared_up, *dshared_down; /* [I_s, H], [I_s, H], [H, I_s]; with a shared expert */
  /* Bias gradients [E, I], [E, I], [E, H], bf16 or fp32 as the weight gradients; each required with its
   * weights.*_bias, and written whenever given (the gradient of a NULL, zero, bias). */
  void *dgate_bias, *dup_bias, *ddown_bias;
  void* dshared_router; /* [H]; required when weights.shared_router is given */
} mokLayerGrads_t;
#define MOK_LAYER_GRADS_INIT \
  {MOK_STAMP(mokLayerGrads_t), NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}

/*
 * Collective. dout [num_tokens, H] bf16; needs a forward or recompute since the last schedule, given the
 * same weights as that forward: the backward reads the forward's g and u where the workspace still holds
 * them (every row fitted in the ring) and recomputes them from these weights otherwise.
 */
MOK_API mokStatus_t mokLayerBackward(mokLayer_t layer, const mokLayerWeights_t* weights, const float* topk_weights,
                                     const void* dout, mokLayerGrads_t* grads, void* stream);

/*
 * Not collective. y_slots [num_tokens, K, H] bf16: each route's expert output y_k of the current context, as the
 * combine summed it (zeros for a -1 route). Autograd layers keep it for the router-weight gradient. A stream
 * the executor refuses (any but NULL on the host) is mokInvalidArgument without aborting the group.
 */
MOK_API mokStatus_t mokLayerGetSlots(mokLayer_t layer, void* y_slots, void* stream);

/*
 * Not collective. Makes an earlier forward's context the current schedule's again, for its backward: x
 * [num_tokens, H] bf16, the forward's input, and y_slots [num_tokens, K, H] bf16, what mokLayerGetSlots gave
 * after it. Call it after mokLayerBuildSchedule with that forward's topk_ids, and give the backward that
 * forward's weights: the backward is then bitwise the one that would have followed the forward directly.
 * It costs two copies and no pass: the backward recomputes g and u from x (as it does whenever the ring no
 * longer holds them), so a trainer with several layers of one shape on one mokLayer_t keeps each layer's
 * context as its own two tensors instead of running mokLayerRecompute. Needs a schedule (mokInvalidUsage
 * otherwise); a stream the executor refuses is mokInvalidArgument; a refused call does not abort the group.
 */
MOK_API mokStatus_t mokLayerRestoreContext(mokLayer_t layer, const void* x, const void* y_slots, void* stream);

typedef struct {
  size_t size;          /* sizeof(mokLayerError_t), set by MOK_LAYER_ERROR_INIT */
  unsigned int magic;   /* MOK_STRUCT_MAGIC */
  unsigned int version; /* MOK_VERSION of the mok.h the caller was built with */
  mokStatus_t status;   /* mokSuccess when no pass has failed */
  int rank;             /* the rank that recorded it (this one) */
  char task[32];        /* the task that failed ("dispatch", "wgrad", ...), "" outside a task */
  int task_index;       /* its minibatch, tile or chunk; -1 outside a task */
  char wait[48];        /* the wait that gave up ("closing barrier", "group formation", ...) */
  /* The message, where there is one: a differing config field or call, a wait's missing rank, or the
     reason the rank that aborted the group gave ("rank 1 rejected its arguments: ...", "rank 1 aborted
     the group: <its mokLayerAbort reason>"); "" otherwise. */
  char detail[256];
  /* Added in 0.2 (an older caller's smaller struct is filled up to detail): */
  /* Which collective call of this context the record is about, counting every collective call since
     mokLayerCreate from 1 (mokLayerBuildSchedule, mokLayerForward, mokLayerRecompute, mokLayerBackward,
     rejected ones included): with a failure, the call that was running, or the last one begun, when it
     was recorded (0: before the first call); with mokSuccess, the calls made so far (0 = none yet). */
  uint64_t pass;
  /* The rank that aborted the group on purpose, by a rejected call or mokLayerAbort (this rank
     included); -1 when the failure is no such abort (a timeout, a mismatch) or there is none. */
  int abort_rank;
} mokLayerError_t;
#define MOK_LAYER_ERROR_INIT {MOK_STAMP(mokLayerError_t), mokSuccess, -1, {0}, -1, {0}, {0}, 0, -1}

/* The first failure this rank recorded (readable from any thread, also while a pass runs, without
   synchronising with any stream). */
MOK_API mokStatus_t mokLayerGetError(mokLayer_t layer, mokLayerError_t* error);
/* Make every rank's current and future passes wind down with mokPeerAbort; any thread may call it,
   concurrently with any call on `layer` except mokLayerDestroy. `reason` (NULL: "no reason given") reaches
   every rank's detail as "rank R aborted the group: <reason>", cut to the detail's size (at a character
   boundary of UTF-8 text), with abort_rank R; the first reason given to the group stands. */
MOK_API mokStatus_t mokLayerAbort(mokLayer_t layer, const char* reason);

/*
 * MXFP8 quantisation (contracts "MXFP8"): src [batch, rows, cols] bf16 or fp32. rowwise: data
 * [batch, rows, cols] e4m3fn, blocks of 32 along cols; colwise (blocks along rows, stored
 * transposed): data [batch, cols, rows]. Either pair may be NULL, not both. Scales: e8m0 bytes in the
 * layout the SM100 block-scaled MMA reads (CUTLASS 4.2's Sm1xxBlockScaledConfig<32>, docs/mxfp8.md
 * "The device scale-factor layout"): a stored [R, C] matrix (rowwise R = rows, C = cols; colwise
 * R = cols, C = rows) has the scale of (row r, block b = c / 32) at byte
 *   ((r / 128) * kt + b / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + b % 4,  kt = ceil(ceil(C/32) / 4),
 * and takes ceil(R / 128) * kt * 512 bytes, padding rows (to 128) and blocks (to 4) included, which
 * hold 127 (2^0); matrix l of the batch starts at l times that. dtype: mokDataBF16 or mokDataFloat32;
 * batch, rows, cols >= 1 each and batch * rows * cols <= 2^40 (2^40 itself accepted). A broken rule,
 * or NaN or Inf in src: mokInvalidArgument, nothing written. A host function today: it runs on the
 * calling thread over host memory, and `stream` must be NULL (the parameter is there for a device
 * quantiser; any other stream: mokInvalidArgument).
 */
MOK_API mokStatus_t mokMxfp8Quantize(const void* src, mokDataType_t dtype, int64_t batch, int64_t rows, int64_t cols,
                                     uint8_t* rowwise_data, uint8_t* rowwise_scales, uint8_t* colwise_data,
                                     uint8_t* colwise_scales, void* stream);

/* ---- peer memory from an NCCL communicator (docs/gpu.md, "Peer memory from NCCL") ------------------------ */
/*
 * For a C++ trainer that holds an NCCL communicator over its expert-parallel group: a peer buffer of `bytes`
 * (mokLayerGetSizes' peer_bytes) on every rank, and every rank's device address of each, for
 * mokLayerMemory_t.peer_bases of a mokExecutorCuda layer with config.world and config.rank as the communicator's
 * size and rank. Each buffer comes from ncclMemAlloc and is registered as a symmetric window
 * (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC); the addresses come from ncclGetPeerDevicePointer. So
 * mokNcclPeersCreate is collective over the communicator: every rank calls it with the same bytes, with the
 * communicator's device current. libmok loads NCCL when first asked (MOK_NCCL_LIBRARY, a path, else libnccl.so.2
 * as the dynamic loader finds it; NCCL >= 2.29; pinned: PyPI nvidia-nccl-cu13==2.32.3), so it neither links nor
 * needs NCCL otherwise. nccl_comm is an ncclComm_t.
 * Refusals, nothing kept unless said: NULL nccl_comm or peers, or bytes 0 (mokInvalidArgument); libmok built without
 * CUDA (mokNotCompiled); no usable GPU (mokNoDevice); NCCL not loaded, each reason named (mokUnsupported); another
 * device current than the communicator's, or more than 72 ranks (mokInvalidArgument); a rank whose peer lies
 * outside its LSA team, the ranks NCCL reaches by loads and stores (mokUnsupported, naming both); a registration that
 * gives no window (mokUnsupported: not inside ncclGroupStart/End); a nonblocking communicator's registration not done
 * in 120 s (mokTimeout); a failed NCCL call (mokNcclError, naming it). Where the registration may still be running
 * (no window, the timeout, a failure after it began) the buffer stays allocated, as NCCL may still use it: abort the
 * communicator. A refusal before the registration (device, NCCL, ncclMemAlloc) is this rank's alone and leaves its
 * peers waiting in ncclCommWindowRegister: abort the communicator.
 */
typedef struct mokNcclPeers* mokNcclPeers_t;
MOK_API mokStatus_t mokNcclPeersCreate(void* nccl_comm, size_t bytes, mokNcclPeers_t* peers);
/* The table: *peer_bases holds *world device pointers (rank r's buffer at [r], valid until mokNcclPeersDestroy),
 *rank is this rank. Any output may be NULL. */
MOK_API mokStatus_t mokNcclPeersGetBases(mokNcclPeers_t peers, void* const** peer_bases, int* world, int* rank);
/* Collective (ncclCommWindowDeregister): after every layer over the buffers is destroyed; NULL is a no-op. */
MOK_API mokStatus_t mokNcclPeersDestroy(mokNcclPeers_t peers);

/* ---- self-test (docs/gpu.md, "On your first GPU") ------------------------------------------------ */
/*
 * The staged self-test that `mok_selftest` and `python -m mok.selftest` run, stage by stage, in this order. Each
 * stage checks one layer of the GPU path on the device given in the options, with random inputs, every wait
 * bounded by options.timeout_ms.
 */
typedef enum {
  mokSelftestProbe = 0,        /* the device, the driver's entry points, the probe kernels, the host-mapped record */
  mokSelftestGemmTile = 1,     /* the split executor's grouped GEMM against core's host GEMM of the same bytes */
  mokSelftestOneRank = 2,      /* one rank's layer on the GPU against the host executor */
  mokSelftestVirtualRanks = 3, /* several ranks on one GPU, peers as device pointers */
  mokSelftestEveryGpu = 4,     /* one rank on every GPU of the machine */
  mokSelftestDeterminism = 5,  /* the layer run again: bitwise the same outputs and gradients */
  mokSelftestBenchmark = 6,    /* one benchmark line */
  mokNumSelftestStages = 7
} mokSelftestStage_t;

typedef struct {
  size_t size;          /* sizeof(mokSelftestOptions_t), set by MOK_SELFTEST_OPTIONS_INIT */
  unsigned int magic;   /* MOK_STRUCT_MAGIC */
  unsigned int version; /* MOK_VERSION of the mok.h the caller was built with */
  int device;           /* the CUDA device of the one-GPU stages, >= 0 */
  int timeout_ms;       /* 1..600000: the bound of each wait of a stage for the GPU */
  uint64_t seed;        /* the random inputs' seed; 0 = a fresh one, named in the report */
} mokSelftestOptions_t;
#define MOK_SELFTEST_OPTIONS_INIT {MOK_STAMP(mokSelftestOptions_t), 0, 60000, 0}

typedef struct {
  size_t size;          /* sizeof(mokSelftestReport_t), set by MOK_SELFTEST_REPORT_INIT */
  unsigned int magic;   /* MOK_STRUCT_MAGIC */
  unsigned int version; /* MOK_VERSION of the mok.h the caller was built with */
  double seconds;       /* the stage's wall time */
  char message[1024];   /* what it checked and found, passed or not ("" only for a rejected call) */
} mokSelftestReport_t;
#define MOK_SELFTEST_REPORT_INIT {MOK_STAMP(mokSelftestReport_t), 0.0, {0}}

/* "probe", "gemm_tile", "one_rank", "virtual_ranks", "every_gpu", "determinism", "benchmark"; NULL otherwise. */
MOK_API const char* mokSelftestStageName(mokSelftestStage_t stage);
/*
 * Runs one stage; its status is the verdict: mokSuccess (passed), mokNotCompiled (not built in this libmok: no
 * CUDA, or no grouped GEMM), mokNoDevice (no usable GPU or driver), mokUnsupported (this GPU cannot run this
 * libmok's device code, or the stage cannot run in this environment: virtual_ranks with
 * CUDA_DEVICE_MAX_CONNECTIONS=1 or CUDA_LAUNCH_BLOCKING=1), mokCudaError, mokOutOfMemory, mokTimeout (a wait
 * ran out: the GPU may still be running the kernel), mokInternalError (the GPU's results are wrong). report->message
 * says what was checked and found (on failure also mokGetLastError()). options NULL: MOK_SELFTEST_OPTIONS_INIT.
 * A bad argument: mokInvalidArgument, nothing run.
 */
MOK_API mokStatus_t mokSelftestRun(mokSelftestStage_t stage, const mokSelftestOptions_t* options,
                                   mokSelftestReport_t* report);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOK_H_ */
