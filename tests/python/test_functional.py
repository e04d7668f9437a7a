"""mok.functional: config checks, workspace cache, backend selection, schedule reuse, inference mode, context
recompute and main_grad accumulation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_layer import make_inputs

from mok import functional
from mok.functional import MainGrads, MoKConfig

WEIGHT_NAMES = ("gate", "up", "down", "shared_gate", "shared_up", "shared_down")


@pytest.mark.parametrize("field,value,error,rule", [
    ("fwd_num_comm_sms", 0, ValueError, "between 1 and 256"),
    ("bwd_num_comm_sms", 300, ValueError, "between 1 and 256"),
    ("fwd_num_comm_sms", 2.0, TypeError, "an int"),
    ("expert_padding", 96, ValueError, "power of two"),
    ("minibatch_size", 4000, ValueError, "multiple of expert_padding"),
    ("macrobatch_size", 4096 * 3 + 256, ValueError, "multiple of minibatch_size"),
    ("macrobatch_size", 256, ValueError, "multiple of minibatch_size"),
    ("wait_timeout_s", 0, ValueError, r"seconds between 0.001 \(1 ms\) and 86400 \(24 h\)"),
    ("wait_timeout_s", float("inf"), ValueError, "seconds between"),
    ("wait_timeout_s", float("nan"), ValueError, "seconds between"),
    ("wait_timeout_s", "60", TypeError, "seconds between"),
])
def test_config_rejects_bad_fields(field, value, error, rule):
    with pytest.raises(error, match=f"MoKConfig.{field} must .*{rule}"):
        MoKConfig(**{field: value})


def test_config_defaults_and_custom_values_are_accepted():
    assert MoKConfig().minibatch_size == 4096
    MoKConfig(fwd_num_comm_sms=8, minibatch_size=512, macrobatch_size=2048, expert_padding=128, wait_timeout_s=0.5)


def workspace_args(**changes):
    args = dict(max_tokens=64, hidden=64, topk=2, num_local_experts=4, intermediate=48, shared_intermediate=40)
    return {**args, **changes}


def test_get_workspace_caches_per_shape_and_create_makes_new():
    first = functional.get_workspace(**workspace_args())
    assert functional.get_workspace(**workspace_args()) is first
    assert functional.get_workspace(**workspace_args(hidden=32)) is not first
    assert functional.get_workspace(**workspace_args(config=MoKConfig(fwd_num_comm_sms=8))) is not first
    assert functional.create_workspace(**workspace_args()) is not first
    with pytest.raises(ValueError, match=r"max_tokens must be an int in \[0, 16777216\]"):
        functional.create_workspace(**workspace_args(max_tokens=-1))


def test_forward_checks_the_workspace_fits(seed):
    x, ids, weights, routed, shared, _ = make_inputs(20, 4, 2)
    small = functional.create_workspace(**workspace_args(max_tokens=8))
    with pytest.raises(ValueError, match="max_tokens=8, but a rank has 20 tokens"):
        functional.forward(x, ids, weights, routed, shared, workspace=small)
    other = functional.create_workspace(**workspace_args(hidden=32))
    with pytest.raises(ValueError, match="workspace must match"):
        functional.forward(x, ids, weights, routed, shared, workspace=other)
    made = functional.create_workspace(**workspace_args())
    elsewhere = dataclasses.replace(made, key=dataclasses.replace(made.key, group_id=made.key.group_id + 1))
    with pytest.raises(ValueError, match="workspace must have been made for this call's group"):
        functional.forward(x, ids, weights, routed, shared, workspace=elsewhere)
    fits = functional.create_workspace(**workspace_args(max_tokens=20))
    assert torch.equal(functional.forward(x, ids, weights, routed, shared, workspace=fits)[0],
                       functional.forward(x, ids, weights, routed, shared)[0])


def test_backend_selection_and_registration(seed):
    assert "reference" in functional.backends()
    # libmok's host executor is the default on CPU tensors where the extension is built (MOK_NO_EXTENSION=1: not)
    expected = "host" if "host" in functional.backends() else "reference"
    assert functional.select_backend(None, torch.device("cpu")).name == expected
    with pytest.raises(ValueError, match="backend must be None or one of"):
        functional.select_backend("no-such-backend", torch.device("cpu"))

    calls = []

    class Recording(type(functional.select_backend("reference", torch.device("cpu")))):
        """The reference executor under another name, recording that it ran: how a new executor plugs in."""

        name = "recording"

        def forward(self, *args, **kwargs):
            calls.append("forward")
            return super().forward(*args, **kwargs)

    functional.register_backend(Recording(), priority=100)
    try:
        assert functional.backends()[0] == "recording"
        x, ids, weights, routed, shared, _ = make_inputs(10, 4, 2)
        out, _ = functional.forward(x, ids, weights, routed, shared)
        want, _ = functional.forward(x, ids, weights, routed, shared, backend="reference")
        assert calls == ["forward"] and torch.equal(out, want)
    finally:
        functional.unregister_backend("recording")
    assert "recording" not in functional.backends()


def grads_of(ctx, dout, main_grads=None):
    return functional.backward(ctx, dout, main_grads=main_grads)


def assert_same(a, b):
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or torch.equal(x, y), name


def test_inference_mode_then_recompute_equals_kept_context(seed):
    x, ids, weights, routed, shared, dout = make_inputs(30, 4, 3)
    args = (x, ids, weights, routed, shared)
    out, ctx = functional.forward(*args, swiglu_limit=1.0)
    out_inference, none = functional.forward(*args, swiglu_limit=1.0, need_context=False)
    assert none is None and torch.equal(out, out_inference)
    recomputed = functional.recompute_forward_context(*args, swiglu_limit=1.0)
    with_y = functional.recompute_forward_context(*args, swiglu_limit=1.0, y_slots=ctx.y_slots)
    kept = grads_of(ctx, dout)
    assert_same(kept, grads_of(recomputed, dout))
    assert_same(kept, grads_of(with_y, dout))


def test_schedule_reuse(seed):
    x, ids, weights, routed, shared, dout = make_inputs(30, 4, 3)
    schedule = functional.build_schedule(ids, 4)
    out, ctx = functional.forward(x, ids, weights, routed, shared, schedule=schedule)
    want, ctx_want = functional.forward(x, ids, weights, routed, shared)
    assert torch.equal(out, want)
    assert_same(grads_of(ctx, dout), grads_of(ctx_want, dout))
    with pytest.raises(ValueError, match="schedule must be built from this call's topk_ids"):
        functional.forward(x[:10], ids[:10], weights[:10], routed, shared, schedule=schedule)


@pytest.mark.parametrize("mxfp8", [False, True])
def test_main_grads_accumulate_fp32(seed, mxfp8):
    x, ids, weights, routed, shared, dout = make_inputs(30, 4, 3)
    routed_arg = routed.to_mxfp8() if mxfp8 else routed
    _, ctx = functional.forward(x, ids, weights, routed_arg, shared)
    plain = grads_of(ctx, dout)
    shapes = [getattr(w, p).shape for w in (routed, shared) for p in ("gate", "up", "down")]
    fresh = MainGrads(*(torch.zeros(s) for s in shapes))
    grads = grads_of(ctx, dout, fresh)
    assert all(getattr(grads, n) is None for n in WEIGHT_NAMES)
    assert torch.equal(grads.x, plain.x) and torch.equal(grads.topk_weights, plain.topk_weights)
    for name in WEIGHT_NAMES:
        # A zero buffer plus the fp32 gradient is the fp32 gradient; the bf16 one is its rounding.
        assert torch.equal(getattr(fresh, name).to(torch.bfloat16), getattr(plain, name)), name
    start = [torch.randn(s) for s in shapes]
    running = MainGrads(*(t.clone() for t in start))
    grads_of(ctx, dout, running)
    for name, before in zip(WEIGHT_NAMES, start, strict=True):
        assert torch.equal(getattr(running, name), before + getattr(fresh, name)), name


def test_main_grads_partial_and_checked(seed):
    x, ids, weights, routed, shared, dout = make_inputs(12, 4, 2)
    _, ctx = functional.forward(x, ids, weights, routed, shared)
    grads = grads_of(ctx, dout, MainGrads(down=torch.zeros(routed.down.shape)))
    assert grads.down is None and grads.gate is not None and grads.gate.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="main_grads.gate must be a float32 tensor"):
        grads_of(ctx, dout, MainGrads(gate=torch.zeros(routed.gate.shape, dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match=r"main_grads.up must have its weight's shape"):
        grads_of(ctx, dout, MainGrads(up=torch.zeros(3, 3)))
    with pytest.raises(TypeError, match="ctx must be the context returned by forward"):
        functional.backward(object(), dout)
