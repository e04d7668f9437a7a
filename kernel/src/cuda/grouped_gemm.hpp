// The grouped GEMMs of the split executor (libmok issue #12), as host-callable launchers. Each launch
// fills CUTLASS's ptr-array arguments on the device from core's schedule (core/grouped_problems.hpp, one
// thread per local expert: no host sync, no host read), then runs the grouped GEMM, all on the caller's
// stream. One entry point serves every BF16 kind: it picks the instantiation whose operand layouts and element
// types the kind has, among the units built for the device's architecture (SM100, SM90); another serves the MXFP8
// forward on SM100 (docs/gpu.md). Built only in a CUDA build with CUTLASS; the cuda executor launches them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/grouped_mx_problems.hpp"
#include "core/grouped_problems.hpp"
#include "core/numeric.hpp"

namespace mok::cuda {

enum class GemmStatus : int32_t {
  ok = 0,
  bad_kind,             // not a GroupedGemm kind, or no instantiation serves its operand layout
  cannot_implement,     // CUTLASS's can_implement refused, the window does not fit (core::window_fits), or H,
                        // I or a pointer breaks TMA's 16-byte alignment (`arguments`: 128 bytes)
  workspace_too_small,  // fewer workspace bytes than the launch's workspace query (bf16 or mxfp8) reports
  cuda_error,           // a CUDA call failed: its error is in `*error`
  bad_operands,         // a pointer the kind reads or writes is null, or one it does not use is set (below)
  no_architecture,      // this build carries no grouped GEMM for the launch's `architecture`
};

// The grouped GEMM units a launch runs, by the device's compute capability major: 10 (sm_100a, sm_103a: tcgen05)
// or 9 (sm_90a: WGMMA). `none` for any other, and for one whose units this build does not carry.
enum class GemmArchitecture : int32_t { none = 0, sm90 = 9, sm100 = 10 };
GemmArchitecture gemm_architecture(int cc_major);
const char* gemm_architecture_name(GemmArchitecture architecture);  // "sm_90a", "sm_100a/sm_103a", "none"
// The current device's (cudaGetDevice, cudaDevAttrComputeCapabilityMajor); none with `*error` set when CUDA fails.
GemmArchitecture current_gemm_architecture(cudaError_t* error);

const char* gemm_status_name(GemmStatus status);

// One BF16 grouped GEMM of a pass (bf16 A and B, fp32 accumulation, D = A B^T (+ C), no bias): the local
// experts' problems of `kind` over `window` of the schedule (core/grouped_problems.hpp for the buffers each
// kind reads and writes; C and D share the offsets and leading dim of the kind's C/D). Pointers are device
// memory. Which pointers a kind uses (every other must be null, else bad_operands):
//   gate, up, down, dgrad_h:  a, b, d (bf16 D = A B^T)
//   gate, up, down:           or a, b, d_fp32 (fp32 D = A B^T: a layer with expert biases adds them, then rounds)
//   dgrad_x_gate:             a, b, d_fp32: the partial dx, fp32 [out rows, H], D = dg W_gate
//   dgrad_x_up:               a, b, c_fp32 (dgrad_x_gate's partial), d (bf16 dx): D = bf16(du W_up + C)
//   wgrad_down, _gate, _up:   a, b, d_fp32: main_grad [E_local, ...] fp32, read as C and written as D:
//                             main_grad += A B^T, one window after another in schedule order, no split-K
// So dx_k is rounded to bf16 once, after one fp32 sum of both terms (docs/semantics.md), and every result is
// deterministic: each element of D has one writer, its K loop runs in a fixed order.
struct GroupedGemmBf16 {
  core::LayerShape shape;
  core::Schedule schedule;  // its `experts` array in device memory (rows and total_rows are not read)
  core::GroupedGemm kind;
  core::RowPeriods periods;
  core::RowWindow window;  // core::window_fits(kind, periods, window) must hold
  const core::bf16_t* a;
  const core::bf16_t* b;
  core::bf16_t* d;
  void* arguments;  // device, grouped_gemm_bf16_argument_bytes(shape.experts_per_rank) bytes, 128-byte aligned
  // The backward's fp32 operands (after the fields above, so a caller naming only those gets null):
  float* d_fp32;
  const float* c_fp32;
  GemmArchitecture architecture;  // the device's (gemm_architecture): which units run; none is refused
};

// Device bytes of the per-expert argument arrays (problem sizes, pointers, strides) for `groups` experts:
// enough for every kind.
size_t grouped_gemm_bf16_argument_bytes(int groups);

// The CUTLASS workspace the launch of `gemm.kind` on `gemm.architecture` needs on the current device (the pointers are
// not read).
GemmStatus grouped_gemm_bf16_workspace_bytes(const GroupedGemmBf16& gemm, size_t* bytes, cudaError_t* error);

// Checks the launch (kind, operands, window, alignment, workspace), then fills the arguments on the device
// and launches the kind's grouped GEMM of `gemm.architecture` on `stream` (SM100: 2-CTA tcgen05; SM90: WGMMA). Never
// launches anything when it refuses.
GemmStatus grouped_gemm_bf16(const GroupedGemmBf16& gemm, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             cudaError_t* error);

// The forward's grouped GEMMs in MXFP8 mode (gate, up, down): e4m3 A and B in 1x32 blocks along K with e8m0
// scales in the SM100 layout (core/mxfp8_layout.hpp), fp32 accumulation, bf16 D = A B^T, no source. Per expert
// the group reads (core/grouped_mx_problems.hpp):
//   A: the ring's rowwise codes, ring row r at a + r * a_stride, and its row scales, one [periods.ring, K]
//      matrix (core::mx_ring_scales) at a_scales;
//   B: the expert's weight codes [N, K] at b + e N K, its scales MxScaleLayout::of(N, K) at
//      b_scales + e * matrix_bytes();
//   D: bf16 as the BF16 launch's gate, up or down.
// Every group must start a scale row tile (core::mx_tiles_whole: expert_padding, periods.ring and window.row0
// multiples of 128), else cannot_implement.
struct GroupedGemmMxfp8 {
  core::LayerShape shape;
  core::Schedule schedule;  // its `experts` array in device memory
  core::GroupedGemm kind;   // gate, up, down or dgrad_h (mx_block_scaled_kind)
  core::RowPeriods periods;
  core::RowWindow window;
  const uint8_t* a;  // e4m3 codes
  int64_t a_stride;  // codes from one ring row to the next: H for x and dy, 2 I for h (in ring_h's bytes)
  const uint8_t* a_scales;
  const uint8_t* b;  // e4m3 codes [E_local, N, K] (rowwise; dgrad_h: down's colwise form)
  const uint8_t* b_scales;
  core::bf16_t* d;
  void* arguments;  // device, grouped_gemm_mxfp8_argument_bytes(shape.experts_per_rank) bytes, 128-byte aligned
  GemmArchitecture architecture;  // the device's: sm100 only (its block-scaled tcgen05 MMA), else no_architecture
};

size_t grouped_gemm_mxfp8_argument_bytes(int groups);
GemmStatus grouped_gemm_mxfp8_workspace_bytes(const GroupedGemmMxfp8& gemm, size_t* bytes, cudaError_t* error);
// As grouped_gemm_bf16: checks everything it can (kind, pointers, 16-byte alignment, stride, window, tiles)
// before any CUDA call, then fills the arguments on the device and launches on `stream`.
GemmStatus grouped_gemm_mxfp8(const GroupedGemmMxfp8& gemm, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream, cudaError_t* error);

}  // namespace mok::cuda
