"""torch.compile(fullgraph=True) of mok.moe and mok.nn.MoE on CPU, and opcheck of mok's custom ops."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from backends import BACKENDS
from dist_utils import run_group
from test_layer import NAMES, layer_with_autograd, make_inputs

import mok.layer
import mok.nn
from mok import ops
from mok.experts import RoutedExperts, SharedExpert
from mok.functional import MoKConfig


def compiled_layer(backend, x, ids, weights, routed, shared, dout, *, mxfp8=False):
    fn = torch.compile(mok.layer.moe, fullgraph=True, backend=backend)
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down,
                                                                 shared.gate, shared.up, shared.down)]
    r, s = RoutedExperts(*leaves[2:5]), SharedExpert(*leaves[5:])
    out = fn(leaves[0], ids, leaves[1], ops.quantize_routed(r) if mxfp8 else r, s, swiglu_limit=1.0)
    out.backward(dout)
    return out.detach(), {n: t.grad for n, t in zip(NAMES, leaves, strict=True)}


@pytest.mark.parametrize("backend,mxfp8", [("inductor", False), ("aot_eager", True)])
def test_compiled_moe_equals_eager(seed, backend, mxfp8):
    torch._dynamo.reset()
    inputs = make_inputs(24, 4, 2)
    got = compiled_layer(backend, *inputs, mxfp8=mxfp8)
    want = layer_with_autograd(*inputs, mxfp8=mxfp8, swiglu_limit=1.0)
    assert torch.equal(got[0], want[0])
    for name in NAMES:
        assert torch.equal(got[1][name], want[1][name]), name


@pytest.mark.parametrize("mxfp8", [False, True])
def test_compiled_module_trains_like_eager(seed, mxfp8):
    torch._dynamo.reset()
    module = mok.nn.MoE(64, 32, 8, 2, shared_intermediate=48, score="sigmoid", normalize_topk=True, mxfp8=mxfp8)
    x = torch.randn(3, 10, 64).to(torch.bfloat16)
    assert_compiled_equals_eager(module, x, parameters=7)


def assert_compiled_equals_eager(module, x, parameters: int) -> list:
    """module(x) and torch.compile(module, fullgraph=True)(x), each with a backward: the same output and the same
    gradient of each of the module's `parameters` parameters, bitwise. Returns the eager gradients."""
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    results = []
    for run in (module, compiled):
        module.zero_grad()
        out = run(x)
        out.float().square().mean().backward()
        results.append((out.detach(), [p.grad.clone() for p in module.parameters()]))
    (out_e, grads_e), (out_c, grads_c) = results
    assert torch.equal(out_e, out_c)
    assert len(grads_e) == parameters and all(torch.equal(a, b) for a, b in zip(grads_e, grads_c, strict=True))
    return grads_e


def test_opcheck_forward_backward_and_quantize(seed):
    x, ids, weights, routed, shared, dout = make_inputs(16, 4, 2)
    flat_routed, flat_shared = ops.flatten_routed(routed), ops.flatten_shared(shared)
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights)]
    fwd_args = (leaves[0], ids, leaves[1], flat_routed, flat_shared, 0.8, "swiglu_oai", 0.7, "", "", [], True, "output")
    torch.library.opcheck(torch.ops.mok.moe_forward.default, fwd_args)
    _, y_slots = torch.ops.mok.moe_forward(*fwd_args)
    bwd_args = (dout, x, ids, weights, flat_routed, flat_shared, y_slots.detach(), 0.8, "swiglu_oai", 0.7, "", "", [],
                "output")
    torch.library.opcheck(torch.ops.mok.moe_backward.default, bwd_args)
    torch.library.opcheck(torch.ops.mok.mxfp8_quantize.default, (routed.down,))


def compiled_module_in_group(rank, world, seed):
    torch.manual_seed(seed)  # the same router and shared weights on every rank
    module = mok.nn.MoE(32, 16, 2 * world, 2, shared_intermediate=16, group=dist.group.WORLD)
    torch.manual_seed(seed + 1 + rank)
    x = torch.randn(5 + 3 * rank, 32).to(torch.bfloat16)  # ragged
    eager = module(x)
    out = torch.compile(module, fullgraph=True, backend="aot_eager")(x)
    out.float().square().sum().backward()
    return torch.equal(out, eager), [p.grad is not None for p in module.parameters()]


def test_compiled_module_in_a_group(seed):
    for same, has_grad in run_group(2, compiled_module_in_group, seed):
        assert same and all(has_grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_moe_with_every_argument(seed, backend):
    """torch.compile(fullgraph) of mok.moe with config, backend and swiglu_limit set, int32 ids and MXFP8
    experts: bitwise the eager result and gradients (the config reaches the op as a list of floats)."""
    torch._dynamo.reset()
    config = MoKConfig(fwd_num_comm_sms=2, host_compute_workers=2, minibatch_size=64, macrobatch_size=128,
                       expert_padding=32, wait_timeout_s=12.5)
    x, ids, weights, routed, shared, dout = make_inputs(18, 4, 2)
    ids = ids.to(torch.int32)
    results = []
    for fn in (mok.layer.moe, torch.compile(mok.layer.moe, fullgraph=True, backend="aot_eager")):
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down,
                                                                     shared.gate, shared.up, shared.down)]
        r, s = ops.quantize_routed(RoutedExperts(*leaves[2:5])), SharedExpert(*leaves[5:])
        out = fn(leaves[0], ids, leaves[1], r, s, config=config, backend=backend, swiglu_limit=0.5)
        out.backward(dout)
        results.append((out.detach(), [t.grad for t in leaves]))
    (out_e, grads_e), (out_c, grads_c) = results
    assert torch.equal(out_e, out_c)
    assert all(torch.equal(a, b) for a, b in zip(grads_e, grads_c, strict=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_module_with_config_trains_like_eager(seed, backend):
    torch._dynamo.reset()
    config = MoKConfig(minibatch_size=64, macrobatch_size=128, expert_padding=32, wait_timeout_s=30.0)
    module = mok.nn.MoE(64, 32, 4, 2, shared_intermediate=16, swiglu_limit=0.5, backend=backend, config=config)
    x = torch.randn(2, 9, 64).to(torch.bfloat16)
    results = []
    for run in (module, torch.compile(module, fullgraph=True, backend="aot_eager")):
        module.zero_grad()
        out = run(x)
        out.float().square().mean().backward()
        results.append((out.detach(), [p.grad.clone() for p in module.parameters()]))
    (out_e, grads_e), (out_c, grads_c) = results
    assert torch.equal(out_e, out_c) and all(torch.equal(a, b) for a, b in zip(grads_e, grads_c, strict=True))
