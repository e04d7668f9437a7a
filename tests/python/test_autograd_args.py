"""mok.moe and mok.nn.MoE through autograd with each argument away from its default, on backend="reference" and
backend="host": the gradients must be bitwise what mok.functional's forward and backward give for the same
arguments, an argument that changes the math (swiglu_limit, MXFP8) must change the result, and one that must not
(config: DESIGN 1, determinism) must leave it bitwise the same."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from backends import BACKENDS
from dist_utils import run_group
from test_layer import NAMES, make_inputs

import mok.layer
import mok.nn
from mok import functional
from mok.experts import RoutedExperts, SharedExpert
from mok.functional import MoKConfig

# Every field away from its default; small rows per segment and ring so the host executor's ring wraps.
CONFIG = MoKConfig(fwd_num_comm_sms=2, bwd_num_comm_sms=1, minibatch_size=64, macrobatch_size=128, expert_padding=32,
                   wait_timeout_s=30.5, host_comm_workers=2, host_compute_workers=2)
VARIANTS = {
    "config": dict(config=CONFIG),
    "swiglu_limit": dict(swiglu_limit=0.25),
    "no shared": dict(shared=False),
    "mxfp8": dict(mxfp8=True),
    "int32 topk_ids": dict(int32=True),
    "backend None": dict(backend_none=True),
    "everything": dict(config=CONFIG, swiglu_limit=0.25, shared=False, mxfp8=True, int32=True),
}


def leaves_of(x, weights, routed, shared):
    tensors = [x, weights, routed.gate, routed.up, routed.down]
    tensors += [] if shared is None else [shared.gate, shared.up, shared.down]
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def containers(leaves, mxfp8):
    routed = RoutedExperts(*leaves[2:5])
    shared = SharedExpert(*leaves[5:]) if len(leaves) > 5 else None
    return (routed.to_mxfp8() if mxfp8 else routed), shared


def call_args(inputs, backend, variant):
    """(x, ids, weights, routed, shared, dout, keyword arguments) for one variant."""
    x, ids, weights, routed, shared, dout = inputs
    if variant.get("int32"):
        ids = ids.to(torch.int32)
    if variant.get("shared") is False:
        shared = None
    kwargs = {k: variant[k] for k in ("config", "swiglu_limit", "group") if k in variant}
    kwargs["backend"] = None if variant.get("backend_none") else backend
    return x, ids, weights, routed, shared, dout, kwargs


def with_autograd(inputs, backend, variant):
    x, ids, weights, routed, shared, dout, kwargs = call_args(inputs, backend, variant)
    leaves = leaves_of(x, weights, routed, shared)
    r, s = containers(leaves, variant.get("mxfp8", False))
    out = mok.layer.moe(leaves[0], ids, leaves[1], r, s, **kwargs)
    out.backward(dout)
    return out.detach(), [t.grad for t in leaves]


def with_functional(inputs, backend, variant):
    x, ids, weights, routed, shared, dout, kwargs = call_args(inputs, backend, variant)
    r, s = containers(leaves_of(x, weights, routed, shared), variant.get("mxfp8", False))
    out, ctx = functional.forward(x, ids, weights, r, s, **kwargs)
    grads = functional.backward(ctx, dout)
    return out, [g for g in grads if g is not None]


def assert_bitwise(got, want, what):
    assert torch.equal(got[0], want[0]), f"{what}: out"
    assert len(got[1]) == len(want[1]), what
    for name, a, b in zip(NAMES, got[1], want[1], strict=False):
        assert a is not None and torch.equal(a, b), f"{what}: {name}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_moe_backward_with_argument(seed, backend, name):
    inputs = make_inputs(20, 4, 2)
    variant = VARIANTS[name]
    got = with_autograd(inputs, backend, variant)
    assert_bitwise(got, with_functional(inputs, backend, variant), name)
    # backend=None picks the device's default executor (host on CPU): the same bits as naming it.
    picked = functional.select_backend(None, inputs[0].device).name if variant.get("backend_none") else backend
    default = with_autograd(inputs, picked, {})
    if set(variant) <= {"config", "int32", "backend_none"}:
        # Neither the config, the index type nor the way the backend is picked may change a bit of the result.
        assert_bitwise(got, default, f"{name} vs defaults")
    else:
        assert not torch.equal(got[0], default[0]), f"{name} had no effect"


def group_worker(rank, world, seed, backend):
    """mok.moe over an explicitly created group (not the default one), with every other argument set too."""
    group = dist.new_group(list(range(world)))
    torch.manual_seed(seed + rank)
    inputs = make_inputs(6 + 5 * rank, 2, 2)
    results = {}
    for name in ("config", "everything"):
        variant = {**VARIANTS[name], "group": group}
        got = with_autograd(inputs, backend, variant)
        want = with_functional(inputs, backend, variant)
        results[name] = torch.equal(got[0], want[0]) and all(
            torch.equal(a, b) for a, b in zip(got[1], want[1], strict=True))
    return results


@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_backward_in_a_group(seed, backend):
    for results in run_group(2, group_worker, seed, backend):
        assert all(results.values()), results


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_trains_with_every_argument(seed, backend):
    """mok.nn.MoE with each constructor argument set: one training step's gradients reach every parameter and
    do not depend on the config."""
    grads = []
    for config in (None, CONFIG):
        torch.manual_seed(seed)
        module = mok.nn.MoE(64, 32, 4, 2, shared_intermediate=16, score="sigmoid", normalize_topk=True,
                            swiglu_limit=0.5, mxfp8=True, backend=backend, config=config)
        out = module(torch.randn(2, 7, 64).to(torch.bfloat16))
        out.float().square().mean().backward()
        grads.append([p.grad for p in module.parameters()])
    assert len(grads[1]) == 7 and all(g is not None for g in grads[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
