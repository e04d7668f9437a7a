"""`mok.nn.MoE`: a drop-in mixture-of-experts module (router, routed experts, optional shared expert)."""

from __future__ import annotations

import math

import torch
from torch import nn

from mok import validate
from mok.ep import group_rank_and_size
from mok.experts import RoutedExperts, SharedExpert
from mok.functional import MoKConfig
from mok.layer import moe
from mok.ops import quantize_routed
from mok.routers import Router, Routing

SCORES = ("softmax", "sigmoid")


class MoE(nn.Module):
    """y = shared(x) + sum_k w_k expert_{e_k}(x), with (e_k, w_k) the router's top-k, over an expert-parallel group.

    num_experts is the global count; each of the group's W ranks owns num_experts / W of them (rank r owns
    r * E_local ... (r + 1) * E_local - 1) and every rank passes its own tokens, any number of them.
    Router: `router`, a mok.routers.Router (any of its kinds: softmax top-k, softmax after top-k, DeepSeek-V3's
    grouped sigmoid with correction bias and scaling, an optional router bias), or by default a bias-free fp32
    one made from `score` ("softmax": kind softmax_topk, "sigmoid": kind sigmoid_topk) and normalize_topk (the k
    weights divided by their sum). forward(x, output_router_logits=True) also returns the router logits for
    mok.routers.load_balancing_loss / router_z_loss. Expert weights are bf16 parameters; with mxfp8=True
    the routed experts are quantised to MXFP8 on every forward and gradients reach the bf16 parameters.
    The router and the shared expert are replicas on every rank: initialise them identically (same seed, or a
    broadcast) and reduce their gradients over the group like any data-parallel weight.
    activation ("swiglu" or "swiglu_oai", gpt-oss's), alpha (swiglu_oai's, None meaning 1.702) and swiglu_limit
    are mok.moe's, checked here. expert_bias=True gives the routed experts gpt-oss's biases: gate_bias, up_bias
    [E_local, I] and down_bias [E_local, H] bf16 parameters, zeros at first. shared_expert_gate=True (with
    shared_intermediate) gates the shared expert per token as Qwen2-MoE does: its output times
    sigmoid(x . shared_router), shared_router a [H] bf16 parameter. routing_scale ("output" or "input",
    Llama4's: each expert reads bf16(w_k x) and the outputs add unweighted) is mok.moe's, checked here.
    """

    def __init__(self, hidden: int, intermediate: int, num_experts: int, topk: int, *,
                 shared_intermediate: int = 0, score: str = "softmax", normalize_topk: bool = False,
                 swiglu_limit: float | None = None, mxfp8: bool = False, group=None, backend: str | None = None,
                 config: MoKConfig | None = None, device=None, router: Router | None = None,
                 activation: str = "swiglu", alpha: float | None = None, expert_bias: bool = False,
                 shared_expert_gate: bool = False, routing_scale: str = "output"):
        super().__init__()
        _, world = group_rank_and_size(group)
        for name, value, low in (("hidden", hidden, 1), ("intermediate", intermediate, 1),
                                 ("num_experts", num_experts, 1), ("topk", topk, 1),
                                 ("shared_intermediate", shared_intermediate, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if num_experts % world:
            raise ValueError(f"num_experts must be a multiple of the group's size {world}, got {num_experts}")
        if topk > num_experts:
            raise ValueError(f"topk must be at most num_experts ({num_experts}), got {topk}")
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        if shared_expert_gate and not shared_intermediate:
            raise ValueError("shared_expert_gate=True needs a shared expert (shared_intermediate > 0)")
        if router is not None:
            _check_router(router, hidden, num_experts, topk)
            if score != "softmax" or normalize_topk:
                raise ValueError("score and normalize_topk describe the default router: with router=, set its kind "
                                 "and normalize instead")
        self.topk, self.score, self.normalize_topk = topk, score, normalize_topk
        self.swiglu_limit, self.mxfp8 = swiglu_limit, mxfp8
        self.activation, self.alpha = validate.check_activation(activation, alpha)
        self.routing_scale = validate.check_routing_scale(routing_scale)
        self.group, self.backend, self.config = group, backend, config
        local = num_experts // world
        if router is None:
            kind = "softmax_topk" if score == "softmax" else "sigmoid_topk"
            router = Router(hidden, num_experts, topk, kind=kind, normalize=normalize_topk, device=device)
        self.router = router
        self.gate = _weight((local, intermediate, hidden), hidden, device)
        self.up = _weight((local, intermediate, hidden), hidden, device)
        self.down = _weight((local, hidden, intermediate), intermediate, device)
        self.gate_bias = self.up_bias = self.down_bias = None
        if expert_bias:
            self.gate_bias = nn.Parameter(torch.zeros(local, intermediate, device=device, dtype=torch.bfloat16))
            self.up_bias = nn.Parameter(torch.zeros(local, intermediate, device=device, dtype=torch.bfloat16))
            self.down_bias = nn.Parameter(torch.zeros(local, hidden, device=device, dtype=torch.bfloat16))
        if shared_intermediate:
            self.shared_gate = _weight((shared_intermediate, hidden), hidden, device)
            self.shared_up = _weight((shared_intermediate, hidden), hidden, device)
            self.shared_down = _weight((hidden, shared_intermediate), shared_intermediate, device)
        else:
            self.shared_gate = self.shared_up = self.shared_down = None
        self.shared_router = _weight((hidden,), hidden, device) if shared_expert_gate else None

    @classmethod
    def from_hf(cls, block: nn.Module, **kwargs) -> MoE:
        """A MoE equal to a HuggingFace transformers MoE block (Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, gpt-oss,
        Qwen2-MoE), its router, experts (biases included) and shared expert (and its gate) copied once from HF's
        parameter names; kwargs: group, backend, mxfp8, config.
        Implemented by mok.integrations.transformers.moe_from_hf (docs/transformers.md)."""
        from mok.integrations.transformers import moe_from_hf

        return moe_from_hf(block, **kwargs)

    def route(self, x: torch.Tensor) -> Routing:
        """The router's Routing (ids [T, K] int64, weights [T, K] fp32, logits and scores [T, E] fp32) for
        tokens x [T, H]."""
        return self.router(x)

    def forward(self, x: torch.Tensor, output_router_logits: bool = False):
        """x [..., H] bf16 (or fp32 under autocast to bf16: out comes back in x's dtype) -> out [..., H]; with
        output_router_logits, (out, router logits [T, E] fp32) with T the tokens of x flattened."""
        tokens = x.reshape(-1, x.shape[-1])
        ids, weights, logits, _ = self.route(tokens)
        out = self.run_experts(tokens.contiguous(), ids, weights).reshape(x.shape)
        return (out, logits) if output_router_logits else out

    def run_experts(self, tokens: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """mok.moe over this module's experts (MXFP8-quantised when mxfp8) for routed tokens [T, H]."""
        routed = RoutedExperts(self.gate, self.up, self.down, self.gate_bias, self.up_bias, self.down_bias)
        if self.mxfp8:
            routed = quantize_routed(routed)
        shared = None
        if self.shared_gate is not None:
            shared = SharedExpert(self.shared_gate, self.shared_up, self.shared_down, self.shared_router)
        return moe(tokens, ids, weights, routed, shared, group=self.group, config=self.config, backend=self.backend,
                   swiglu_limit=self.swiglu_limit, activation=self.activation, alpha=self.alpha,
                   routing_scale=self.routing_scale)


def _check_router(router, hidden: int, num_experts: int, topk: int) -> None:
    if not isinstance(router, Router):
        raise TypeError(f"router must be a mok.routers.Router or None, got {type(router).__name__}")
    got = (router.weight.shape[1], router.num_experts, router.topk)
    if got != (hidden, num_experts, topk):
        raise ValueError(f"router must have the layer's (hidden, num_experts, topk) = {(hidden, num_experts, topk)}, "
                         f"got {got}")


def _weight(shape: tuple, fan_in: int, device) -> nn.Parameter:
    # Unit-variance activations in and out of each GEMM.
    return nn.Parameter(torch.randn(shape, device=device).mul_(1 / math.sqrt(fan_in)).to(torch.bfloat16))

