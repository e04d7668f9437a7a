// The split executor's pass on a GPU (core/split_pass.hpp): each launch of the plan enqueued as kernels on one
// stream, in order; stream order is the only synchronisation inside the rank. The host plans the launches from
// the shape alone (core::split_plan) and never reads the schedule: every kernel takes the row count from the
// schedule's segments on the device. Nothing here waits for the GPU.
//
// What runs today: the row steps (split_steps.cu, core's bodies), the BF16 grouped GEMMs and the MXFP8 forward's
// block-scaled ones (grouped_gemm.hpp, in a build with CUTLASS), every other MXFP8 GEMM as a BF16 one over operands a
// dequantise step wrote (core/split_dequantise.hpp), the shared expert (its GEMMs through the same
// launcher, its row steps from core/split_shared.hpp) and the home sums; in a group of several ranks the closing
// barrier is a kernel of one thread (core::stream_barrier over the peers' headers), and for one rank the stream's
// order. Nothing here has run on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/split_bias.hpp"
#include "core/split_pass.hpp"
#include "core/split_shared.hpp"

#if MOK_WITH_GROUPED_GEMM
#include "cuda/grouped_gemm.hpp"
#endif

namespace mok::cuda {

// One rank's split pass on the device. Every pointer is device memory, those inside the view included (its peers
// and headers arrays, the group's state, the schedule, the rings, the weights); the view's kind is the pass's.
struct SplitDevice {
  core::PassView view;
  char* const* host_peers;  // view.peers' bases in host memory: the host reads the own one (the shared expert's x)
  // dx's fp32 first term [out ring rows, H]; the weight gradients' fp32 sums: the caller's main_grad, or with bf16
  // gradients this executor's own (zeroed and written out by the pass)
  core::SplitTargets targets;
  core::SplitGradients gradients;  // a backward's bf16 weight gradients (the caller's; all null with main_grad) and
                                   // bias gradients
  core::SplitShared shared;        // with a shared expert: its buffers (core/split_shared.hpp), else all null
  core::bf16_t* staging;           // staging_values bf16 per CTA of a row step (MXFP8's dispatch and SwiGLU)
  int64_t staging_values;
  core::SplitDequantised dequantised;  // MXFP8: the dequantised operands' scratch (all null in BF16)
  int ctas;                            // CTAs of a row step: each takes the window's tiles grid-stride
  int architecture;      // the GemmArchitecture (grouped_gemm.hpp) of the layer's device, read once at its creation
  void* gemm_arguments;  // split_gemm_argument_bytes(view.s) bytes, 128-byte aligned
  void* gemm_workspace;  // CUTLASS's workspace: split_gemm_workspace_bytes (every kind, MXFP8's too)
  size_t gemm_workspace_bytes;
  const float* topk_weights;  // the home sums: forward [tokens, K] ...
  core::bf16_t* out;          // ... into out [tokens, H]
  const core::bf16_t* dout;   // backward: dOut [tokens, H] ...
  core::bf16_t* dx;           // ... into dx [tokens, H] and dw [tokens, K]
  float* dw;
  cudaStream_t stream;
};

enum class SplitRefusal : int32_t {
  none = 0,
  unsupported_layer,  // core::split_supports refuses it (a width not a multiple of 8 (of 32 in MXFP8), padding not
                      // of 128-row tiles in MXFP8)
  no_gemm,            // this libmok has no grouped GEMM (built without CUTLASS's headers)
  gemm_refused,       // the grouped GEMM refused a launch (gemm_status says why), or before any (launch -1): the
                      // device's architecture is not one this build carries (no_architecture)
  cuda_error,         // a launch failed: error
  bad_device,  // the SplitDevice itself: ctas < 1, no host peer table, no GEMM argument block, no staging (or too
               // little in MXFP8), no dequantised scratch in MXFP8, shared buffer, backward target (dx's first term, a
               // weight gradient's sum or bf16 destination) where needed
};

// Where an enqueued pass stopped: the launch (its index in the plan, step and GEMM kind) and why.
struct SplitFailure {
  SplitRefusal refusal = SplitRefusal::none;
  int64_t launch = -1;
  core::SplitStep step = core::SplitStep::count;
  core::GroupedGemm gemm = core::GroupedGemm::count;
  int gemm_status = 0;            // GemmStatus (grouped_gemm.hpp) with gemm_refused
  const char* missing = nullptr;  // bad_device: the buffer the pass would use that is null, where one is
  cudaError_t error = cudaSuccess;
};

const char* split_refusal_name(SplitRefusal refusal);

#if MOK_WITH_GROUPED_GEMM
// The device bytes of gemm_arguments: enough for every GEMM of the layer's passes (the MXFP8 forward's too).
size_t split_gemm_argument_bytes(const core::LayerShape& s);
// The CUTLASS workspace the largest of the pass's GEMM kinds asks for on the current device of `architecture`, the
// routed experts' and the shared one's, and in MXFP8 mode the block-scaled forward's.
GemmStatus split_gemm_workspace_bytes(const core::LayerShape& s, GemmArchitecture architecture, size_t* bytes,
                                      cudaError_t* error);
#endif

// Enqueues the pass of d.view.kind on d.stream: in a group the entry barrier (the caller has staged the call's
// inputs), then the plan's launches in order; returns false at the first launch that could not be enqueued (what
// was enqueued before it still runs; launch -1: the entry barrier).
bool enqueue_split_pass(const SplitDevice& d, SplitFailure* failure);

// The row steps and the home sums (split_steps.cu): enqueued on d.stream, never waited for; the launch's error.
cudaError_t launch_dispatch(const SplitDevice& d, const core::RowWindow& window);
cudaError_t launch_swiglu(const SplitDevice& d, const core::RowWindow& window);
cudaError_t launch_swiglu_backward(const SplitDevice& d, const core::RowWindow& window);
cudaError_t launch_combine(const SplitDevice& d, const core::RowWindow& window);
cudaError_t launch_home_sums(const SplitDevice& d);
cudaError_t launch_shared_rows(const SplitDevice& d, core::SplitStep step);
cudaError_t launch_gradients(const SplitDevice& d, bool write);
cudaError_t launch_dequantise(const SplitDevice& d, core::GroupedGemm kind, const core::RowWindow& window);
cudaError_t launch_add_bias(const SplitDevice& d, core::GroupedGemm kind, const core::RowWindow& window);
cudaError_t launch_bias_gradients(const SplitDevice& d, const core::RowWindow& window);

// The cuda executor's kernels outside a pass's row steps (layer_steps.cu): mokLayerBuildSchedule's (the caller's ids
// staged and the schedule built between the group's two schedule barriers, in one CTA), mokLayerGetSlots' (a thread
// per token), a barrier of the group (`what`, entered from view.kind's call), and leaving the group (mokLayerAbort, a
// refused call: the peers told). The barriers and the leaving launch nothing for a group of one.
cudaError_t launch_rank_schedule(const core::PassView& view, const void* ids, bool int64_ids, int tokens,
                                 const core::Routing& routing, int32_t* routing_tokens, cudaStream_t stream);
cudaError_t launch_copy_slots(const core::PassView& view, core::bf16_t* y_slots, cudaStream_t stream);
cudaError_t launch_group_barrier(const core::PassView& view, core::WaitId what, cudaStream_t stream);
cudaError_t launch_leave_group(const core::PassView& view, cudaStream_t stream);

}  // namespace mok::cuda
