// The cuda executor (mokExecutorCuda): one rank's layer on a GPU, each call enqueued on the caller's stream and never
// waited for. The schedule is built on the device (layer_steps.cu), the inputs staged into the own peer buffer with
// copies on the stream, and each pass is the split executor's (split_device.hpp: core's plan as kernels and grouped
// GEMMs). The host never reads what the device computed, so a call's status is that of its enqueueing; a kernel's
// fault shows on the stream (CUDA's sticky error), and mokLayerGetError reads the host-mapped record.
//
// Its buffers are the caller's: the workspace holds core's layout, then the split executor's own
// (core/split_workspace.hpp); the peer buffer is core's. Only the grouped GEMMs' CUTLASS workspace, whose size
// depends on the device, and the mapped error record are allocated here, once, at creation. So a pass allocates
// nothing and synchronises nothing: it is meant to be capturable in a CUDA graph (not yet tried).
//
// A group of several ranks meets at barriers that are kernels of one thread on each rank's stream (layer_steps.cu:
// core::stream_barrier over the peers' headers, its epoch in the workspace), so no call waits on the host: the two of
// the schedule build, a pass's entry barrier after its staging and its closing barrier before the home sums. The
// peers' buffers are the caller's device pointers (one process's GPUs with peer access, CUDA IPC, symmetric memory).
//
// What it runs: BF16 and MXFP8 on compute capability 10.x or 9.0 as built (MXFP8's forward and dgrad_h block-scaled on
// 10.x, every other MXFP8 GEMM over dequantised operands: core/split_dequantise.hpp); expert biases in their own steps
// (core/split_bias.hpp); H, I and I_s multiples of 8 (H and I of 32 in MXFP8).
// The fused executor (mokExecutorSm100) is this layer with another pass: core's whole pass as one persistent kernel
// (fused_pass.hpp) over the same peer buffer, on compute capability 10.x. Its workspace is laid out for that pass
// (core::PassForm::fused): core's buffers without the host's GEMM scratch, and of the split executor's only the
// device's tables; it allocates no CUTLASS workspace.
// Nothing of it has run on a GPU (docs/gpu.md).
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <initializer_list>
#include <new>
#include <vector>

#include "api/build_config.hpp"
#include "api/error.hpp"
#include "api/error_record.hpp"
#include "api/executor.hpp"
#include "api/layer_checks.hpp"
#include "core/pass_worker.hpp"
#include "core/split_workspace.hpp"
#include "cuda/driver.hpp"
#if MOK_WITH_FUSED
#include "cuda/fused_pass.hpp"
#endif
#include "cuda/mapped_record.hpp"
#include "cuda/runtime.hpp"
#include "cuda/split_device.hpp"
#include "host/layer.hpp"
#include "host/random.hpp"

#if MOK_WITH_GROUPED_GEMM  // the pass's GEMMs: without CUTLASS's headers the executor is not compiled (executor.cpp)
namespace mok::api {
namespace {

using core::bf16_t;
using core::PassKind;

// The layers this executor runs (core::split_supports; the fused executor the same, for the tensor-core tiles it is to
// take from CUTLASS), each rule worded with its field.
mokStatus_t check_shape(const core::LayerShape& s, mokExecutor_t executor, const char* func) {
  const char* name = executor == mokExecutorSm100 ? "mokExecutorSm100" : "mokExecutorCuda";
  const int routed = core::split_width_multiple(s);
  const struct {
    const char* name;
    int value;
    int multiple;
  } widths[] = {{"config.hidden", s.hidden, routed},
                {"config.intermediate", s.intermediate, routed},
                {"config.shared_intermediate", s.shared_intermediate, 8}};  // bf16 in both precisions
  for (const auto& w : widths)
    if (w.value % w.multiple != 0)
      return fail(mokUnsupported, "%s: argument '%s' (%d) must be a multiple of %d with %s%s", func, w.name, w.value,
                  w.multiple, name,
                  w.multiple == 8 ? ": its grouped GEMMs read rows of 16 bytes (TMA)"
                                  : " and MXFP8 precision: its block-scaled GEMMs take whole 32-code scale blocks");
  if (s.mxfp8 && s.expert_padding % core::kMxScaleRowTile != 0)
    return fail(mokUnsupported,
                "%s: argument 'config.expert_padding' (%d) must be a multiple of %d with %s and MXFP8 "
                "precision: every expert's rows start a %d-row tile of the block-scaled GEMM's scales",
                func, s.expert_padding, core::kMxScaleRowTile, name, core::kMxScaleRowTile);
  return core::split_supports(s) ? mokSuccess : fail(mokInternalError, "%s: split_supports refused", func);
}

const char* memory_kind(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered: return "unregistered host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory of another device";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "unknown memory";
}

// `pointer` (null: not given, api/ checked which may be) is memory a kernel on `device` reads and writes: its device
// memory, or managed memory.
mokStatus_t check_on_device(const void* pointer, const char* name, int device, const char* func) {
  if (pointer == nullptr) return mokSuccess;
  cudaPointerAttributes a{};
  if (cudaError_t e = cudaPointerGetAttributes(&a, pointer); e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return fail(mokCudaError, "%s: cudaPointerGetAttributes of argument '%s' (%p): %s (%s)", func, name, pointer,
                cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == device)) return mokSuccess;
  return fail(mokInvalidArgument,
              "%s: argument '%s' (%p) must be device memory of device %d (mokExecutorCuda's kernels read and write "
              "it): it is %s",
              func, name, pointer, device, memory_kind(a.type));
}

// What the driver says of the current context's access to `pointer` as it is mapped now
// (CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, a CUDA_POINTER_ATTRIBUTE_ACCESS_FLAGS value): read-write is what a peer's
// buffer that a library mapped into this process with access granted has (an NCCL window's peer mapping, PyTorch
// symmetric memory, an imported IPC handle), whichever GPU holds it, seen by this process or not.
enum class Access { read_write, less, unknown };

Access mapped_access(const void* pointer) {
  static cuda::DriverApi driver;
  static const bool loaded = [] {
    cuda::load_driver_api(&driver);
    return driver.cuPointerGetAttribute != nullptr;
  }();
  uint64_t flags = 0;  // room to spare: the attribute's value is a 4-byte enum, read from the low bytes
  if (!loaded || driver.cuPointerGetAttribute(&flags, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS,
                                              reinterpret_cast<CUdeviceptr>(pointer)) != CUDA_SUCCESS)
    return Access::unknown;
  return static_cast<uint32_t>(flags) == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE ? Access::read_write : Access::less;
}

// Peer q's buffer: device memory of this device, or managed memory; device memory of another GPU of the process that
// this device reaches (peer access, enabled here once per pair and process; CUDA keeps it for the context's life),
// unless the driver then says this device may not write it (a cuMemCreate allocation without cuMemSetAccess); else
// memory of any GPU the driver says this context maps read-write. Never host memory.
mokStatus_t check_peer(const void* pointer, int q, int device, const char* func) {
  char name[32];
  std::snprintf(name, sizeof(name), "memory.peer_bases[%d]", q);
  cudaPointerAttributes a{};
  if (cudaError_t e = cudaPointerGetAttributes(&a, pointer); e != cudaSuccess) {
    cudaGetLastError();
    if (mapped_access(pointer) == Access::read_write) return mokSuccess;
    return fail(mokCudaError, "%s: cudaPointerGetAttributes of argument '%s' (%p): %s (%s)", func, name, pointer,
                cudaGetErrorString(e), cudaGetErrorName(e));
  }
  bool other_gpu = a.type == cudaMemoryTypeDevice && a.device != device;
  if (!other_gpu) {
    if (a.type == cudaMemoryTypeUnregistered && mapped_access(pointer) == Access::read_write) return mokSuccess;
    return check_on_device(pointer, name, device, func);
  }
  int reaches = 0;
  cudaError_t e = cudaDeviceCanAccessPeer(&reaches, device, a.device);
  if (e == cudaSuccess && reaches) e = cudaDeviceEnablePeerAccess(a.device, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) e = cudaSuccess;
  cudaGetLastError();  // not sticky: clear what the calls above left
  Access access = mapped_access(pointer);
  if (access == Access::read_write || (e == cudaSuccess && reaches && access == Access::unknown)) return mokSuccess;
  if (e != cudaSuccess)
    return fail(mokCudaError, "%s: enabling the layer's device %d's access to device %d (argument '%s'): %s (%s)", func,
                device, a.device, name, cudaGetErrorString(e), cudaGetErrorName(e));
  return fail(mokUnsupported,
              "%s: argument '%s' (%p) is device memory of device %d, which the layer's device %d cannot %s: "
              "mokExecutorCuda's kernels read and write every peer's buffer",
              func, name, pointer, a.device, device,
              reaches ? "write (the driver's access flags: an allocation without cuMemSetAccess for it)"
                      : "access (cudaDeviceCanAccessPeer, and no read-write mapping in this context)");
}

// A caller's tensor as this executor takes it: null (not given; api/ checked which may be), or device memory
// aligned to `align` bytes. `refused`: why this executor refuses the tensor when given (what it does not compute).
struct Tensor {
  const void* pointer;
  const char* name;
  size_t align = 1;
  const char* refused = nullptr;
};

// The grouped GEMMs' operands start on 16 bytes (TMA; the launcher would refuse them mid-pass).
constexpr size_t kGemmOperandAlign = 16;
// The workspace holds the GEMMs' argument block 128 bytes aligned, at an offset from a base on this (cudaMalloc's).
constexpr size_t kWorkspaceAlign = 256;

mokStatus_t check_tensors(std::initializer_list<Tensor> tensors, int device, const char* func) {
  for (const Tensor& t : tensors) {
    if (t.pointer == nullptr) continue;
    if (t.refused)
      return fail(mokUnsupported, "%s: argument '%s' must be NULL with mokExecutorCuda: %s", func, t.name, t.refused);
    if (mokStatus_t s = check_on_device(t.pointer, t.name, device, func); s != mokSuccess) return s;
    if (reinterpret_cast<uintptr_t>(t.pointer) % t.align != 0)
      return fail(mokInvalidArgument,
                  "%s: argument '%s' (%p) must be %zu-byte aligned with mokExecutorCuda (its grouped GEMMs' TMA loads "
                  "and argument block)",
                  func, t.name, t.pointer, t.align);
  }
  return mokSuccess;
}

// The layer's device is current for the scope of a call, and the caller's again after it.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) cudaSetDevice(device);
  }
  ~OnDevice() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = -1;
};

mokStatus_t cuda_failed(const char* func, const char* what, cudaError_t e) {
  return fail(e == cudaErrorMemoryAllocation ? mokOutOfMemory : mokCudaError, "%s: %s: %s (%s)", func, what,
              cudaGetErrorString(e), cudaGetErrorName(e));
}

// An enqueue_split_pass that stopped, worded: its launch in the plan and why.
mokStatus_t pass_failed(const char* func, const cuda::SplitFailure& f) {
  if (f.refusal == cuda::SplitRefusal::cuda_error && f.launch < 0)
    return fail(mokCudaError, "%s: the split pass's entry barrier: %s (%s)", func, cudaGetErrorString(f.error),
                cudaGetErrorName(f.error));
  if (f.refusal == cuda::SplitRefusal::gemm_refused && f.launch < 0)
    return fail(mokUnsupported, "%s: this libmok carries no grouped GEMM for the layer's device (built for %s)", func,
                api::kCudaArchitectures);
  if (f.refusal == cuda::SplitRefusal::cuda_error)
    return fail(mokCudaError, "%s: launch %lld of the split pass (%s): %s (%s)", func, static_cast<long long>(f.launch),
                core::split_step_name(f.step), cudaGetErrorString(f.error), cudaGetErrorName(f.error));
  const char* why = f.refusal == cuda::SplitRefusal::gemm_refused
                        ? cuda::gemm_status_name(static_cast<cuda::GemmStatus>(f.gemm_status))
                        : cuda::split_refusal_name(f.refusal);
  const char* no = f.missing ? ": no " : "";
  const char* missing = f.missing ? f.missing : "";
  if (f.launch < 0)  // refused before its first launch
    return fail(mokInternalError, "%s: the split pass refused to start: %s%s%s", func, why, no, missing);
  return fail(mokInternalError, "%s: the split pass refused launch %lld (%s): %s%s%s", func,
              static_cast<long long>(f.launch), core::split_step_name(f.step), why, no, missing);
}

class CudaLayer final : public LayerExecutor {
 public:
  CudaLayer(const core::LayerShape& shape, uint64_t timeout_ns, int device, char* workspace, void* const* peers,
            mokExecutor_t executor)
      : executor_(executor),
        s_(shape),
        timeout_ns_(timeout_ns),
        device_(device),
        workspace_(workspace),
        layout_(core::split_layout(shape, cuda::split_gemm_argument_bytes(shape))),
        buffers_(core::split_buffers_at(shape, layout_, workspace + core::split_extras_offset(shape))) {
    for (int r = 0; r < shape.world; ++r) peers_.push_back(static_cast<char*>(peers[r]));
  }
  ~CudaLayer() override {
    OnDevice on(device_);
    if (gemm_workspace_) cudaFree(gemm_workspace_);  // waits for the device's work: a destroyed layer is idle
    if (side_) cudaStreamDestroy(side_);
    cuda::destroy_mapped_record(&record_);
  }
  CudaLayer(const CudaLayer&) = delete;
  CudaLayer& operator=(const CudaLayer&) = delete;

  // The grouped GEMMs' CUTLASS workspace, which the split pass's launches share.
  mokStatus_t allocate_gemm_workspace(const char* func) {
    cudaError_t error = cudaSuccess;
    if (cuda::GemmStatus st = cuda::split_gemm_workspace_bytes(s_, architecture_, &gemm_workspace_bytes_, &error);
        st != cuda::GemmStatus::ok)
      return error != cudaSuccess ? cuda_failed(func, "sizing the grouped GEMMs' workspace", error)
                                  : fail(mokInternalError, "%s: sizing the grouped GEMMs' workspace: %s", func,
                                         cuda::gemm_status_name(st));
    if (gemm_workspace_bytes_ > 0)
      if (cudaError_t e = cudaMalloc(&gemm_workspace_, gemm_workspace_bytes_); e != cudaSuccess)
        return cuda_failed(func, "allocating the grouped GEMMs' workspace", e);
    return mokSuccess;
  }

  // The device's tables, the header and the sigmoid table written, the record (and for the split pass the CUTLASS
  // workspace) allocated.
  mokStatus_t set_up(const char* func) {
    OnDevice on(device_);
    if (cudaError_t e = cuda::create_mapped_record(&record_); e != cudaSuccess)
      return cuda_failed(func, "allocating the host-mapped error record", e);
    if (mokStatus_t s = read_architecture(func); s != mokSuccess) return s;
    // The fused pass needs its CTAs resident together, and runs no grouped GEMM.
    if (mokStatus_t s = fused() ? set_up_fused(func) : allocate_gemm_workspace(func); s != mokSuccess) return s;
    if (s_.world > 1)  // where mokLayerAbort and a refused call tell the peers, whatever the caller's streams hold
      if (cudaError_t e = cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking); e != cudaSuccess)
        return cuda_failed(func, "creating the stream that tells the peers of an abort", e);
    // The own header reset with a fresh incarnation (core::reset_header): peers trust it once they see it acknowledged.
    core::PeerHeader header{};
    int32_t group_shape[core::kGroupShapeFields];
    core::group_shape(s_, group_shape);
    core::reset_header(&header, group_shape, host::random_word(static_cast<uint64_t>(s_.rank)));
    std::vector<float> table(core::kSigmoidTableSize);
    core::fill_sigmoid_table(table.data());
    size_t ids_at = core::peer_layout(s_).topk_ids;
    std::vector<core::PeerHeader*> headers;
    std::vector<const int32_t*> ids;
    for (char* base : peers_) {  // device addresses, never read here
      headers.push_back(reinterpret_cast<core::PeerHeader*>(base));
      ids.push_back(reinterpret_cast<const int32_t*>(base + ids_at));
    }
    std::vector<int32_t> tokens(peers_.size(), 0);
    core::GroupState group{};  // not formed, epoch 0
    size_t world = peers_.size();
    struct Upload {
      void* to;
      const void* from;
      size_t bytes;
    } uploads[] = {{own_peer(), &header, sizeof(header)},
                   {buffers_.sigmoid_table, table.data(), table.size() * sizeof(float)},
                   {buffers_.peers, peers_.data(), world * sizeof(char*)},
                   {buffers_.headers, headers.data(), world * sizeof(core::PeerHeader*)},
                   {buffers_.routing_ids, ids.data(), world * sizeof(const int32_t*)},
                   {buffers_.routing_tokens, tokens.data(), world * sizeof(int32_t)},
                   {buffers_.group, &group, sizeof(group)}};
    for (const Upload& u : uploads)
      if (cudaError_t e = cudaMemcpy(u.to, u.from, u.bytes, cudaMemcpyHostToDevice); e != cudaSuccess)
        return cuda_failed(func, "writing the layer's tables into its workspace and peer buffer", e);
    // A copy from pageable memory may return before it lands, and the caller's stream need not wait for the legacy
    // stream's: creation (not a pass) waits for those copies (the legacy stream's work, not the whole device's).
    if (cudaError_t e = cudaStreamSynchronize(cudaStreamLegacy); e != cudaSuccess)
      return cuda_failed(func, "waiting for the layer's tables", e);
    return mokSuccess;
  }

  // The device's GemmArchitecture, once: the units every pass runs (MXFP8's block-scaled GEMMs only on SM100).
  mokStatus_t read_architecture(const char* func) {
    cudaError_t e = cudaSuccess;
    architecture_ = cuda::current_gemm_architecture(&e);
    if (e != cudaSuccess) return cuda_failed(func, "reading the device's compute capability", e);
    if (architecture_ == cuda::GemmArchitecture::none)
      return fail(mokUnsupported, "%s: this libmok carries no grouped GEMM for device %d (built for %s)", func, device_,
                  api::kCudaArchitectures);
    return mokSuccess;
  }

  // The fused pass's CTAs the device keeps resident at once: its workers, every one of which may wait for another, run
  // only on resident CTAs (core::fit_workers runs the pass on fewer where the config names more).
  mokStatus_t read_residency(const char* func) {
#if MOK_WITH_FUSED
    if (cudaError_t e = cuda::fused_residency(s_.mxfp8 != 0, &resident_); e != cudaSuccess)
      return cuda_failed(func, "reading the fused pass kernel's occupancy", e);
#endif
    if (resident_ < 2)
      return fail(mokUnsupported,
                  "%s: device %d keeps %d CTAs of the fused pass kernel resident at once; its pass needs 2 (a comm and "
                  "a compute worker)",
                  func, device_, resident_);
    return mokSuccess;
  }

  // The fused pass's CTAs resident together (read_residency), and the tensor maps of its TMA loads, each worker's set
  // to the template its tiles fill in.
  mokStatus_t set_up_fused(const char* func) {
    if (mokStatus_t s = read_residency(func); s != mokSuccess) return s;
#if MOK_WITH_FUSED
    CUresult encoded = CUDA_SUCCESS;
    int maps = (s_.comm_workers + s_.compute_workers) * core::kPanelMaps;
    if (cudaError_t e = cuda::write_panel_maps(buffers_.panel_maps, maps, &encoded); e != cudaSuccess)
      return encoded != CUDA_SUCCESS ? fail(mokCudaError,
                                            "%s: the driver's cuTensorMapEncodeTiled refused the panels' template map "
                                            "(CUresult %d)",
                                            func, static_cast<int>(encoded))
                                     : cuda_failed(func, "writing the panels' tensor maps", e);
#endif
    return mokSuccess;
  }

  const core::LayerShape& shape() const override { return s_; }
  bool host_tensors() const override { return false; }
  int tokens() const override { return tokens_; }
  // Any stream of the layer's device; NULL is that device's legacy default stream.
  mokStatus_t check_stream(void* stream, const char* func) const override {
    if (stream == nullptr) return mokSuccess;
    int device = -1;
    if (cudaError_t e = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device); e != cudaSuccess) {
      cudaGetLastError();
      return fail(mokInvalidArgument, "%s: argument 'stream' (%p) must be a CUDA stream: %s (%s)", func, stream,
                  cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (device == device_) return mokSuccess;
    return fail(mokInvalidArgument, "%s: argument 'stream' (%p) is a stream of device %d; the layer's is device %d",
                func, stream, device, device_);
  }
  void begin_pass(uint64_t pass) override { calls_.begin(pass, failed()); }
  void drop_schedule() override { has_schedule_ = has_context_ = ring_kept_ = false; }

  mokStatus_t build_schedule(const void* topk_ids, bool int64_ids, int tokens, void* stream) override {
    const char* func = "mokLayerBuildSchedule";
    OnDevice on(device_);
    if (mokStatus_t s = refuse_order(func, core::CallKind::build_schedule); s != mokSuccess) return refused(s);
    if (mokStatus_t s = check_tensors({{topk_ids, "topk_ids"}}, device_, func); s != mokSuccess) return refused(s);
    core::PassView v = view(PassKind::forward);
    core::Routing routing{buffers_.routing_ids, buffers_.routing_tokens};
    if (cudaError_t e = cuda::launch_rank_schedule(v, topk_ids, int64_ids, tokens, routing, buffers_.routing_tokens,
                                                   static_cast<cudaStream_t>(stream));
        e != cudaSuccess) {
      mokStatus_t s = cuda_failed(func, "launching the schedule build", e);
      if (s_.world > 1) record_cut_short(mokGetLastError());  // the peers wait for it: tell them
      return s;
    }
    tokens_ = tokens;
    has_schedule_ = true;
    return mokSuccess;
  }

  mokStatus_t forward(const mokLayerWeights_t& weights, const uint16_t* x, const float* topk_weights, uint16_t* out,
                      bool with_output, void* stream) override {
    const char* func = with_output ? "mokLayerForward" : "mokLayerRecompute";
    OnDevice on(device_);
    PassKind kind = with_output ? PassKind::forward : PassKind::recompute;
    if (mokStatus_t s = refuse_order(func, core::call_of(kind)); s != mokSuccess) return refused(s);
    if (mokStatus_t s = check_weights_here(weights, func); s != mokSuccess) return refused(s);
    if (mokStatus_t s = check_tensors({{x, "x"}, {topk_weights, "topk_weights"}, {out, "out"}}, device_, func);
        s != mokSuccess)
      return refused(s);
    core::PassArgs args{};
    args.x = reinterpret_cast<const bf16_t*>(x);
    args.topk_weights = topk_weights;
    if (fused()) {
      args.out = reinterpret_cast<bf16_t*>(out);
      has_context_ = ring_kept_ = false;
      if (mokStatus_t s = stage(view(kind), args, stream, func); s != mokSuccess) return s;
      if (mokStatus_t s = enqueue_fused(kind, weights, args, stream, func); s != mokSuccess) return s;
      has_context_ = true;
      ring_kept_ = core::max_recv_rows(s_) <= s_.macrobatch;  // every routing's rows in one ring turn
      return mokSuccess;
    }
    cuda::SplitDevice d = split_device(kind, weights, stream);
    d.topk_weights = topk_weights;
    d.out = reinterpret_cast<bf16_t*>(out);
    has_context_ = ring_kept_ = false;
    if (mokStatus_t s = stage(d.view, args, stream, func); s != mokSuccess) return s;
    if (mokStatus_t s = enqueue(d, func); s != mokSuccess) return s;
    has_context_ = true;
    ring_kept_ = core::split_keeps_ring(s_, core::ring_periods(s_));  // every routing's rows in one ring turn
    return mokSuccess;
  }

  mokStatus_t backward(const mokLayerWeights_t& weights, const float* topk_weights, const uint16_t* dout,
                       const mokLayerGrads_t& grads, void* stream) override {
    const char* func = "mokLayerBackward";
    OnDevice on(device_);
    if (mokStatus_t s = refuse_order(func, core::CallKind::backward); s != mokSuccess) return refused(s);
    if (mokStatus_t s = check_weights_here(weights, func); s != mokSuccess) return refused(s);
    if (mokStatus_t s = check_grads_here(grads, func); s != mokSuccess) return refused(s);
    if (mokStatus_t s = check_tensors({{topk_weights, "topk_weights"}, {dout, "dout"}}, device_, func); s != mokSuccess)
      return refused(s);
    core::PassArgs args{};
    args.dout = reinterpret_cast<const bf16_t*>(dout);
    args.topk_weights = topk_weights;
    if (fused()) return fused_backward(weights, args, grads, stream, func);
    // The forward's g and u are read where they are when the ring still holds them; the backward overwrites them,
    // so a second backward of the same context recomputes them.
    cuda::SplitDevice d = split_device(ring_kept_ ? PassKind::backward_kept : PassKind::backward, weights, stream);
    ring_kept_ = false;
    float* main_grad[core::kGradientSums] = {
        static_cast<float*>(grads.dgate),         static_cast<float*>(grads.dup),
        static_cast<float*>(grads.ddown),         static_cast<float*>(grads.dshared_gate),
        static_cast<float*>(grads.dshared_up),    static_cast<float*>(grads.dshared_down),
        static_cast<float*>(grads.dshared_router)};
    bool bf16_gradients = grads.accumulate == 0;
    d.targets = core::split_targets(buffers_, main_grad, bf16_gradients);
    if (bf16_gradients)
      d.gradients = core::SplitGradients{static_cast<bf16_t*>(grads.dgate),
                                         static_cast<bf16_t*>(grads.dup),
                                         static_cast<bf16_t*>(grads.ddown),
                                         static_cast<bf16_t*>(grads.dshared_gate),
                                         static_cast<bf16_t*>(grads.dshared_up),
                                         static_cast<bf16_t*>(grads.dshared_down),
                                         static_cast<bf16_t*>(grads.dshared_router),
                                         nullptr,
                                         nullptr,
                                         nullptr,
                                         false};
    d.gradients.gate_bias = grads.dgate_bias, d.gradients.up_bias = grads.dup_bias;
    d.gradients.down_bias = grads.ddown_bias, d.gradients.bias_accumulate = !bf16_gradients;
    d.dout = args.dout;
    d.dx = static_cast<bf16_t*>(grads.dx);
    d.dw = grads.dtopk_weights;
    if (mokStatus_t s = stage(d.view, args, stream, func); s != mokSuccess) return s;
    return enqueue(d, func);
  }

  // The fused pass writes every gradient itself, as the host executor's does: bf16, or added into fp32 main_grad.
  mokStatus_t fused_backward(const mokLayerWeights_t& weights, core::PassArgs args, const mokLayerGrads_t& grads,
                             void* stream, const char* func) {
    args.dx = static_cast<bf16_t*>(grads.dx);
    args.dtopk_weights = grads.dtopk_weights;
    args.dgate = grads.dgate, args.dup = grads.dup, args.ddown = grads.ddown;
    args.dshared_gate = grads.dshared_gate, args.dshared_up = grads.dshared_up;
    args.dshared_down = grads.dshared_down, args.dshared_router = grads.dshared_router;
    args.dgate_bias = grads.dgate_bias, args.dup_bias = grads.dup_bias, args.ddown_bias = grads.ddown_bias;
    args.accumulate = grads.accumulate;
    PassKind kind = ring_kept_ ? PassKind::backward_kept : PassKind::backward;
    ring_kept_ = false;
    if (mokStatus_t s = stage(view(kind), args, stream, func); s != mokSuccess) return s;
    return enqueue_fused(kind, weights, args, stream, func);
  }

  mokStatus_t get_slots(uint16_t* y_slots, void* stream) override {
    const char* func = "mokLayerGetSlots";
    OnDevice on(device_);
    if (!has_context_) return fail(mokInvalidUsage, "%s: %s", func, core::order_rule(core::Refusal::needs_context));
    if (mokStatus_t s = check_tensors({{y_slots, "y_slots"}}, device_, func); s != mokSuccess) return s;
    if (cudaError_t e = cuda::launch_copy_slots(view(PassKind::forward), reinterpret_cast<bf16_t*>(y_slots),
                                                static_cast<cudaStream_t>(stream));
        e != cudaSuccess)
      return cuda_failed(func, "launching the slot copy", e);
    return mokSuccess;
  }

  mokStatus_t restore_context(const uint16_t* x, const uint16_t* y_slots, void* stream) override {
    const char* func = "mokLayerRestoreContext";
    OnDevice on(device_);
    if (!has_schedule_)
      return fail(mokInvalidUsage,
                  "%s: needs a mokLayerBuildSchedule (with the topk_ids of the forward the context came from)", func);
    if (mokStatus_t s = check_tensors({{x, "x"}, {y_slots, "y_slots"}}, device_, func); s != mokSuccess) return s;
    core::StageCopy copies[core::kMaxStageCopies];
    int n = core::context_copies(view(PassKind::forward), x, y_slots, copies);
    if (mokStatus_t s = copy_in(copies, n, stream, func); s != mokSuccess) return s;
    has_context_ = true;
    ring_kept_ = false;  // the ring holds another pass's rows: the backward recomputes g and u from x
    return mokSuccess;
  }

  // A refused collective call reaches the group, as the host executor's does: recorded, and the peers told (they fail
  // their next barrier with this reason), unless the group has one rank (whose context stays usable) or is aborting
  // already (the first reason stands). Nothing of the call was enqueued.
  void reject(mokStatus_t status, const char* detail) override {
    if (s_.world == 1 || failed()) return;
    char text[sizeof(core::ErrorRecord::detail)];
    bool order = status == mokInvalidUsage;
    int n = std::snprintf(text, sizeof(text), "rank %d rejected its %s: ", s_.rank, order ? "call" : "arguments");
    host::copy_text(text + n, sizeof(text) - n, detail);
    core::Outcome outcome = order ? core::Outcome::rejected_order : core::Outcome::rejected_arguments;
    core::record_failure(record_.host, core::Failure{outcome, core::WaitId::rejected_call}, s_.rank, -1, -1, text);
    leave();
  }

  void abort(const char* reason) override {
    char text[sizeof(core::ErrorRecord::detail)];
    int n = std::snprintf(text, sizeof(text), "rank %d aborted the group: ", s_.rank);
    host::copy_text(text + n, sizeof(text) - n, reason);
    core::record_failure(record_.host, core::Failure{core::Outcome::peer_abort, core::WaitId::none}, s_.rank, -1, -1,
                         text);
    aborted_.store(true);
    calls_.settle(failed());
    leave();
  }

  // A failure the device records is numbered with the call that first sees it (a call's start, mokLayerGetError):
  // the host does not wait for the device, so that may be a later call than the one whose kernel recorded it.
  void error(mokLayerError_t* out) override {
    calls_.settle(failed());
    core::ErrorRecord rec{};
    if (!cuda::read_mapped_record(record_, &rec)) {
      out->pass = calls_.current();  // no failure: the calls made so far
      return;
    }
    record_fields(rec, out);
    const char* wait = rec.wait != 0 ? core::wait_name(static_cast<core::WaitId>(rec.wait))
                                     : (aborted_.load() ? "aborted by mokLayerAbort" : "");
    std::snprintf(out->wait, sizeof(out->wait), "%s", wait);
    std::snprintf(out->detail, sizeof(out->detail), "%s", rec.detail);
    out->pass = calls_.failed();
    // On purpose: this rank's mokLayerAbort or refused call (on the device: the ids), or the peer a barrier found to
    // have left with a reason (core::stamped_peer; -1 where it left none: a timeout or a call cut short there).
    if (core::on_purpose(rec.outcome, rec.wait))
      out->abort_rank = rec.rank;
    else
      out->abort_rank = rec.outcome == static_cast<int32_t>(core::Outcome::peer_abort) ? rec.peer : -1;
  }

 private:
  // Core's view of this rank's device memory; the caller's tensors are the SplitDevice's, never the view's args.
  core::PassView view(PassKind kind) const {
    core::PassView v = core::pass_view_at(s_, kind, workspace_, buffers_.peers, buffers_.headers, buffers_.group,
                                          tokens_, 0, timeout_ns_, record_.device);
    v.sigmoid_table = buffers_.sigmoid_table;
    return v;
  }

  cuda::SplitDevice split_device(PassKind kind, const mokLayerWeights_t& weights, void* stream) const {
    cuda::SplitDevice d{};
    d.view = view(kind);
    d.host_peers = peers_.data();
    d.view.w = host::weights_in_place(weights);
    d.targets.dx_partial = buffers_.dx_partial;
    d.targets.biased = buffers_.biased;
    d.shared = buffers_.shared;
    d.staging = buffers_.staging;
    d.staging_values = layout_.staging_values;
    d.dequantised = buffers_.dequantised;
    d.ctas = static_cast<int>(layout_.ctas);
    d.architecture = static_cast<int>(architecture_);
    d.gemm_arguments = buffers_.gemm_arguments;
    d.gemm_workspace = gemm_workspace_;
    d.gemm_workspace_bytes = gemm_workspace_bytes_;
    d.stream = static_cast<cudaStream_t>(stream);
    return d;
  }

  // The call's inputs that the pass reads from the own peer buffer, copied there on the stream.
  mokStatus_t stage(core::PassView v, const core::PassArgs& args, void* stream, const char* func) {
    v.args = &args;
    core::StageCopy copies[core::kMaxStageCopies];
    return copy_in(copies, core::stage_copies(v, copies), stream, func);
  }

  mokStatus_t copy_in(const core::StageCopy* copies, int n, void* stream, const char* func) {
    for (int i = 0; i < n; ++i) {
      if (copies[i].bytes == 0) continue;
      cudaError_t e = cudaMemcpyAsync(own_peer() + copies[i].offset, copies[i].src, copies[i].bytes,
                                      cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream));
      if (e == cudaSuccess) continue;
      mokStatus_t s = cuda_failed(func, "staging the call's inputs into the peer buffer", e);
      if (i > 0) record_cut_short(mokGetLastError());
      return s;
    }
    return mokSuccess;
  }

  // A pass cut short after its first enqueued work (its staging copies, launches before the one that failed) left
  // the layer's memory half-written: recorded, so that mokLayerGetError says so and every later call is refused.
  mokStatus_t enqueue(const cuda::SplitDevice& d, const char* func) {
    cuda::SplitFailure f;
    if (cuda::enqueue_split_pass(d, &f)) return mokSuccess;
    mokStatus_t s = pass_failed(func, f);
    record_cut_short(mokGetLastError());
    return s;
  }

  // The fused pass enqueued (its staging is): a launch that fails leaves the layer's memory half-written (recorded).
  mokStatus_t enqueue_fused(PassKind kind, const mokLayerWeights_t& weights, const core::PassArgs& args, void* stream,
                            const char* func) {
    cudaError_t e = cudaErrorNotSupported;  // a build without the fused kernel creates no fused layer
#if MOK_WITH_FUSED
    cuda::FusedDevice d{
        view(kind), args, buffers_.fused_graph, resident_, buffers_.panel_maps, static_cast<cudaStream_t>(stream)};
    d.view.w = host::weights_in_place(weights);
    e = cuda::enqueue_fused_pass(d);
#else
    (void)kind, (void)weights, (void)args, (void)stream;
#endif
    if (e == cudaSuccess) return mokSuccess;
    mokStatus_t s = cuda_failed(func, "launching the fused pass", e);
    record_cut_short(mokGetLastError());
    return s;
  }

  void record_cut_short(const char* why) {
    core::record_failure(record_.host, core::Failure{core::Outcome::launch_failed, core::WaitId::none}, s_.rank, -1, -1,
                         why);
    leave();
  }

  // A group's peers told that this rank is out (its record says why), on the layer's own stream: they fail their
  // barriers at once instead of waiting out the timeout. Nothing to tell in a group of one; a launch that fails
  // here leaves the peers to their timeouts.
  // Any thread may call it (mokLayerAbort): the layer's device made current, no call's state read.
  void leave() {
    if (!side_) return;
    OnDevice on(device_);
    core::PassView v = view(PassKind::forward);
    v.tokens = 0;
    if (cuda::launch_leave_group(v, side_) != cudaSuccess) cudaGetLastError();
  }

  // A refusal of this executor's own checks, told to the group as api/'s are (reject).
  mokStatus_t refused(mokStatus_t status) {
    reject(status, mokGetLastError());
    return status;
  }

  // A call in the wrong order, or after a failure the record holds (an abort, ids the schedule build refused):
  // refused, as the host executor refuses a call after its group was aborted.
  mokStatus_t refuse_order(const char* func, core::CallKind call) const {
    core::ErrorRecord rec{};
    if (cuda::read_mapped_record(record_, &rec))
      return fail(host::status_for(rec), "%s: an earlier call failed (%s); create a new context", func, rec.detail);
    core::Refusal order = core::order_refusal(call, has_schedule_, has_context_);
    return order == core::Refusal::none ? mokSuccess : fail(mokInvalidUsage, "%s: %s", func, core::order_rule(order));
  }

  // The weights the pass reads, on the device (the expert biases too: their own steps add them). In MXFP8 the rowwise
  // codes and scales and down's colwise ones, which the block-scaled GEMMs (the forward's, dgrad_h) load with TMA on
  // 10.x (mokMxfp8Quantize writes host memory: the caller copies them over), and the other colwise ones, which only
  // the dequantise steps read. The same rule on 9.0, where dequantise steps read them all.
  mokStatus_t check_weights_here(const mokLayerWeights_t& w, const char* func) const {
    const size_t gemm = kGemmOperandAlign;
    if (s_.mxfp8)
      if (mokStatus_t s = check_tensors({{w.gate_rowwise.data, "weights.gate_rowwise.data", gemm},
                                         {w.gate_rowwise.scales, "weights.gate_rowwise.scales", gemm},
                                         {w.up_rowwise.data, "weights.up_rowwise.data", gemm},
                                         {w.up_rowwise.scales, "weights.up_rowwise.scales", gemm},
                                         {w.down_rowwise.data, "weights.down_rowwise.data", gemm},
                                         {w.down_rowwise.scales, "weights.down_rowwise.scales", gemm},
                                         {w.gate_colwise.data, "weights.gate_colwise.data"},
                                         {w.gate_colwise.scales, "weights.gate_colwise.scales"},
                                         {w.up_colwise.data, "weights.up_colwise.data"},
                                         {w.up_colwise.scales, "weights.up_colwise.scales"},
                                         {w.down_colwise.data, "weights.down_colwise.data", gemm},
                                         {w.down_colwise.scales, "weights.down_colwise.scales", gemm}},
                                        device_, func);
          s != mokSuccess)
        return s;
    return check_tensors({{w.gate_bias, "weights.gate_bias"},
                          {w.up_bias, "weights.up_bias"},
                          {w.down_bias, "weights.down_bias"},
                          {w.gate, "weights.gate", gemm},
                          {w.up, "weights.up", gemm},
                          {w.down, "weights.down", gemm},
                          {w.shared_gate, "weights.shared_gate", gemm},
                          {w.shared_up, "weights.shared_up", gemm},
                          {w.shared_down, "weights.shared_down", gemm},
                          {w.shared_router, "weights.shared_router"}},
                         device_, func);
  }

  // fp32 main_grad is the weight-gradient GEMMs' C and D; bf16 gradients are written by a thread per element.
  mokStatus_t check_grads_here(const mokLayerGrads_t& g, const char* func) const {
    const size_t sums = g.accumulate ? kGemmOperandAlign : 1;
    return check_tensors({{g.dgate_bias, "grads.dgate_bias"},
                          {g.dup_bias, "grads.dup_bias"},
                          {g.ddown_bias, "grads.ddown_bias"},
                          {g.dx, "grads.dx"},
                          {g.dtopk_weights, "grads.dtopk_weights"},
                          {g.dgate, "grads.dgate", sums},
                          {g.dup, "grads.dup", sums},
                          {g.ddown, "grads.ddown", sums},
                          {g.dshared_gate, "grads.dshared_gate", sums},
                          {g.dshared_up, "grads.dshared_up", sums},
                          {g.dshared_down, "grads.dshared_down", sums},
                          {g.dshared_router, "grads.dshared_router"}},
                         device_, func);
  }

  bool failed() const {
    core::ErrorRecord rec{};
    return cuda::read_mapped_record(record_, &rec);
  }

  char* own_peer() const { return peers_[static_cast<size_t>(s_.rank)]; }
  bool fused() const { return executor_ == mokExecutorSm100; }

  mokExecutor_t executor_;  // mokExecutorCuda (the split pass) or mokExecutorSm100 (the fused pass)
  core::LayerShape s_;
  uint64_t timeout_ns_;  // the bound of each barrier's wait (config.timeout_ms)
  int device_;
  char* workspace_;
  std::vector<char*> peers_;  // every rank's peer buffer: the device's peer table (buffers_.peers) as the host reads it
  cudaStream_t side_ = nullptr;  // a group's: where leave_group runs
  core::SplitLayout layout_;
  core::SplitBuffers buffers_;
  cuda::MappedRecord record_;
  void* gemm_workspace_ = nullptr;
  size_t gemm_workspace_bytes_ = 0;
  cuda::GemmArchitecture architecture_ = cuda::GemmArchitecture::none;
  int tokens_ = 0;
  int resident_ = 0;  // the fused pass's: CTAs the device keeps resident (read_residency)
  bool has_schedule_ = false, has_context_ = false, ring_kept_ = false;
  std::atomic<bool> aborted_{false};
  CallNumbers calls_;
};

// The current device (device 0 where CUDA cannot say: no GPU or driver), if this executor runs on it, as
// mokExecutorSupportsDevice answers: its status is the refusal's.
mokStatus_t current_device(mokExecutor_t executor, const char* func, int* device) {
  if (cudaGetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    *device = 0;
  }
  int supported = 0;
  if (mokStatus_t s = mokExecutorSupportsDevice(executor, *device, &supported); s != mokSuccess) {
    char why[512];
    std::snprintf(why, sizeof(why), "%s", mokGetLastError());  // fail() rewrites the detail it is read from
    return fail(s, "%s: argument 'config.executor' (%s) on the current device (%d): %s", func,
                mokExecutorName(executor), *device, why);
  }
  return mokSuccess;
}

}  // namespace

template <mokExecutor_t executor>
mokStatus_t device_workspace_bytes(const core::LayerShape& shape, const char* func, size_t* bytes) {
  if (mokStatus_t s = check_shape(shape, executor, func); s != mokSuccess) return s;
  *bytes = core::split_workspace_bytes(shape, cuda::split_gemm_argument_bytes(shape));
  return mokSuccess;
}

template <mokExecutor_t executor>
mokStatus_t create_device_layer(const core::LayerShape& shape, uint64_t timeout_ns, const mokLayerMemory_t& memory,
                                std::unique_ptr<LayerExecutor>* out) {
  const char* func = "mokLayerCreate";  // the shape passed device_workspace_bytes' checks before
  // The workspace is laid out for this executor's pass (core::PassForm).
  if (shape.form != pass_form(executor))
    return fail(mokInternalError, "%s: a shape laid out for another executor's pass", func);
  if (memory.peer_bases == nullptr)
    return fail(mokInvalidArgument,
                "%s: argument 'memory.shm_name' must be NULL with a GPU executor: give 'memory.peer_bases' (device "
                "memory)",
                func);
  int device = -1;
  if (mokStatus_t s = current_device(executor, func, &device); s != mokSuccess) return s;
  if (mokStatus_t s = check_tensors({{memory.workspace, "memory.workspace", kWorkspaceAlign}}, device, func);
      s != mokSuccess)
    return s;
  for (int q = 0; q < shape.world; ++q)
    if (mokStatus_t s = check_peer(memory.peer_bases[q], q, device, func); s != mokSuccess) return s;
  auto layer = std::unique_ptr<CudaLayer>(new (std::nothrow) CudaLayer(
      shape, timeout_ns, device, static_cast<char*>(memory.workspace), memory.peer_bases, executor));
  if (!layer) return fail(mokOutOfMemory, "%s: out of memory", func);
  if (mokStatus_t s = layer->set_up(func); s != mokSuccess) return s;
  *out = std::move(layer);
  return mokSuccess;
}

template mokStatus_t device_workspace_bytes<mokExecutorCuda>(const core::LayerShape&, const char*, size_t*);
template mokStatus_t create_device_layer<mokExecutorCuda>(const core::LayerShape&, uint64_t, const mokLayerMemory_t&,
                                                          std::unique_ptr<LayerExecutor>*);
#if MOK_WITH_FUSED
template mokStatus_t device_workspace_bytes<mokExecutorSm100>(const core::LayerShape&, const char*, size_t*);
template mokStatus_t create_device_layer<mokExecutorSm100>(const core::LayerShape&, uint64_t, const mokLayerMemory_t&,
                                                           std::unique_ptr<LayerExecutor>*);
#endif

}  // namespace mok::api
#endif
