// One instantiation of CUTLASS 4.2's SM100 ptr-array grouped GEMM: BF16 A and B (both K-major), fp32
// accumulation, bf16 D, no source C, 2-CTA tcgen05 MMA (a 256 x 128 tile over a CTA pair, 64-deep k
// blocks), problem sizes read on the device. One instantiation per translation unit: it alone takes
// minutes and gigabytes of nvcc (CMakeLists.txt pools these units).
#include "cuda/grouped_gemm.hpp"

// clang-format off
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
// clang-format on

namespace mok::cuda {
namespace grouped_gemm_detail {  // named: nvcc names an anonymous one after the file's absolute path (test_repro)

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per expert
using Element = cutlass::bfloat16_t;
constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // TMA: 16 bytes
using LayoutA = cutlass::layout::RowMajor;                              // A [M, K], K contiguous
using LayoutB = cutlass::layout::ColumnMajor;                           // B [N, K], K contiguous
using LayoutD = cutlass::layout::RowMajor;                              // D [M, N], N contiguous
using ClusterShape = Shape<_2, _1, _1>;                                 // the CTA pair of the 2-CTA MMA
using MmaTileShape = Shape<_256, _128, _64>;                            // per pair; 64 bf16 = one 128 B swizzle row
using EpilogueTileShape = decltype(shape_div(MmaTileShape{}, Shape<_2, _1, _1>{}));  // per CTA

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, EpilogueTileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignment, Element, LayoutD*,
    kAlignment, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm,
    cutlass::epilogue::fusion::LinearCombination<Element, float, void>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element, LayoutB*, kAlignment,
    float, MmaTileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmSm100>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

using StrideA = typename Kernel::InternalStrideA;
using StrideB = typename Kernel::InternalStrideB;
using StrideD = typename Kernel::InternalStrideD;
using Problem = typename ProblemShape::UnderlyingProblemShape;

// Each stride's mode 1 is the contiguous one (unit, static); only mode 0, the leading dim, is set per expert.
template <class Stride>
constexpr bool unit_mode_1 = remove_cvref_t<decltype(get<1>(Stride{}))>::value == 1;
static_assert(unit_mode_1<StrideA> && unit_mode_1<StrideB> && unit_mode_1<StrideD>, "K-major A, B; N-major D");

// Shared memory: the mainloop's stages (StageCountAutoCarveout fills what the epilogue leaves) must fit the
// 227 KB an SM100 CTA may use, and a 2-CTA kernel runs one CTA per SM. The figures also go into the binary as
// text, where tests/library/test_library.py reads them (cuobjdump reports only static shared memory).
constexpr size_t kSharedBytes = Kernel::SharedStorageSize;
constexpr unsigned kThreads = Kernel::MaxThreadsPerBlock;
static_assert(kSharedBytes <= 227 * 1024, "the grouped GEMM's shared storage exceeds an SM100 CTA's 227 KB");

struct Note {
  char text[64];
};
// "mok_gemm_bf16_sm100 shared=NNNNNNN threads=NNNN": the digits written from the constants above.
constexpr Note resource_note() {
  Note n{"mok_gemm_bf16_sm100 shared=0000000 threads=0000"};
  size_t shared = kSharedBytes;
  for (int i = 33; i >= 27; --i, shared /= 10) n.text[i] = static_cast<char>('0' + shared % 10);
  unsigned threads = kThreads;
  for (int i = 46; i >= 43; --i, threads /= 10) n.text[i] = static_cast<char>('0' + threads % 10);
  return n;
}
__attribute__((used)) constexpr Note kResourceNote = resource_note();

// The argument arrays, each 128-byte aligned, in one device block.
struct Arrays {
  Problem* problems;
  const Element** a;
  const Element** b;
  Element** d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
};

constexpr size_t kArrayAlign = 128;

size_t round_up(size_t n) {
  return (n + kArrayAlign - 1) / kArrayAlign * kArrayAlign;
}

// Offsets of the arrays from the block's start (sizes: `groups` entries each); returns the total.
size_t carve(int groups, char* base, Arrays* arrays) {
  size_t g = static_cast<size_t>(groups), at = 0;
  auto take = [&](size_t bytes) {
    char* p = base + at;
    at += round_up(bytes);
    return p;
  };
  Arrays out{};
  out.problems = reinterpret_cast<Problem*>(take(g * sizeof(Problem)));
  out.a = reinterpret_cast<const Element**>(take(g * sizeof(Element*)));
  out.b = reinterpret_cast<const Element**>(take(g * sizeof(Element*)));
  out.d = reinterpret_cast<Element**>(take(g * sizeof(Element*)));
  out.stride_a = reinterpret_cast<StrideA*>(take(g * sizeof(StrideA)));
  out.stride_b = reinterpret_cast<StrideB*>(take(g * sizeof(StrideB)));
  out.stride_d = reinterpret_cast<StrideD*>(take(g * sizeof(StrideD)));
  if (arrays) *arrays = out;
  return at;
}

// One thread per local expert: its problem from the schedule, as CUTLASS reads it.
__global__ void fill_grouped_arguments(core::LayerShape shape, core::Schedule schedule, core::GroupedGemm kind,
                                       core::RowPeriods periods, core::RowWindow window, const core::bf16_t* a,
                                       const core::bf16_t* b, core::bf16_t* d, Arrays arrays) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= shape.experts_per_rank) return;
  core::GroupedProblem p = core::grouped_problem(shape, schedule, kind, periods, window, e);
  core::GroupedLayout l = core::grouped_layout(shape, kind);
  arrays.problems[e] = make_shape(p.m, p.n, p.k);
  arrays.a[e] = reinterpret_cast<const Element*>(a + p.a);
  arrays.b[e] = reinterpret_cast<const Element*>(b + p.b);
  arrays.d[e] = reinterpret_cast<Element*>(d + p.c);
  StrideA sa{};
  StrideB sb{};
  StrideD sd{};
  get<0>(sa) = l.lda;
  get<0>(sb) = l.ldb;
  get<0>(sd) = l.ldc;
  arrays.stride_a[e] = sa;
  arrays.stride_b[e] = sb;
  arrays.stride_d[e] = sd;
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// What the launch can check before CUTLASS does: the kind's layout, the window, and TMA's 16-byte rule for
// every expert's pointers and leading dims (offsets are multiples of H or I elements).
GemmStatus check(const GroupedGemmBf16& g) {
  core::GroupedLayout l = core::grouped_layout(g.shape, g.kind);
  if (!l.a_k_major || !l.b_k_major || core::is_wgrad(g.kind)) return GemmStatus::bad_kind;
  if (!core::window_fits(g.kind, g.periods, g.window)) return GemmStatus::cannot_implement;
  if (g.shape.hidden % kAlignment || g.shape.intermediate % kAlignment) return GemmStatus::cannot_implement;
  if (!aligned(g.a) || !aligned(g.b) || !aligned(g.d) || reinterpret_cast<uintptr_t>(g.arguments) % kArrayAlign)
    return GemmStatus::cannot_implement;
  return GemmStatus::ok;
}

typename Gemm::Arguments arguments(const GroupedGemmBf16& g, const Arrays& arrays, int sm_count) {
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count;
  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;
  args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {g.shape.experts_per_rank, arrays.problems, nullptr},  // sizes on the device only
                                  {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b},
                                  {fusion, nullptr, nullptr, arrays.d, arrays.stride_d},
                                  hw};
  return args;
}

GemmStatus cuda_failed(cudaError_t e, cudaError_t* error) {
  if (error) *error = e;
  return GemmStatus::cuda_error;
}

GemmStatus sm_count(int* count, cudaError_t* error) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  return e == cudaSuccess ? GemmStatus::ok : cuda_failed(e, error);
}

}  // namespace grouped_gemm_detail
using namespace grouped_gemm_detail;

const char* gemm_status_name(GemmStatus status) {
  switch (status) {
    case GemmStatus::ok: return "ok";
    case GemmStatus::bad_kind: return "bad_kind";
    case GemmStatus::cannot_implement: return "cannot_implement";
    case GemmStatus::workspace_too_small: return "workspace_too_small";
    case GemmStatus::cuda_error: return "cuda_error";
  }
  return "unknown";
}

size_t grouped_gemm_bf16_argument_bytes(int groups) {
  return carve(groups, nullptr, nullptr);
}

GemmStatus grouped_gemm_bf16_workspace_bytes(const GroupedGemmBf16& g, size_t* bytes, cudaError_t* error) {
  int sms = 0;
  GemmStatus s = sm_count(&sms, error);
  if (s != GemmStatus::ok) return s;
  Arrays arrays{};
  carve(g.shape.experts_per_rank, static_cast<char*>(g.arguments), &arrays);
  *bytes = Gemm::get_workspace_size(arguments(g, arrays, sms));
  return GemmStatus::ok;
}

GemmStatus grouped_gemm_bf16(const GroupedGemmBf16& g, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             cudaError_t* error) {
  GemmStatus s = check(g);
  int sms = 0;
  if (s == GemmStatus::ok) s = sm_count(&sms, error);
  if (s != GemmStatus::ok) return s;
  Arrays arrays{};
  carve(g.shape.experts_per_rank, static_cast<char*>(g.arguments), &arrays);
  typename Gemm::Arguments args = arguments(g, arrays, sms);
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return GemmStatus::cannot_implement;
  if (workspace_bytes < Gemm::get_workspace_size(args)) return GemmStatus::workspace_too_small;
  int threads = 128, blocks = (g.shape.experts_per_rank + threads - 1) / threads;
  fill_grouped_arguments<<<blocks, threads, 0, stream>>>(g.shape, g.schedule, g.kind, g.periods, g.window, g.a, g.b,
                                                         g.d, arrays);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_failed(e, error);
  Gemm gemm;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess)
    return cuda_failed(cudaGetLastError(), error);
  if (gemm.run(stream) != cutlass::Status::kSuccess) return cuda_failed(cudaGetLastError(), error);
  return GemmStatus::ok;
}

}  // namespace mok::cuda
