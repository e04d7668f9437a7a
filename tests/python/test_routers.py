"""mok.routers against each model's published routing formula, written here in plain float64 PyTorch (per token,
with Python loops where the model selects in steps), plus the losses against HF transformers' formulas (written
out here; transformers is not a dependency) and mok.nn.MoE's router plumbing."""

from __future__ import annotations

import pytest
import torch

import mok.layer
import mok.nn
from mok import routers
from mok.routers import Router

# Routers compute in fp32, the formulas here in float64: softmax / sigmoid of fp32 logits are within a few fp32
# ulps (2^-24 relative each) of the float64 values, a renormalisation or a x2.5 scale adds one or two more;
# 1e-5 relative leaves room for those and is far below what a wrong formula gives (errors of order 1e-1).
RTOL, ATOL = 1e-5, 1e-7


def logits_for(T, E):
    # Wide enough (std 2) that the top-k and the groups change from token to token and no two logits tie.
    return torch.randn(T, E) * 2


def ref_softmax_topk(logits, k, normalize):
    """Mixtral / Qwen3-MoE / OLMoE: p = softmax(l) over all experts, top-k of p, optionally / sum."""
    p = logits.double().softmax(-1)
    w, ids = p.topk(k, dim=-1)
    return ids, (w / w.sum(-1, keepdim=True) if normalize else w)


def ref_topk_softmax(logits, k):
    """gpt-oss: top-k of the logits, softmax over those k."""
    top, ids = logits.double().topk(k, dim=-1)
    return ids, top.softmax(-1)


def ref_deepseek_v3(logits, k, bias, n_group, topk_group, normalize, scale):
    """DeepSeek-V3's routing, one token at a time: s = sigmoid(l), c = s + bias; group score = sum of its two
    largest c; keep the topk_group best groups; the k largest c among their experts; w = s there, / sum, * scale."""
    T, E = logits.shape
    size = E // n_group
    s = logits.double().sigmoid()
    c = s + bias.double()
    all_ids, all_w = [], []
    for t in range(T):
        group_score = [sorted(c[t, g * size:(g + 1) * size].tolist(), reverse=True)[:2] for g in range(n_group)]
        group_score = [sum(v) for v in group_score]
        kept = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
        candidates = [e for g in kept for e in range(g * size, (g + 1) * size)]
        chosen = sorted(candidates, key=lambda e: -float(c[t, e]))[:k]
        w = s[t, chosen]
        if normalize:
            w = w / (w.sum() + 1e-20)
        all_ids.append(chosen)
        all_w.append(w * scale)
    return torch.tensor(all_ids), torch.stack(all_w)


def assert_routing(got, want_ids, want_weights):
    assert got.ids.dtype == torch.int64 and got.weights.dtype == torch.float32
    assert torch.equal(got.ids, want_ids), "chosen experts differ"
    torch.testing.assert_close(got.weights.double(), want_weights, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("normalize", [False, True], ids=["olmoe", "mixtral"])
def test_softmax_topk(seed, normalize):
    logits = logits_for(64, 8)
    got = routers.softmax_topk(logits, 2, normalize=normalize)
    assert_routing(got, *ref_softmax_topk(logits, 2, normalize))
    assert torch.equal(got.logits, logits) and torch.allclose(got.scores.double(), logits.double().softmax(-1))


def test_topk_softmax_gpt_oss(seed):
    logits = logits_for(64, 32)
    got = routers.topk_softmax(logits, 4)
    assert_routing(got, *ref_topk_softmax(logits, 4))
    # Softmax over k: the weights sum to 1 (a softmax over all experts before the top-k would not).
    torch.testing.assert_close(got.weights.sum(-1), torch.ones(64))


@pytest.mark.parametrize("n_group,topk_group,normalize,scale", [(1, 1, False, 1.0), (4, 2, True, 2.5),
                                                                (8, 4, True, 2.5), (8, 3, False, 1.5)],
                         ids=["plain-sigmoid", "grouped-4", "deepseek-v3-8-4", "grouped-unnormalised"])
def test_sigmoid_topk_deepseek_v3(seed, n_group, topk_group, normalize, scale):
    E, K = 32, 6 if n_group > 1 else 4
    logits = logits_for(64, E)
    # The bias as large as the scores' spread, so that it changes which experts are chosen (it does in most
    # tokens: asserted below), while the weights must not see it.
    bias = torch.randn(E) * 0.3
    got = routers.sigmoid_topk(logits, K, correction_bias=bias, n_group=n_group, topk_group=topk_group,
                               normalize=normalize, routed_scaling_factor=scale)
    assert_routing(got, *ref_deepseek_v3(logits, K, bias, n_group, topk_group, normalize, scale))
    unbiased = ref_deepseek_v3(logits, K, torch.zeros(E), n_group, topk_group, normalize, scale)[0]
    assert (got.ids != unbiased).any(-1).float().mean() > 0.5, "the bias should change most tokens' choice"


def test_group_limit_changes_the_choice(seed):
    """The grouped selection differs from a plain top-k over all experts for most tokens at these shapes (else
    the DeepSeek-V3 test above could not see a wrong group mask)."""
    logits = logits_for(64, 32)
    grouped = routers.sigmoid_topk(logits, 6, n_group=8, topk_group=3)
    plain = routers.sigmoid_topk(logits, 6)
    assert (grouped.ids.sort(-1).values != plain.ids.sort(-1).values).any(-1).float().mean() > 0.3


def test_router_bias_gpt_oss(seed):
    """Router(kind="topk_softmax", bias=True): logits = x W^T + b, then gpt-oss's routing."""
    router = Router(48, 16, 4, kind="topk_softmax", bias=True)
    with torch.no_grad():
        router.bias.copy_(torch.randn(16) * 2)  # large enough to change the choice
    x = torch.randn(40, 48).to(torch.bfloat16)
    got = router(x)
    logits = x.double() @ router.weight.detach().double().t() + router.bias.double()
    assert_routing(got, *ref_topk_softmax(logits, 4))
    no_bias = ref_topk_softmax(logits - router.bias.double(), 4)[0]
    assert not torch.equal(got.ids, no_bias), "the router bias should change some token's choice"


def test_router_module_deepseek_v3(seed):
    router = Router(48, 32, 6, kind="sigmoid_topk", correction_bias=True, n_group=8, topk_group=4, normalize=True,
                    routed_scaling_factor=2.5)
    router.e_score_correction_bias.copy_(torch.randn(32) * 0.3)
    x = torch.randn(40, 48)
    logits = x.double() @ router.weight.detach().double().t()
    assert_routing(router(x), *ref_deepseek_v3(logits, 6, router.e_score_correction_bias, 8, 4, True, 2.5))
    assert [n for n, _ in router.named_parameters()] == ["weight"]  # the correction bias is a buffer


@pytest.mark.parametrize("route", ["softmax_topk", "topk_softmax", "sigmoid_topk", "grouped"])
def test_ties_go_to_the_lower_expert_id(seed, route):
    """Logits with many equal values: the chosen experts are the k largest, equal ones in ascending id order,
    and the columns in descending order of the value selected on (the documented rule)."""
    T, E, K = 64, 16, 4
    logits = torch.randint(0, 3, (T, E)).float()
    if route == "grouped":
        got = routers.sigmoid_topk(logits, K, n_group=4, topk_group=4)  # every group kept: the plain rule
    else:
        got = getattr(routers, route)(logits, K)
    for t in range(T):
        want = sorted(range(E), key=lambda e: (-float(logits[t, e]), e))[:K]
        assert got.ids[t].tolist() == want, f"token {t}: {logits[t].tolist()}"


def test_routers_compile_to_the_same_routing(seed):
    """torch.compile(fullgraph=True) of a router (the stable sort, the group mask) traces without a graph break
    and gives the eager result (aot_eager, as test_compile.py: inductor's C++ build takes minutes here)."""
    router = Router(32, 16, 4, kind="sigmoid_topk", correction_bias=True, n_group=4, topk_group=2, normalize=True,
                    routed_scaling_factor=2.5)
    router.e_score_correction_bias.copy_(torch.randn(16) * 0.3)
    x = torch.randn(24, 32)
    got, want = torch.compile(router, fullgraph=True, backend="aot_eager")(x), router(x)
    assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights)


def test_ties_between_groups_go_to_the_lower_group(seed):
    logits = torch.zeros(8, 16)  # every group scores the same
    got = routers.sigmoid_topk(logits, 4, n_group=4, topk_group=1)
    assert got.ids.tolist() == [[0, 1, 2, 3]] * 8


@pytest.mark.parametrize("bad,error,rule", [
    (dict(n_group=3), ValueError, "n_group must divide the expert count 16"),
    (dict(n_group=4, topk_group=5), ValueError, r"topk_group must be at most n_group \(4\)"),
    (dict(n_group=8, topk_group=1), ValueError, r"k must be at most the experts in the kept groups .* = 2\), got 4"),
    (dict(correction_bias=torch.zeros(15)), ValueError, r"correction_bias must be a \[16\] tensor"),
])
def test_bad_router_arguments(bad, error, rule):
    with pytest.raises(error, match=rule):
        routers.sigmoid_topk(torch.randn(4, 16), 4, **bad)


def test_bad_router_module_arguments():
    with pytest.raises(ValueError, match="kind must be one of"):
        Router(8, 4, 2, kind="softmax")
    with pytest.raises(ValueError, match="need kind='sigmoid_topk'"):
        Router(8, 4, 2, kind="softmax_topk", n_group=2)
    with pytest.raises(ValueError, match=r"k must be an int between 1 and the expert count 4, got 5"):
        routers.softmax_topk(torch.randn(3, 4), 5)


# ----------------------------------------------------------------------------------------------------------------
# Losses


def ref_load_balancing_loss(layers, num_experts, top_k, attention_mask=None):
    """HF transformers' load_balancing_loss_func, written out in float64."""
    logits = torch.cat([t.double() for t in layers], dim=0)
    probs = logits.softmax(-1)
    _, selected = probs.topk(top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected, num_experts).double()  # [T, K, E]
    if attention_mask is None:
        tokens_per_expert = expert_mask.mean(0)
        prob_per_expert = probs.mean(0)
    else:
        b, s = attention_mask.shape
        n_layers = logits.shape[0] // (b * s)
        m = attention_mask.double()[None, :, :, None, None].expand(n_layers, b, s, top_k, num_experts)
        m = m.reshape(-1, top_k, num_experts)
        tokens_per_expert = (expert_mask * m).sum(0) / m.sum(0)
        pm = attention_mask.double()[None, :, :, None].expand(n_layers, b, s, num_experts).reshape(-1, num_experts)
        prob_per_expert = (probs * pm).sum(0) / pm.sum(0)
    return (tokens_per_expert * prob_per_expert[None]).sum() * num_experts


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_matches_hf_formula(seed, masked):
    B, S, E, K = 3, 5, 8, 2
    layers = tuple(logits_for(B * S, E) for _ in range(3))
    mask = (torch.rand(B, S) < 0.7).long() if masked else None
    if masked:
        mask[0, 0] = 1
    got = routers.load_balancing_loss(layers, K, attention_mask=mask)
    want = ref_load_balancing_loss(layers, E, K, mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=RTOL, atol=ATOL)


def test_load_balancing_loss_gradient(seed):
    """In float64 the loss is exactly the formula: gradcheck its derivative in the logits."""
    logits = logits_for(12, 6).double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: routers.load_balancing_loss(v, 2), (logits,))
    torch.testing.assert_close(routers.load_balancing_loss(logits, 2), ref_load_balancing_loss([logits], 6, 2))


def test_load_balancing_loss_of_even_routing_is_top_k():
    # Every expert chosen equally often and equal probabilities: f_i = K / E summed over slots, P_i = 1 / E.
    logits = torch.eye(4).repeat(2, 1) * 3 + torch.eye(4).roll(1, 0).repeat(2, 1) * 2
    torch.testing.assert_close(routers.load_balancing_loss(logits, 2), torch.tensor(2.0), rtol=0.3, atol=0)


def test_router_z_loss(seed):
    layers = [logits_for(10, 8) for _ in range(2)]
    want = torch.cat([t.double() for t in layers]).logsumexp(-1).square().mean()
    torch.testing.assert_close(routers.router_z_loss(layers).double(), want, rtol=RTOL, atol=ATOL)
    logits = layers[0].double().requires_grad_(True)
    assert torch.autograd.gradcheck(routers.router_z_loss, (logits,))


# ----------------------------------------------------------------------------------------------------------------
# mok.nn.MoE's router plumbing


def test_moe_default_router_is_the_old_formula(seed):
    """score / normalize_topk keep their meaning: sigmoid (or softmax), top-k, / sum."""
    for score in ("softmax", "sigmoid"):
        module = mok.nn.MoE(32, 16, 8, 2, score=score, normalize_topk=True)
        x = torch.randn(20, 32).to(torch.bfloat16)
        logits = x.double() @ module.router.weight.detach().double().t()
        p = logits.softmax(-1) if score == "softmax" else logits.sigmoid()
        w, ids = p.topk(2, dim=-1)
        assert_routing(module.route(x), ids, w / w.sum(-1, keepdim=True))


def test_moe_with_a_router_returns_its_logits(seed):
    router = Router(32, 16, 4, kind="sigmoid_topk", correction_bias=True, n_group=4, topk_group=2, normalize=True,
                    routed_scaling_factor=2.5)
    router.e_score_correction_bias.copy_(torch.randn(16) * 0.3)
    module = mok.nn.MoE(32, 16, 16, 4, shared_intermediate=8, router=router, backend="reference")
    x = torch.randn(2, 9, 32).to(torch.bfloat16)
    out, logits = module(x, output_router_logits=True)
    routing = router(x.reshape(-1, 32))
    assert torch.equal(logits, routing.logits) and logits.shape == (18, 16)
    want = mok.layer.moe(x.reshape(-1, 32), routing.ids, routing.weights,
                         mok.RoutedExperts(module.gate, module.up, module.down),
                         mok.SharedExpert(module.shared_gate, module.shared_up, module.shared_down),
                         backend="reference")
    assert torch.equal(out, want.reshape(x.shape))
    # The losses train the router: their gradient reaches its weight (and the output's too).
    loss = out.float().square().mean() + 0.01 * routers.load_balancing_loss(logits, 4) + routers.router_z_loss(logits)
    loss.backward()
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_moe_rejects_a_mismatched_router():
    with pytest.raises(ValueError, match=r"router must have the layer's \(hidden, num_experts, topk\)"):
        mok.nn.MoE(32, 16, 8, 2, router=Router(32, 8, 3))
    with pytest.raises(TypeError, match="router must be a mok.routers.Router or None"):
        mok.nn.MoE(32, 16, 8, 2, router=torch.nn.Linear(32, 8))
    with pytest.raises(ValueError, match="score and normalize_topk describe the default router"):
        mok.nn.MoE(32, 16, 8, 2, normalize_topk=True, router=Router(32, 8, 2))
