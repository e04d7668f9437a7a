"""HF's expert layouts reach mok without a copy per call (mok.integrations.transformers' module doc): a dense bf16
view is passed in place, anything else is converted once per weight version and the conversion is remade when
the parameter's version counter or data_ptr changes. Transposed (Aria, a real HF model) and interleaved layouts."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5",
                                   reason="HuggingFace transformers >= 5 is not installed (nox -s tests installs "
                                          "transformers==5.24.0)")

from test_hf_moe import (  # noqa: E402
    EXPERTS,
    INTER,
    H,
    assert_close,
    bf16_exact,
    draw,
    make_block,
    run_experts,
)

import mok.integrations.transformers as mok_hf  # noqa: E402


def experts_of(model: str, seed: int, dtype) -> torch.nn.Module:
    experts = make_block(model, seed).experts.to(dtype)
    experts.config._experts_implementation = "mok"
    return experts


def forward(experts, seed: int) -> torch.Tensor:
    x, ids, weights, _ = draw(seed)
    return experts(x.to(experts.gate_up_proj.dtype), ids, weights)


def test_no_conversion_per_call(seed):
    """fp32 parameters: the first forward converts gate_up_proj and down_proj once; later forwards reuse the
    copies (same data_ptr). bf16 parameters: down_proj is passed as a view of HF's parameter."""
    experts = experts_of("qwen3_moe", seed, torch.float32)
    before = mok_hf.conversions
    first = mok_hf.routed_experts(experts)
    for _ in range(3):
        forward(experts, seed)
    again = mok_hf.routed_experts(experts)
    assert mok_hf.conversions - before == 2
    assert again.gate.data_ptr() == first.gate.data_ptr() and again.down.data_ptr() == first.down.data_ptr()

    experts = experts_of("qwen3_moe", seed, torch.bfloat16)
    before = mok_hf.conversions
    routed = mok_hf.routed_experts(experts)
    assert routed.down.data_ptr() == experts.down_proj.data_ptr()  # in place: no copy at all
    forward(experts, seed)
    assert mok_hf.conversions - before == 1  # gate_up_proj only (gate and up rows interleave per expert)


@pytest.mark.parametrize("change", ["sgd", "sgd_foreach", "inplace", "replace"])
def test_changed_weights_are_seen(seed, change):
    """After an optimizer step (for-loop and foreach), an in-place edit under no_grad, or `param.data = ...`, the
    next forward converts again and matches HF's eager experts on the new weights."""
    experts = experts_of("mixtral", seed, torch.bfloat16)
    forward(experts, seed).float().square().sum().backward()
    before = mok_hf.conversions
    with torch.no_grad():
        if change.startswith("sgd"):
            torch.optim.SGD(experts.parameters(), lr=1.0, foreach=change == "sgd_foreach").step()
        elif change == "inplace":
            experts.gate_up_proj.mul_(-1)
        else:
            experts.gate_up_proj.data = -experts.gate_up_proj.data.clone()
    got = run_experts(experts, "mok", torch.bfloat16, *draw(seed))
    want = run_experts(experts, "eager", torch.float64, *draw(seed))
    assert mok_hf.conversions - before >= 1
    assert_close(got, want, False, f"after {change}")


def test_transposed_layout_aria(seed):
    """Aria's experts store gate_up_proj [E, H, 2I] and down_proj [E, I, H] (is_transposed=True): mok matches HF's
    float64 eager loop, gradients included, in HF's layout."""
    from transformers import AriaTextConfig
    from transformers.models.aria.modeling_aria import AriaExperts

    experts = AriaExperts(AriaTextConfig(hidden_size=H, intermediate_size=INTER, moe_num_experts=EXPERTS,
                                         moe_topk=2))
    assert experts.is_transposed
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(bf16_exact(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5))
    experts = experts.to(torch.bfloat16)
    got = run_experts(experts, "mok", torch.bfloat16, *draw(seed))
    want = run_experts(experts, "eager", torch.float64, *draw(seed))
    assert got["experts.gate_up_proj"].shape == experts.gate_up_proj.shape
    assert_close(got, want, False, "aria (transposed)")


@pytest.mark.parametrize("transposed", [False, True])
def test_interleaved_layout(seed, transposed):
    """gate and up alternating along 2I (is_concatenated=False, gpt-oss's layout): mok's gate is rows 0, 2, 4, ...
    and up rows 1, 3, 5, ...; their gradients go back to those rows of gate_up_proj's gradient."""
    experts = copy.deepcopy(make_block("olmoe", seed).experts)
    e, two_i, h = experts.gate_up_proj.shape
    with torch.no_grad():
        if transposed:
            experts.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.transpose(1, 2).contiguous())
            experts.down_proj = torch.nn.Parameter(experts.down_proj.transpose(1, 2).contiguous())
    experts.is_concatenated, experts.is_transposed = False, transposed
    routed = mok_hf.routed_experts(experts, rank=1, world=2)
    hf_gate_up = experts.gate_up_proj.transpose(1, 2) if transposed else experts.gate_up_proj
    hf_down = experts.down_proj.transpose(1, 2) if transposed else experts.down_proj
    mine = slice(e // 2, e)
    assert torch.equal(routed.gate.float(), bf16_exact(hf_gate_up[mine, 0::2]))
    assert torch.equal(routed.up.float(), bf16_exact(hf_gate_up[mine, 1::2]))
    assert torch.equal(routed.down.float(), bf16_exact(hf_down[mine]))
    probes = [bf16_exact(torch.randn(t.shape)) for t in (routed.gate, routed.up, routed.down)]
    sum((t.float() * p).sum() for t, p in zip((routed.gate, routed.up, routed.down), probes, strict=True)).backward()
    grad = experts.gate_up_proj.grad.transpose(1, 2) if transposed else experts.gate_up_proj.grad
    assert torch.equal(grad[mine, 0::2], probes[0]) and torch.equal(grad[mine, 1::2], probes[1])
    assert not grad[: e // 2].any()
    down_grad = experts.down_proj.grad.transpose(1, 2) if transposed else experts.down_proj.grad
    assert torch.equal(down_grad[mine], probes[2]) and not down_grad[: e // 2].any()
    assert two_i == 2 * routed.intermediate_size and h == routed.hidden_size
