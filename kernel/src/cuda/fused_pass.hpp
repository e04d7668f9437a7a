// The fused executor's pass (mokExecutorSm100): one persistent kernel per pass and rank, a CTA per worker, each CTA
// running core's whole per-worker body (core::run_pass_worker) as the host executor's threads do: the entry barrier,
// the comm queue's pulls from the peers and pushes into their slots, the compute queue's tiles, the closing barrier,
// the home sums and the gradient write-out, every wait core's bounded wait. Thread 0 of a CTA runs the body; each tile
// GEMM is shared by all the CTA's threads: on tensor cores, 1-CTA tcgen05 MMAs over core's panels
// (cuda/tensor_tile.cuh, core/tensor_tile.hpp), a chunk whose operands are not all bf16 values an element each in
// the contract's order (core/gemm_element.hpp). Built for the Blackwell targets only; nothing of it has run on a GPU.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/pass_view.hpp"
#include "core/tasks.hpp"

namespace mok::cuda {

// One rank's fused pass. Every pointer is device memory, those inside the view included; the view's kind is the
// pass's and its shape the config's (the pass runs on fewer workers where the device cannot keep them all resident).
struct FusedDevice {
  core::PassView view;
  core::PassArgs args;     // the call's tensors (device memory)
  core::TaskGraph* graph;  // one TaskGraph of device memory: the prologue leaves the pass's laid-out graph there
  int resident;            // CTAs of the pass kernel the device keeps resident at once (fused_residency)
  void* panel_maps;        // core::kPanelMaps tensor maps a worker, written by write_panel_maps
  cudaStream_t stream;
};

// CTAs of the pass kernel that the current device keeps resident at once (its occupancy times its SMs): the most
// workers a pass may run, since every worker waits for others. 0 and the error where CUDA cannot say.
cudaError_t fused_residency(bool mxfp8, int* ctas);

// The tensor maps the pass's TMA loads read (core/panel_boxes.hpp), `count` of them at `maps` (device memory, on 64
// bytes), each set to the template a tile's operands fill in: once, at the layer's creation. `encoded`: the driver's
// CUresult where it refused to encode it (then cudaErrorInvalidValue).
cudaError_t write_panel_maps(void* maps, int count, CUresult* encoded);

// The pass on d.stream: a one-thread prologue (the schedule's rows, counters zeroed, the task graph laid out), then
// the persistent kernel, a cooperative launch (all its CTAs resident at once) of core::fit_workers(shape, resident)
// workers. Nothing here waits for the GPU.
cudaError_t enqueue_fused_pass(const FusedDevice& d);

}  // namespace mok::cuda
