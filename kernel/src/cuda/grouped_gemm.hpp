// The grouped GEMMs of the split executor (libmok issue #12), as host-callable launchers. Each launch
// fills CUTLASS's ptr-array arguments on the device from core's schedule (core/grouped_problems.hpp, one
// thread per local expert: no host sync, no host read), then runs the grouped GEMM, all on the caller's
// stream. Built only in a CUDA build; no executor launches them yet.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/grouped_problems.hpp"
#include "core/numeric.hpp"

namespace mok::cuda {

enum class GemmStatus : int32_t {
  ok = 0,
  bad_kind,             // this instantiation does not serve the kind's operand layout
  cannot_implement,     // CUTLASS's can_implement refused, or H, I or a pointer breaks TMA's 16-byte alignment
  workspace_too_small,  // fewer workspace bytes than grouped_gemm_bf16_workspace_bytes reports
  cuda_error,           // a CUDA call failed: its error is in `*error`
};

const char* gemm_status_name(GemmStatus status);

// One BF16 grouped GEMM of a pass (fp32 accumulation, bf16 D = A B^T, no bias): the local experts' problems
// of `kind` over `window` of the schedule (core/grouped_problems.hpp for the buffers each kind reads and
// writes). Pointers are device memory. The SM100 instantiation serves the kinds whose A and B are both
// K-major: gate, up and down.
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
};

// Device bytes of the per-expert argument arrays (problem sizes, pointers, strides) for `groups` experts.
size_t grouped_gemm_bf16_argument_bytes(int groups);

// The CUTLASS workspace the launch needs on the current device.
GemmStatus grouped_gemm_bf16_workspace_bytes(const GroupedGemmBf16& gemm, size_t* bytes, cudaError_t* error);

// Fills the arguments on the device and launches the SM100 2-CTA grouped GEMM on `stream`.
GemmStatus grouped_gemm_bf16(const GroupedGemmBf16& gemm, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             cudaError_t* error);

}  // namespace mok::cuda
