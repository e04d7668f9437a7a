// CUTLASS 4.2's ptr-array grouped GEMM, what every instantiation shares whatever its architecture: the kernel built
// from a configuration (grouped_gemm_sm100.cuh, grouped_gemm_sm90.cuh, grouped_gemm_mxfp8_sm100.cuh give them), the
// resource note, the argument arrays and their fill from the schedule on the device, the checks of a launch and
// the launch itself. A unit (grouped_gemm_*_sm*.cu) names ONE instantiation: one alone takes minutes and gigabytes
// of nvcc (CMakeLists.txt pools these units), so nothing here is instantiated twice in a unit. Every kernel here is
// a template over the configuration, whose namespace names the architecture: a kernel that did not depend on it
// would be one symbol in two object libraries built for different targets, and a launch could find the wrong one.
#pragma once

#include <type_traits>

#include "cuda/grouped_gemm_instances.hpp"
#include "cuda/resource_note.hpp"

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

namespace mok::cuda::grouped {  // named: nvcc names an anonymous one after the file's absolute path (test_repro)

using namespace cute;

// Layout tags as CUTLASS reads them: A [M, K] RowMajor = K contiguous, ColumnMajor = M contiguous;
// B [N, K] ColumnMajor = K contiguous, RowMajor = N contiguous; C and D [M, N] RowMajor.
using KMajorA = cutlass::layout::RowMajor;
using MMajorA = cutlass::layout::ColumnMajor;
using KMajorB = cutlass::layout::ColumnMajor;
using NMajorB = cutlass::layout::RowMajor;

// An SM90 or SM100 CTA may ask for 227 KB of shared memory (the opt-in maximum; the SM's 228 KB also hold the 1 KB
// the system reserves per CTA). CUTLASS's stage count fills up to this.
constexpr size_t kSharedBudget = 227 * 1024;

// What a BF16 configuration reads and writes, whatever its architecture: bf16 A and B in the given layouts, D of
// ElementD_ [M, N] row-major, C of ElementC_ (void: no source), every row TMA's 16 bytes aligned.
template <class LayoutA_, class LayoutB_, class ElementD_, class ElementC>
struct Bf16Operands {
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  using LayoutD = cutlass::layout::RowMajor;  // D [M, N], N contiguous
  using Element = cutlass::bfloat16_t;        // A and B
  using ElementD = ElementD_;
  static constexpr bool kSource = !std::is_void_v<ElementC>;
  using ElementAligned = std::conditional_t<kSource, ElementC, ElementD_>;  // C's alignment when void
  static constexpr bool kAKMajor = std::is_same_v<LayoutA, KMajorA>;
  static constexpr bool kBKMajor = std::is_same_v<LayoutB, KMajorB>;

  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;
  static constexpr int kAlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr int kAlignmentC = 128 / cutlass::sizeof_bits<ElementAligned>::value;

  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per expert
};

// A configuration's kernel, what the launch code reads of it, and the checks every instantiation must pass.
template <class Config>
struct Instantiation : Config {
  using typename Config::Epilogue;
  using typename Config::Mainloop;
  using typename Config::ProblemShape;
  using ElementC = typename Epilogue::ElementC;  // void with no source: the pointer array CUTLASS takes
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  using Problem = typename ProblemShape::UnderlyingProblemShape;

  // Shared memory: the mainloop's stages (StageCountAutoCarveout fills what the epilogue leaves) must fit.
  // The figures also go into the binary as text (resource_note), where tests/library/test_library.py reads
  // them: cuobjdump reports only static shared memory.
  static constexpr size_t kSharedBytes = Kernel::SharedStorageSize;
  static constexpr unsigned kThreads = Kernel::MaxThreadsPerBlock;
  static_assert(kSharedBytes <= kSharedBudget, "the grouped GEMM's shared storage exceeds a CTA's 227 KB");
};

// "mok_gemm_FAMILY_ARCH NAME shared=NNNNNNN threads=NNNN" (resource_note.hpp; G::kNote the family and
// architecture: bf16_sm100, mxfp8_sm100, bf16_sm90), the digits written from the instantiation's constants: one per
// unit, so a test finds every instantiation's budget without knowing the units.
using mok::cuda::Note;
template <class G>
constexpr Note resource_note(const char* name) {
  return mok::cuda::resource_note(G::kNote, name, G::kSharedBytes, G::kThreads);
}

// The argument arrays, each 128-byte aligned, in one device block.
template <class G>
struct Arrays {
  typename G::Problem* problems;
  const typename G::Element** a;
  const typename G::Element** b;
  typename G::ElementD** d;
  const typename G::ElementC** c;
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideC* stride_c;
  typename G::StrideD* stride_d;
};

constexpr size_t kArrayAlign = 128;

inline size_t round_up(size_t n) {
  return (n + kArrayAlign - 1) / kArrayAlign * kArrayAlign;
}

// Hands out arrays of `groups` entries one after another from `base`, each 128-byte aligned; null `base`
// only counts the bytes.
struct ArrayCarver {
  char* base;
  size_t groups, at = 0;

  template <class T>
  T* take() {
    char* p = base ? base + at : nullptr;
    at += round_up(groups * sizeof(T));
    return reinterpret_cast<T*>(p);
  }
};

template <class G>
Arrays<G> carve_arrays(ArrayCarver& c) {
  Arrays<G> out{};
  out.problems = c.take<typename G::Problem>();
  out.a = c.take<const typename G::Element*>();
  out.b = c.take<const typename G::Element*>();
  out.d = c.take<typename G::ElementD*>();
  out.c = c.take<const typename G::ElementC*>();
  out.stride_a = c.take<typename G::StrideA>();
  out.stride_b = c.take<typename G::StrideB>();
  out.stride_c = c.take<typename G::StrideC>();
  out.stride_d = c.take<typename G::StrideD>();
  return out;
}

// Offsets of the arrays from the block's start (sizes: `groups` entries each); returns the total.
template <class G>
size_t carve(int groups, char* base, Arrays<G>* arrays) {
  ArrayCarver c{base, static_cast<size_t>(groups)};
  Arrays<G> out = carve_arrays<G>(c);
  if (arrays) *arrays = out;
  return c.at;
}

// A stride has one unit (static) mode among M/N and K, the contiguous one; the other, the leading dim, is
// set per expert.
template <class Stride>
CUTE_HOST_DEVICE Stride leading(int64_t ld) {
  Stride s{};
  if constexpr (is_static<remove_cvref_t<decltype(get<1>(s))>>::value)  // mode 1 unit, mode 0 the leading dim
    get<0>(s) = ld;
  else
    get<1>(s) = ld;
  return s;
}

template <class Stride>
constexpr bool one_unit_mode() {
  using S0 = remove_cvref_t<decltype(get<0>(Stride{}))>;
  using S1 = remove_cvref_t<decltype(get<1>(Stride{}))>;
  if constexpr (is_static<S0>::value)
    return S0::value == 1 && !is_static<S1>::value;
  else
    return is_static<S1>::value && S1::value == 1;
}

// Expert e's entries of the arrays: its problem as CUTLASS reads it. C, when read, has D's offsets and
// leading dim.
template <class G>
CUTE_DEVICE void put_group(const Arrays<G>& arrays, const GemmOperands& operands, int e, const core::GroupedProblem& p,
                           const core::GroupedLayout& l) {
  static_assert(one_unit_mode<typename G::StrideA>() && one_unit_mode<typename G::StrideB>() &&
                    one_unit_mode<typename G::StrideC>() && one_unit_mode<typename G::StrideD>(),
                "each operand has one contiguous extent");
  arrays.problems[e] = make_shape(p.m, p.n, p.k);
  arrays.a[e] = static_cast<const typename G::Element*>(operands.a) + p.a;
  arrays.b[e] = static_cast<const typename G::Element*>(operands.b) + p.b;
  arrays.d[e] = static_cast<typename G::ElementD*>(operands.d) + p.c;
  if constexpr (G::kSource)
    arrays.c[e] = operands.c ? static_cast<const typename G::ElementC*>(operands.c) + p.c : nullptr;
  arrays.stride_a[e] = leading<typename G::StrideA>(l.lda);
  arrays.stride_b[e] = leading<typename G::StrideB>(l.ldb);
  arrays.stride_c[e] = leading<typename G::StrideC>(l.ldc);
  arrays.stride_d[e] = leading<typename G::StrideD>(l.ldc);
}

// One thread per local expert: its problem from the schedule.
template <class G>
__global__ void fill_grouped_arguments(core::LayerShape shape, core::Schedule schedule, core::GroupedGemm kind,
                                       core::RowPeriods periods, core::RowWindow window, GemmOperands operands,
                                       Arrays<G> arrays) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= shape.experts_per_rank) return;
  core::GroupedProblem p = core::grouped_problem(shape, schedule, kind, periods, window, e);
  put_group<G>(arrays, operands, e, p, core::grouped_layout(shape, kind));
}

inline bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// What the launch can check before CUTLASS does: the kind's layout is this instantiation's, the operands
// match what it reads, the window fits, and TMA's 16-byte rule for every expert's pointers and leading dims
// (offsets are multiples of H or I elements; H and I multiples of 8 give 16 bytes in bf16 and fp32 alike).
// What every instantiation asks of its launch: the window fits, H and I keep rows `alignment`-element aligned,
// the argument block is 128-byte aligned.
inline GemmStatus check_shape(const core::LayerShape& shape, core::GroupedGemm kind, const core::RowPeriods& periods,
                              const core::RowWindow& window, int alignment, const void* arguments) {
  if (!core::window_fits(kind, periods, window)) return GemmStatus::cannot_implement;
  if (shape.hidden % alignment || shape.intermediate % alignment) return GemmStatus::cannot_implement;
  if (reinterpret_cast<uintptr_t>(arguments) % kArrayAlign) return GemmStatus::cannot_implement;
  return GemmStatus::ok;
}

template <class G>
GemmStatus check(const GroupedGemmBf16& g, const GemmOperands& o) {
  if (static_cast<uint32_t>(g.kind) >= static_cast<uint32_t>(core::GroupedGemm::count)) return GemmStatus::bad_kind;
  core::GroupedLayout l = core::grouped_layout(g.shape, g.kind);
  if (l.a_k_major != G::kAKMajor || l.b_k_major != G::kBKMajor) return GemmStatus::bad_kind;
  if (!o.a || !o.b || !o.d || (o.c && !G::kSource) || (!o.c && o.beta != 0.0f)) return GemmStatus::bad_operands;
  if (!aligned(o.a) || !aligned(o.b) || !aligned(o.d) || !aligned(o.c)) return GemmStatus::cannot_implement;
  return check_shape(g.shape, g.kind, g.periods, g.window, G::kAlignment, g.arguments);
}

// CUTLASS's arguments over the arrays, the mainloop's (operand pointers, strides, scales) given.
template <class G>
typename G::Gemm::Arguments gemm_arguments(int groups, const GemmOperands& o, const Arrays<G>& arrays,
                                           const typename G::Mainloop::Arguments& mainloop, int sm_count) {
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count;
  typename G::Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = o.c ? o.beta : 0.0f;
  const typename G::ElementC** c = o.c ? arrays.c : nullptr;  // null: the epilogue reads no source
  args = typename G::Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                     {groups, arrays.problems, nullptr},  // sizes on the device
                                     mainloop,
                                     {fusion, c, o.c ? arrays.stride_c : nullptr, arrays.d, arrays.stride_d},
                                     hw};
  return args;
}

template <class G>
typename G::Gemm::Arguments arguments(const GroupedGemmBf16& g, const GemmOperands& o, const Arrays<G>& arrays,
                                      int sm_count) {
  return gemm_arguments<G>(g.shape.experts_per_rank, o, arrays, {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b},
                           sm_count);
}

inline GemmStatus cuda_failed(cudaError_t e, cudaError_t* error) {
  if (error) *error = e;
  return GemmStatus::cuda_error;
}

inline GemmStatus sm_count(int* count, cudaError_t* error) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  return e == cudaSuccess ? GemmStatus::ok : cuda_failed(e, error);
}

template <class G>
size_t argument_bytes(int groups) {
  return carve<G>(groups, nullptr, nullptr);
}

// CUTLASS's workspace for the arguments `arguments(sm count)` builds, on the current device.
template <class G, class Arguments>
GemmStatus query_workspace(Arguments arguments, size_t* bytes, cudaError_t* error) {
  int sms = 0;
  GemmStatus s = sm_count(&sms, error);
  if (s == GemmStatus::ok) *bytes = G::Gemm::get_workspace_size(arguments(sms));
  return s;
}

template <class G>
GemmStatus workspace_bytes(const GroupedGemmBf16& g, const GemmOperands& o, size_t* bytes, cudaError_t* error) {
  Arrays<G> arrays{};
  carve<G>(g.shape.experts_per_rank, static_cast<char*>(g.arguments), &arrays);
  return query_workspace<G>([&](int sms) { return arguments<G>(g, o, arrays, sms); }, bytes, error);
}

// The launch, once the instantiation's own checks gave `checked`: the arguments `arguments(sm count)` builds,
// CUTLASS's checks, the workspace, `fill` (which launches the fill kernel on the stream), then the GEMM.
template <class G, class Arguments, class Fill>
GemmStatus run(GemmStatus checked, Arguments arguments, void* workspace, size_t workspace_bytes, cudaStream_t stream,
               cudaError_t* error, Fill fill) {
  int sms = 0;
  if (checked == GemmStatus::ok) checked = sm_count(&sms, error);
  if (checked != GemmStatus::ok) return checked;
  typename G::Gemm::Arguments args = arguments(sms);
  if (G::Gemm::can_implement(args) != cutlass::Status::kSuccess) return GemmStatus::cannot_implement;
  if (workspace_bytes < G::Gemm::get_workspace_size(args)) return GemmStatus::workspace_too_small;
  fill();
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_failed(e, error);
  typename G::Gemm gemm;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess)
    return cuda_failed(cudaGetLastError(), error);
  if (gemm.run(stream) != cutlass::Status::kSuccess) return cuda_failed(cudaGetLastError(), error);
  return GemmStatus::ok;
}

constexpr int kFillThreads = 128;

inline int fill_blocks(int groups) {
  return (groups + kFillThreads - 1) / kFillThreads;
}

template <class G>
GemmStatus launch(const GroupedGemmBf16& g, const GemmOperands& o, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, cudaError_t* error) {
  Arrays<G> arrays{};  // pointer arithmetic only: nothing is read or written before the checks pass
  carve<G>(g.shape.experts_per_rank, static_cast<char*>(g.arguments), &arrays);
  auto args = [&](int sms) { return arguments<G>(g, o, arrays, sms); };
  return run<G>(check<G>(g, o), args, workspace, workspace_bytes, stream, error, [&] {
    fill_grouped_arguments<G><<<fill_blocks(g.shape.experts_per_rank), kFillThreads, 0, stream>>>(
        g.shape, g.schedule, g.kind, g.periods, g.window, o, arrays);
  });
}

// The unit's instantiation as the launcher's table entry.
template <class G>
const GroupedGemmInstance& instance(const char* name) {
  static const GroupedGemmInstance entry{name,      G::kAKMajor, G::kBKMajor, &argument_bytes<G>, &workspace_bytes<G>,
                                         &launch<G>};
  return entry;
}

}  // namespace mok::cuda::grouped
