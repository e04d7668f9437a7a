"""A whole tiny HuggingFace causal LM (Qwen3MoeForCausalLM or Qwen2MoeForCausalLM, with its gated shared expert,
from a config, no hub download; one MoE and one dense decoder layer) trains with its experts on mok
(model.set_experts_implementation("mok"), HF's routers and load-balancing loss kept) and its loss follows HF's own
eager experts step by step."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5",
                                   reason="HuggingFace transformers >= 5 is not installed (nox -s tests installs "
                                          "transformers==5.24.0)")

import mok.integrations.transformers as mok_hf  # noqa: E402

STEPS = 3
# Tolerances, relative to the loss. Step 0 compares one forward on the same weights: mok's experts run in bf16 (g,
# u, h, y, out rounded to 2^-9 relative) inside an fp32 model (its one MoE layer comes first, so both routers see
# the same inputs), and the loss averages 64 tokens: measured <= 2.4e-4 over 10 seeds, bound 2^-10. Later steps
# start from weights updated with mok's bf16 gradients (SGD), so the models drift apart a little more each step
# and a router's near-tie may choose differently: measured <= 1.0e-3 after one step and <= 4.6e-3 after two;
# bounds 2^-8 (bf16's rounding resolution) and 2^-6. Every step moves the loss by more than 2x its bound
# (asserted; measured >= 9%), so a wrong step cannot pass.
LOSS_RTOL = (2 ** -10, 2 ** -8, 2 ** -6)


def tiny_model(seed: int, family: str = "qwen3_moe"):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    sizes = dict(vocab_size=96, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
                 output_router_logits=True, mlp_only_layers=[1], router_aux_loss_coef=0.05, initializer_range=0.15,
                 max_position_embeddings=64)
    torch.manual_seed(seed)
    if family == "qwen2_moe":
        return Qwen2MoeForCausalLM(Qwen2MoeConfig(**sizes, shared_expert_intermediate_size=48, norm_topk_prob=False))
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**sizes, head_dim=32, norm_topk_prob=True))


def tiny_qwen2_moe(seed: int):
    return tiny_model(seed, "qwen2_moe")


def train(model, tokens: torch.Tensor) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        out = model(input_ids=tokens, labels=tokens)
        assert out.aux_loss is not None and out.aux_loss > 0  # HF's load-balancing loss, from HF's router logits
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(out.loss.detach()))
    return losses


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_tiny_moe_lm_trains_on_mok_like_hf_eager(seed, family):
    model = tiny_model(seed, family)
    reference = copy.deepcopy(model)
    reference.set_experts_implementation("eager")
    model.set_experts_implementation("mok")
    assert model.config._experts_implementation == "mok"
    tokens = torch.randint(0, 96, (2, 32), generator=torch.Generator().manual_seed(seed))
    assert mok_hf.settings().backend is None  # mok's default: "host" on CPU where libmok's extension is built
    losses = train(model, tokens)
    expected = train(reference, tokens)
    print(f"losses mok {losses} eager {expected}")
    for step, (got, want) in enumerate(zip(losses, expected, strict=True)):
        assert abs(got - want) <= LOSS_RTOL[step] * abs(want), f"step {step}: loss {got} on mok, {want} on HF eager"
    for step in range(1, STEPS):
        moved = expected[step - 1] - expected[step]
        assert moved > 2 * LOSS_RTOL[step] * expected[step], f"the loss must move by more than that: {expected}"
    experts = [m for m in model.modules() if type(m).__name__.endswith("MoeExperts")]
    assert experts and all("_mok_cache" in m.__dict__ for m in experts)  # they ran on mok


def tiny_gpt_oss(seed: int):
    from test_hf_moe import tiny_gpt_oss as make

    return make(seed)


@pytest.mark.parametrize("make, sequence", [(tiny_model, 32), (tiny_qwen2_moe, 32), (tiny_gpt_oss, 16)],
                         ids=["qwen3_moe", "qwen2_moe", "gpt_oss"])
def test_from_hf_blocks_feed_hf_load_balancing_loss(seed, make, sequence):
    """The MoE block replaced by mok.nn.MoE.from_hf (mok's router) before the first forward: HF still records the
    router logits (output_router_logits=True; output 0 of the router's class, what load_balancing_loss_func reads)
    and its load-balancing loss equals the one of HF's own block; HF's initialisation reaches mok's router weight
    (and gpt-oss's router bias)."""
    model = make(seed)
    reference = copy.deepcopy(model)
    layer = model.model.layers[0]
    layer.mlp = mok_hf.moe_from_hf(layer.mlp)
    again = mok_hf.moe_from_hf(reference.model.layers[0].mlp)  # one recorder class per kind of router, not per block
    assert type(again.logits_recorder) is type(layer.mlp.logits_recorder)
    tokens = torch.randint(0, 96, (2, sequence), generator=torch.Generator().manual_seed(seed))
    got, want = model(input_ids=tokens, labels=tokens), reference(input_ids=tokens, labels=tokens)
    # mok's router computes the same fp32 logits from the same fp32 weight (and bias) up to a matmul's summation
    # order (a few fp32 ulps); the loss is a smooth function of them, so 1e-5 relative is ample and a loss from other
    # logits (or none) is far outside it.
    assert got.aux_loss is not None and want.aux_loss > 0
    assert abs(float(got.aux_loss) - float(want.aux_loss)) <= 1e-5 * float(want.aux_loss), (got.aux_loss,
                                                                                             want.aux_loss)
    got.loss.backward()
    router = layer.mlp.router
    params = [router.weight] + ([router.bias] if getattr(router, "bias", None) is not None else [])
    assert len(params) == (2 if make is tiny_gpt_oss else 1)
    assert all(p.grad is not None for p in params)  # the aux loss reaches mok's router
    before = [p.detach().clone() for p in params]
    model.model.apply(model._init_weights)  # HF's initialisation matches the recorder's class: it reaches mok's router
    assert all(not torch.equal(b, p) for b, p in zip(before, params, strict=True))
    if make is not tiny_gpt_oss:
        assert 0.05 < float(router.weight.std()) < 0.3  # initializer_range
