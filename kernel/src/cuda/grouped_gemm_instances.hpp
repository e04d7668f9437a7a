// The grouped-GEMM instantiations as the launcher (grouped_gemm.cu) sees them: one per translation unit
// (grouped_gemm_bf16*_sm100.cu over grouped_gemm_sm100.cuh, grouped_gemm_bf16*_sm90.cu over grouped_gemm_sm90.cuh,
// each a few lines), reached through a table of functions so that the launcher itself includes no CUTLASS. A
// build carries an architecture's units when MOK_CUDA_ARCHITECTURES names one of its targets (MOK_WITH_SM100_GEMM,
// MOK_WITH_SM90_GEMM).
#pragma once

#include "cuda/grouped_gemm.hpp"

namespace mok::cuda {

// A kind's operands as its instantiation reads them, resolved by the launcher from GroupedGemmBf16:
// D = A B^T + beta C over the kind's problems (c null: no source read, beta 0).
struct GemmOperands {
  const void* a;
  const void* b;
  void* d;
  const void* c;
  float beta;
};

struct GroupedGemmInstance {
  const char* name;
  bool a_k_major, b_k_major;  // the layouts it serves (core::GroupedLayout)
  size_t (*argument_bytes)(int groups);
  GemmStatus (*workspace_bytes)(const GroupedGemmBf16& gemm, const GemmOperands& operands, size_t* bytes,
                                cudaError_t* error);
  GemmStatus (*launch)(const GroupedGemmBf16& gemm, const GemmOperands& operands, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream, cudaError_t* error);
};

// A K-major, B K-major, bf16 D, no source: gate, up, down (grouped_gemm_bf16_sm100.cu).
const GroupedGemmInstance& grouped_gemm_sm100_forward();
// A K-major, B K-major, fp32 D, no source: gate, up, down with an expert bias (grouped_gemm_bf16_forward_f32_sm100.cu).
const GroupedGemmInstance& grouped_gemm_sm100_forward_f32();
// A K-major, B N-major, bf16 D, optional fp32 source C: dgrad_h, dgrad_x_up (grouped_gemm_bf16_dgrad_sm100.cu).
const GroupedGemmInstance& grouped_gemm_sm100_dgrad();
// A K-major, B N-major, fp32 D, no source: dgrad_x_gate's partial dx (grouped_gemm_bf16_dgrad_partial_sm100.cu).
const GroupedGemmInstance& grouped_gemm_sm100_dgrad_partial();
// A M-major, B N-major, fp32 D = C + A B^T: wgrad_down, wgrad_gate, wgrad_up (grouped_gemm_bf16_wgrad_sm100.cu).
const GroupedGemmInstance& grouped_gemm_sm100_wgrad();

// The same five kinds of instantiation on SM90 (grouped_gemm_bf16*_sm90.cu).
const GroupedGemmInstance& grouped_gemm_sm90_forward();
const GroupedGemmInstance& grouped_gemm_sm90_forward_f32();
const GroupedGemmInstance& grouped_gemm_sm90_dgrad();
const GroupedGemmInstance& grouped_gemm_sm90_dgrad_partial();
const GroupedGemmInstance& grouped_gemm_sm90_wgrad();

// The MXFP8 forward (grouped_gemm_mxfp8_sm100.cu): its own operands, so its own table entry.
struct GroupedGemmMxInstance {
  const char* name;
  size_t (*argument_bytes)(int groups);
  GemmStatus (*workspace_bytes)(const GroupedGemmMxfp8& gemm, size_t* bytes, cudaError_t* error);
  GemmStatus (*launch)(const GroupedGemmMxfp8& gemm, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                       cudaError_t* error);
};

// e4m3 A and B K-major with e8m0 scales, bf16 D, no source: gate, up, down (grouped_gemm_mxfp8_sm100.cu).
const GroupedGemmMxInstance& grouped_gemm_sm100_mxfp8_forward();

}  // namespace mok::cuda
