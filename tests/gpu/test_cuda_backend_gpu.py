"""backend="cuda" on a GPU: mok.moe on CUDA tensors through libmok's cuda executor, held to the host executor's result
on CPU copies of the same inputs. Skipped, with libmok's reason, where the cuda executor cannot run (no GPU, a build
without it, a GPU whose grouped GEMMs the build lacks). Never run here: no machine of ours has a GPU."""

from __future__ import annotations

import pytest
import torch

import mok
from mok import functional
from mok.cuda import CudaExecutor, FusedExecutor
from mok.experts import BIAS_NAMES, RoutedExperts, SharedExpert

if not torch.cuda.is_available():
    pytest.skip(f"no CUDA device for PyTorch (torch {torch.__version__}, CUDA {torch.version.cuda or 'none'})",
                allow_module_level=True)
_usable, _reason = CudaExecutor().usable(torch.device("cuda", 0))
if not _usable:
    pytest.skip(f"libmok's cuda executor does not run on cuda:0: {_reason}", allow_module_level=True)

# libmok's kSplitOrderTolerance (core/split_pass.hpp): the GPU's GEMMs sum in another order than the host's, which
# moves a bf16 rounding by one unit where a sum lies that close to a boundary; a wrong row, operand or window is an
# error of order one. Normwise: ||cuda - host|| / ||host||.
TOLERANCE = 1.0 / 128
T, E, K, H, INTER, I_SHARED = 96, 4, 2, 256, 128, 64  # widths multiples of 8 (TMA's 16-byte rows)
NAMES = ["out", "x", "topk_weights", "gate", "up", "down", "shared_gate", "shared_up", "shared_down"]
MAIN_GRADS = [*NAMES[3:], *BIAS_NAMES]  # the fp32 buffers of main_grad_backward, in MainGrads' order


def inputs(seed: int):
    generator = torch.Generator().manual_seed(seed)

    def bf16(*shape, fan_in=1):
        return (torch.randn(*shape, generator=generator) / fan_in ** 0.5).to(torch.bfloat16)

    ids = torch.randint(0, E, (T, K), generator=generator)
    ids = torch.where(torch.rand(T, K, generator=generator) < 0.2, -1, ids)
    weights = torch.rand(T, K, generator=generator) + 0.1
    routed = [bf16(E, INTER, H, fan_in=H), bf16(E, INTER, H, fan_in=H), bf16(E, H, INTER, fan_in=INTER)]
    shared = [bf16(I_SHARED, H, fan_in=H), bf16(I_SHARED, H, fan_in=H), bf16(H, I_SHARED, fan_in=I_SHARED)]
    return [bf16(T, H), ids, weights, *routed, *shared, bf16(T, H)]


def expert_biases(seed: int):
    """gpt-oss's gate, up and down biases, of the order of the GEMMs' outputs (so each moves every output visibly)."""
    generator = torch.Generator().manual_seed(1000 + seed)
    return [(torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16)
            for shape, scale in (((E, INTER), 0.5), ((E, INTER), 0.5), ((E, H), 0.1))]


def layer(tensors, device, backend, mxfp8=False, biases=()):
    """(out, every gradient) of mok.moe on `device` through `backend`, by autograd; in MXFP8 the routed experts
    quantised from the bf16 leaves (their gradients are the bf16 weights'), with `biases` the routed experts'."""
    x, ids, weights, *experts, dout = [t.to(device) for t in tensors]
    leaves = [t.clone().requires_grad_(True) for t in (x, weights, *experts, *[b.to(device) for b in biases])]
    routed = RoutedExperts(*leaves[2:5], **dict(zip(("gate_bias", "up_bias", "down_bias"), leaves[8:], strict=False)))
    routed, shared = routed.to_mxfp8() if mxfp8 else routed, SharedExpert(*leaves[5:8])
    out = mok.moe(leaves[0], ids, leaves[1], routed, shared, backend=backend)
    out.backward(dout)
    return [out.detach().cpu().float()] + [leaf.grad.cpu().float() for leaf in leaves]


def recomputed(tensors, other, device, backend, mxfp8=False):
    """(out, every gradient) with activation recompute through mok.functional: an inference forward
    (need_context=False), a forward of `other` (the same shapes: the same workspace and layer, so a recompute that
    left the layer as it was would give `other`'s gradients), then recompute_forward_context and backward."""
    def arguments(values):
        x, ids, weights, *experts, dout = [t.to(device) for t in values]
        routed = RoutedExperts(*experts[:3])
        return (x, ids, weights, routed.to_mxfp8() if mxfp8 else routed, SharedExpert(*experts[3:])), dout

    (call, dout), (between, _) = arguments(tensors), arguments(other)
    out, _ = functional.forward(*call, backend=backend, need_context=False)
    functional.forward(*between, backend=backend, need_context=False)
    grads = functional.backward(functional.recompute_forward_context(*call, backend=backend), dout)
    return [out.cpu().float()] + [g.cpu().float() for g in grads[:8]]


def main_grad_backward(tensors, biases, start, device, backend, mxfp8=False):
    """(dx, the routing weights' gradient, every final fp32 main_grad buffer) of a backward into copies of `start`
    (MainGrads' order: the routed, shared and bias buffers), after a forward that keeps its context."""
    x, ids, weights, *experts, dout = [t.to(device) for t in tensors]
    routed = RoutedExperts(*experts[:3], **dict(zip(BIAS_NAMES, [b.to(device) for b in biases], strict=True)))
    routed = routed.to_mxfp8() if mxfp8 else routed
    _, ctx = functional.forward(x, ids, weights, routed, SharedExpert(*experts[3:]), backend=backend)
    main = functional.MainGrads(*[buffer.to(device, copy=True) for buffer in start])
    grads = functional.backward(ctx, dout, main_grads=main)
    assert all(getattr(grads, name) is None for name in MAIN_GRADS), "a weight's gradient not added into its buffer"
    return [grads.x.cpu().float(), grads.topk_weights.cpu().float()] + [getattr(main, n).cpu() for n in MAIN_GRADS]


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def variant_errors(backend: str, seed: int, mxfp8: bool, biased: bool) -> dict[str, float]:
    """Each result's relative error, `backend` on cuda:0 against the host executor (MXFP8, expert biases or not)."""
    tensors, biases = inputs(seed), expert_biases(seed) if biased else []
    got = layer(tensors, "cuda", backend, mxfp8, biases)
    want = layer(tensors, "cpu", "host", mxfp8, biases)
    names = NAMES + (list(BIAS_NAMES) if biased else [])
    return {name: relative(g, w) for name, g, w in zip(names, got, want, strict=True)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_moe_on_cuda_matches_the_host_executor(seed):
    tensors = inputs(seed)
    got, want = layer(tensors, "cuda", "cuda"), layer(tensors, "cpu", "host")
    errors = {name: relative(g, w) for name, g, w in zip(NAMES, got, want, strict=True)}
    assert all(error <= TOLERANCE for error in errors.values()), errors


@pytest.mark.parametrize("mxfp8, biased", [(True, False), (False, True), (True, True)],
                         ids=["mxfp8", "expert biases", "mxfp8 with expert biases"])
def test_variants_on_cuda_match_the_host_executor(mxfp8, biased):
    """MXFP8 (the forward's GEMMs and dgrad_h block-scaled on 10.x, every other GEMM over dequantised operands) and
    gpt-oss's expert biases, forward and backward through autograd, against the host executor."""
    errors = variant_errors("cuda", 7, mxfp8, biased)
    assert all(error <= TOLERANCE for error in errors.values()), errors


def skip_unless_fused():
    usable, reason = FusedExecutor().usable(torch.device("cuda", 0))
    if not usable:
        pytest.skip(f"libmok's fused executor does not run on cuda:0: {reason}")


@pytest.mark.parametrize("backend", ["cuda", "sm100"])
@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_recompute_on_cuda_matches_the_host_executor(mxfp8, backend):
    """Inference forwards (need_context=False) and activation recompute (mokLayerRecompute) on CUDA, with another
    forward run in the same layer between the forward and the recompute, against the host executor's forward and
    backward on a kept context; on the split executor and on the fused one."""
    if backend == "sm100":
        skip_unless_fused()
    tensors = inputs(8)
    got = recomputed(tensors, inputs(9), "cuda", backend, mxfp8)
    want = layer(tensors, "cpu", "host", mxfp8)
    errors = {name: relative(g, w) for name, g, w in zip(NAMES, got, want, strict=True)}
    assert all(error <= TOLERANCE for error in errors.values()), errors


@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16 with expert biases", "mxfp8 with expert biases"])
def test_main_grads_on_cuda_match_the_host_executor(mxfp8):
    """Weight and bias gradients added in fp32 into the caller's main_grad buffers, which start from random values:
    a gradient written over its buffer is an error of the start's size (0.08 to 0.33 of the gradient's norm here),
    one added twice an error of one. The final buffers are compared, each side less the start, so that the norm is
    the gradient's."""
    tensors, biases = inputs(10), expert_biases(10)
    generator = torch.Generator().manual_seed(11)
    start = [torch.randn(t.shape, generator=generator) for t in (*tensors[3:9], *biases)]
    got = main_grad_backward(tensors, biases, start, "cuda", "cuda", mxfp8)
    want = main_grad_backward(tensors, biases, start, "cpu", "host", mxfp8)
    starts = [0, 0, *start]  # dx and the routing weights' gradient are not accumulated
    errors = {name: relative(g - s, w - s)
              for name, g, w, s in zip(["x", "topk_weights", *MAIN_GRADS], got, want, starts, strict=True)}
    assert all(error <= TOLERANCE for error in errors.values()), errors


@pytest.mark.parametrize("mxfp8, biased", [(False, False), (True, False), (False, True)],
                         ids=["bf16", "mxfp8", "expert biases"])
def test_moe_on_the_fused_executor_matches_the_host_executor(mxfp8, biased):
    """backend="sm100" (libmok's fused executor, compute capability 10.x), forward and backward through autograd,
    within the cuda tests' bound: its tiles sum in the tensor cores' order, as the cuda executor's GEMMs do."""
    skip_unless_fused()
    errors = variant_errors("sm100", 12, mxfp8, biased)
    assert all(error <= TOLERANCE for error in errors.values()), errors


def test_moe_on_cuda_is_bitwise_repeatable():
    tensors = inputs(4)
    first, second = layer(tensors, "cuda", "cuda"), layer(tensors, "cuda", "cuda")
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_cuda_is_the_default_on_cuda_tensors():
    assert functional.select_backend(None, torch.device("cuda", 0)).name == "cuda"


def test_moe_forward_replays_from_a_cuda_graph():
    """After an eager call has made the workspace and its layer, the forward captures into a CUDA graph (no
    allocation outside the graph's pool, no synchronisation, no host read of the ids) and a replay gives the eager
    call's bits, for new inputs copied into the captured ones."""
    tensors = [t.to("cuda") for t in inputs(5)]
    x, ids, weights, *experts, _ = tensors
    routed, shared = RoutedExperts(*experts[:3]), SharedExpert(*experts[3:])
    with torch.no_grad():
        mok.moe(x, ids, weights, routed, shared, backend="cuda")  # warm-up: workspace, layer, agreement
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = mok.moe(x, ids, weights, routed, shared, backend="cuda")
        fresh = [t.to("cuda") for t in inputs(6)]
        for static, new in zip((x, ids, weights), fresh[:3], strict=True):
            static.copy_(new)
        graph.replay()
        eager = mok.moe(x, ids, weights, routed, shared, backend="cuda")
    assert torch.equal(captured, eager)
