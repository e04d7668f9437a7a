"""dtypes at mok.moe's and mok.nn.MoE's entry: fp32 activations under autocast(bfloat16), bf16 routing weights,
contiguity checked where the weights are handed in. Each case is compared with the bf16 call it must equal
(bitwise: the casts are the only difference) and, through the gradients, with the float64 layer."""

from __future__ import annotations

import pytest
import torch
from backends import BACKENDS
from test_layer import NAMES, TOL, autograd_float64, compare, make_inputs

import mok.layer
import mok.nn
from mok.experts import RoutedExperts, SharedExpert

T, E, K = 24, 4, 2
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def call(x, ids, weights, routed, shared, dout, *, backend, autocast=None, backward_in_autocast=False):
    """(out, {name: grad}) of mok.moe with fresh leaves of x's and weights' dtypes, optionally inside
    torch.autocast(autocast, dtype=bfloat16) (the backward too with backward_in_autocast)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down,
                                                                shared.gate, shared.up, shared.down)]
    r, s = RoutedExperts(*leaves[2:5]), SharedExpert(*leaves[5:])
    region = torch.autocast(autocast, dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with region:
        out = mok.layer.moe(leaves[0], ids, leaves[1], r, s, backend=backend)
        if backward_in_autocast:
            out.backward(dout.to(out.dtype))
    if not backward_in_autocast:
        out.backward(dout.to(out.dtype))
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=True)}


def on(device, *tensors):
    return [t.to(device) for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("backward_in_autocast", [False, True], ids=["backward-outside", "backward-inside"])
def test_fp32_activations_under_autocast(seed, device, backend, backward_in_autocast):
    """fp32 x under autocast(bf16): the output and dx come back fp32 and are exactly the bf16 call's values
    (x is bf16-representable here, so the cast in is exact and the cast out widens exactly), and every gradient
    matches the float64 layer. A backward run inside the region gives the same bits (autocast does not reach the
    executor's fixed-precision math)."""
    if device == "cuda" and backend == "host":
        pytest.skip("the host executor takes CPU tensors")
    x, ids, weights, routed, shared, dout = make_inputs(T, E, K)
    x, ids, weights, dout = on(device, x, ids, weights, dout)
    routed = RoutedExperts(*on(device, routed.gate, routed.up, routed.down))
    shared = SharedExpert(*on(device, shared.gate, shared.up, shared.down))
    want = call(x, ids, weights, routed, shared, dout, backend=backend)
    got = call(x.float(), ids, weights, routed, shared, dout.float(), backend=backend, autocast=device,
               backward_in_autocast=backward_in_autocast)
    assert got[0].dtype == torch.float32 and got[1]["x"].dtype == torch.float32
    assert torch.equal(got[0], want[0].float()), "out differs from the bf16 call's"
    for name in NAMES:
        assert torch.equal(got[1][name], want[1][name].to(got[1][name].dtype)), f"d{name} differs"
    cpu = [t.cpu() for t in (x, ids, weights)]
    compare((got[0].cpu(), {n: g.cpu() for n, g in got[1].items()}),
            autograd_float64(*cpu, RoutedExperts(*(w.cpu() for w in (routed.gate, routed.up, routed.down))),
                             SharedExpert(*(w.cpu() for w in (shared.gate, shared.up, shared.down))), dout.cpu()),
            TOL["bf16"], "autocast vs float64")


def test_rounded_fp32_activations_under_autocast(seed):
    """fp32 x with bits below bf16's resolution: the layer sees x rounded to bf16 (as autocast rounds a matmul's
    input) and dx reaches the fp32 x unchanged by the cast's backward."""
    x, ids, weights, routed, shared, dout = make_inputs(T, E, K)
    x32 = x.float() + torch.randn(T, x.shape[1]) * 1e-3
    want = call(x32.to(torch.bfloat16), ids, weights, routed, shared, dout, backend="reference")
    got = call(x32, ids, weights, routed, shared, dout.float(), backend="reference", autocast="cpu")
    assert torch.equal(got[0], want[0].float()) and torch.equal(got[1]["x"], want[1]["x"].float())


def test_fp32_activations_outside_autocast_are_rejected(seed):
    x, ids, weights, routed, shared, _ = make_inputs(T, E, K)
    with pytest.raises(TypeError, match="x must be bfloat16, got float32"):
        mok.layer.moe(x.float(), ids, weights, routed, shared)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(TypeError, match="x must be bfloat16"):
        mok.layer.moe(x.float(), ids, weights, routed, shared)  # mok computes in bf16 only


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_routing_weights(seed, backend):
    """bf16 topk_weights are widened to fp32 exactly: the same output as their fp32 values; their gradient is
    the fp32 one rounded to bf16 (the widening's backward)."""
    x, ids, weights, routed, shared, dout = make_inputs(T, E, K)
    w16 = weights.to(torch.bfloat16)
    want = call(x, ids, w16.float(), routed, shared, dout, backend=backend)
    got = call(x, ids, w16, routed, shared, dout, backend=backend)
    assert torch.equal(got[0], want[0])
    assert got[1]["topk_weights"].dtype == torch.bfloat16
    assert torch.equal(got[1]["topk_weights"], want[1]["topk_weights"].to(torch.bfloat16))
    with pytest.raises(TypeError, match="topk_weights must be float32, got float64"):
        mok.layer.moe(x, ids, weights.double(), routed, shared)


@pytest.mark.parametrize("part", ["gate", "up", "down"])
def test_non_contiguous_weights_rejected_when_wrapped(part):
    gate, up, down = (torch.randn(s).to(torch.bfloat16) for s in ((4, 16, 8), (4, 16, 8), (4, 8, 16)))
    parts = {"gate": gate, "up": up, "down": down}
    full = torch.randn(8, *parts[part].shape[1:]).to(torch.bfloat16)
    parts[part] = full[::2]  # every other expert of a larger tensor: a strided slice
    with pytest.raises(ValueError, match=fr"^{part} must be contiguous \(call .contiguous\(\)\), got shape .* strides"):
        RoutedExperts(**parts)
    RoutedExperts(**{**parts, part: parts[part].contiguous()})  # the same values, dense: accepted
    with pytest.raises(ValueError, match="down must be contiguous"):
        SharedExpert(gate[0], up[0], down[0].t().contiguous().t())
    with pytest.raises(ValueError, match=r"up must be contiguous .*dim 0 has stride 0: an expand\(\)ed view"):
        RoutedExperts(gate, up[:1].expand(4, 16, 8), down)


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_under_autocast(seed, backend):
    """mok.nn.MoE under autocast(bf16) with fp32 x: the router stays fp32 (the same routing as outside the
    region), the experts get x in bf16, the output is fp32; every parameter gets the gradient the equivalent
    explicit call gives."""
    module = mok.nn.MoE(64, 32, 8, 2, shared_intermediate=16, normalize_topk=True, backend=backend)
    x = torch.randn(3, 5, 64)
    tokens = x.reshape(-1, 64)
    routing = module.route(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(module.route(tokens).ids, routing.ids)
        out = module(x)
    assert out.dtype == torch.float32 and out.shape == x.shape
    out.square().mean().backward()
    got = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    want = mok.layer.moe(tokens.to(torch.bfloat16), routing.ids, module.route(tokens).weights,
                         mok.RoutedExperts(module.gate, module.up, module.down),
                         mok.SharedExpert(module.shared_gate, module.shared_up, module.shared_down), backend=backend)
    assert torch.equal(out, want.float().reshape(x.shape))
    want.float().reshape(x.shape).square().mean().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(got, module.parameters(), strict=True))
