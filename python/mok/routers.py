"""Routers: which k experts each token goes to and with what weight, as the published MoE models compute it.

Every router function takes router logits [T, E] and returns a `Routing` (ids [T, K] int64, weights [T, K]
fp32, logits [T, E] and scores [T, E] fp32, what the auxiliary losses need). They compute in fp32 (autocast is
off inside) and are deterministic: top-k picks the k largest values and breaks ties by the lower expert id (a
stable descending sort, the same on every device), and the k columns are in descending order of the value
selected on. `Router` is the module form (the linear layer plus one of the functions), `load_balancing_loss` and
`router_z_loss` the two losses, with the semantics of HF transformers' load_balancing_loss_func and the ST-MoE
z-loss.

| function | models | formula (s = scores) |
|---|---|---|
| softmax_topk(normalize=False) | OLMoE, Qwen3-MoE (norm_topk_prob=False) | s = softmax(l); w = top-k of s |
| softmax_topk(normalize=True) | Mixtral, Qwen3-MoE (norm_topk_prob=True) | ... then w /= sum(w) |
| topk_softmax | gpt-oss | top-k of l, then w = softmax over those k logits |
| sigmoid_topk | DeepSeek-V3 | s = sigmoid(l); select on s + bias within the best groups; w = s at the selection, |
|              |             | optionally / sum, then * routed_scaling_factor |
| sigmoid_topk (defaults) | Llama4 | w = sigmoid of the top-k logits, not renormalised (routing_scale="input") |
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch import nn

__all__ = ["ROUTERS", "Routing", "Router", "topk", "softmax_topk", "topk_softmax", "sigmoid_topk",
           "load_balancing_loss", "router_z_loss"]

ROUTERS = ("softmax_topk", "topk_softmax", "sigmoid_topk")  # Router's kinds, one per function below


class Routing(NamedTuple):
    """A router's result for T tokens over E experts."""

    ids: torch.Tensor  # [T, K] int64: the chosen experts, in descending order of the value selected on
    weights: torch.Tensor  # [T, K] fp32: each route's weight (what mok.moe takes as topk_weights)
    logits: torch.Tensor  # [T, E] fp32: the router's logits (load_balancing_loss, router_z_loss take these)
    scores: torch.Tensor  # [T, E] fp32: softmax or sigmoid of the logits (no correction bias)


def topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the k largest values along the last dim, their indices), ties broken by the lower index. torch.topk
    leaves the order of equal values unspecified (it differs between CPU and CUDA); a stable sort does not."""
    ordered, order = torch.sort(values, dim=-1, descending=True, stable=True)
    return ordered[..., :k].contiguous(), order[..., :k].contiguous()  # dense: mok.moe takes them as they are


def softmax_topk(logits: torch.Tensor, k: int, *, normalize: bool = False) -> Routing:
    """Mixtral, OLMoE, Qwen3-MoE: softmax over all experts, the k largest probabilities, renormalised to sum 1
    with normalize (Mixtral always, Qwen3-MoE with norm_topk_prob, OLMoE not by default)."""
    logits = _fp32(logits, k)
    with _no_autocast(logits):
        scores = logits.softmax(-1)
        weights, ids = topk(scores, k)
        if normalize:
            weights = weights / weights.sum(-1, keepdim=True)
    return Routing(ids, weights, logits, scores)


def topk_softmax(logits: torch.Tensor, k: int) -> Routing:
    """gpt-oss: the k largest logits, then a softmax over those k only (the weights sum to 1). scores is the
    softmax over all experts (what a load-balancing loss uses)."""
    logits = _fp32(logits, k)
    with _no_autocast(logits):
        top, ids = topk(logits, k)
        weights = top.softmax(-1)
        scores = logits.softmax(-1)
    return Routing(ids, weights, logits, scores)


def sigmoid_topk(logits: torch.Tensor, k: int, *, correction_bias: torch.Tensor | None = None, n_group: int = 1,
                 topk_group: int = 1, normalize: bool = False, routed_scaling_factor: float = 1.0) -> Routing:
    """DeepSeek-V3 (n_group=8, topk_group=4, normalize=True, routed_scaling_factor=2.5, with its
    e_score_correction_bias); with the defaults, plain sigmoid top-k.

    s = sigmoid(logits). Selection runs on c = s + correction_bias (the bias steers selection only): the experts
    fall into n_group consecutive groups of E / n_group; a group's score is the sum of its two largest c (its
    one c if a group has one expert); the topk_group best groups are kept and the k largest c among their
    experts are chosen. The weights are s (never c) at the chosen experts, divided by their sum with normalize
    (plus 1e-20, as DeepSeek-V3 does), then multiplied by routed_scaling_factor. Experts outside the kept groups
    are excluded outright (DeepSeek-V3's reference code masks them with -inf; HF transformers masks them with 0,
    which differs only when a kept expert's c is <= 0)."""
    logits = _fp32(logits, k)
    experts = logits.shape[-1]
    _check_groups(experts, k, n_group, topk_group)
    with _no_autocast(logits):
        scores = logits.sigmoid()
        choice = scores if correction_bias is None else scores + _bias(correction_bias, experts, logits.device)
        if n_group > 1:
            choice = _keep_best_groups(choice, n_group, topk_group)
        _, ids = topk(choice, k)
        weights = scores.gather(-1, ids)
        if normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        weights = weights * float(routed_scaling_factor)
    return Routing(ids, weights, logits, scores)


def _keep_best_groups(choice: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """choice with every expert outside the topk_group best groups set to -inf."""
    tokens, experts = choice.shape
    grouped = choice.view(tokens, n_group, experts // n_group)
    group_scores = topk(grouped, min(2, experts // n_group))[0].sum(-1)  # [T, n_group]
    _, best = topk(group_scores, topk_group)
    keep = torch.zeros(tokens, n_group, dtype=torch.bool, device=choice.device).scatter_(1, best, True)
    return grouped.masked_fill(~keep[..., None], float("-inf")).view(tokens, experts)


class Router(nn.Module):
    """The router of one MoE layer: logits = x W^T (+ b) in fp32, then one of ROUTERS.

    kind: "softmax_topk" (normalize: renormalise the k weights), "topk_softmax" (gpt-oss; bias=True as its
    router has), "sigmoid_topk" (correction_bias=True adds the e_score_correction_bias buffer, zeros, set by the
    trainer's balancing rule, not by gradients; n_group, topk_group, normalize, routed_scaling_factor as in
    sigmoid_topk). weight [E, H] and bias [E] are fp32 parameters; x of any float dtype is read as fp32, and
    autocast does not lower the router's GEMM (the routing stays the same under autocast).
    """

    def __init__(self, hidden: int, num_experts: int, topk: int, *, kind: str = "softmax_topk",
                 normalize: bool = False, bias: bool = False, correction_bias: bool = False, n_group: int = 1,
                 topk_group: int = 1, routed_scaling_factor: float = 1.0, device=None):
        super().__init__()
        if kind not in ROUTERS:
            raise ValueError(f"kind must be one of {ROUTERS}, got {kind!r}")
        if not 1 <= topk <= num_experts:
            raise ValueError(f"topk must be between 1 and num_experts ({num_experts}), got {topk}")
        if kind != "sigmoid_topk" and (correction_bias or n_group != 1 or topk_group != 1
                                       or routed_scaling_factor != 1.0):
            raise ValueError(f"correction_bias, n_group, topk_group and routed_scaling_factor need "
                             f"kind='sigmoid_topk', got kind={kind!r}")
        if kind == "topk_softmax" and normalize:
            raise ValueError("normalize does not apply to kind='topk_softmax' (its weights already sum to 1)")
        _check_groups(num_experts, topk, n_group, topk_group)
        self.kind, self.topk, self.normalize = kind, topk, normalize
        self.n_group, self.topk_group, self.routed_scaling_factor = n_group, topk_group, routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, device=device, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(num_experts, device=device)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)  # nn.Linear's initialisation
        if correction_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device))
        else:
            self.e_score_correction_bias = None

    @property
    def num_experts(self) -> int:
        return self.weight.shape[0]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """[T, E] fp32 for tokens x [T, H]."""
        with _no_autocast(x):
            return nn.functional.linear(x.float(), self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> Routing:
        logits = self.logits(x)
        if self.kind == "softmax_topk":
            return softmax_topk(logits, self.topk, normalize=self.normalize)
        if self.kind == "topk_softmax":
            return topk_softmax(logits, self.topk)
        return sigmoid_topk(logits, self.topk, correction_bias=self.e_score_correction_bias, n_group=self.n_group,
                            topk_group=self.topk_group, normalize=self.normalize,
                            routed_scaling_factor=self.routed_scaling_factor)

    def extra_repr(self) -> str:
        return (f"hidden={self.weight.shape[1]}, num_experts={self.num_experts}, topk={self.topk}, "
                f"kind={self.kind!r}, normalize={self.normalize}, bias={self.bias is not None}")


# ----------------------------------------------------------------------------------------------------------------
# Losses


def load_balancing_loss(router_logits, top_k: int, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The Switch / Mixtral auxiliary loss, E * sum_i f_i * P_i, with HF transformers' load_balancing_loss_func
    semantics: router_logits is one [T, E] tensor or a tuple/list of them (one per layer, concatenated along
    tokens); P_i = mean over tokens of softmax(logits)_i; f_i = (routes to expert i among each token's top_k of
    that softmax) / tokens, summed over the k slots (so perfectly even routing gives top_k, not 1); whatever the
    model's router, the loss reads the softmax of the logits. attention_mask [B, S] (1 = real token), with
    T = layers * B * S: padded tokens count in neither mean. Returns a 0-d tensor, fp32 (float64 for float64
    logits), differentiable in the logits through P (f is a count)."""
    logits = _concat_layers(router_logits)
    experts = logits.shape[-1]
    probs = logits.softmax(-1)
    _, ids = topk(probs, top_k)
    routes = nn.functional.one_hot(ids, experts).float()  # [T, K, E]
    if attention_mask is None:
        tokens_per_expert = routes.mean(0)  # [K, E]
        prob_per_expert = probs.mean(0)  # [E]
    else:
        mask = _token_mask(attention_mask, logits.shape[0])
        tokens_per_expert = (routes * mask[:, None, None]).sum(0) / mask.sum()
        prob_per_expert = (probs * mask[:, None]).sum(0) / mask.sum()
    return (tokens_per_expert * prob_per_expert[None]).sum() * experts


def router_z_loss(router_logits) -> torch.Tensor:
    """ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)^2 (one [T, E] tensor or a tuple/list
    of them, one per layer). Returns a 0-d tensor, fp32 (float64 for float64 logits)."""
    logits = _concat_layers(router_logits)
    return logits.logsumexp(-1).square().mean()


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def _fp32(logits, k: int) -> torch.Tensor:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point torch.Tensor, got {getattr(logits, 'dtype', type(logits))}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [T, E], got shape {tuple(logits.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k must be an int between 1 and the expert count {logits.shape[1]}, got {k!r}")
    return logits.float()


def _bias(bias, experts: int, device) -> torch.Tensor:
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (experts,):
        raise ValueError(f"correction_bias must be a [{experts}] tensor (one per expert), got "
                         f"{tuple(getattr(bias, 'shape', ())) or type(bias).__name__}")
    return bias.to(device=device, dtype=torch.float32)


def _check_groups(experts: int, k: int, n_group: int, topk_group: int) -> None:
    for name, value in (("n_group", n_group), ("topk_group", topk_group)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if experts % n_group:
        raise ValueError(f"n_group must divide the expert count {experts}, got {n_group}")
    if topk_group > n_group:
        raise ValueError(f"topk_group must be at most n_group ({n_group}), got {topk_group}")
    if k > topk_group * (experts // n_group):
        raise ValueError(f"k must be at most the experts in the kept groups (topk_group * E / n_group = "
                         f"{topk_group * (experts // n_group)}), got {k}")


def _concat_layers(router_logits) -> torch.Tensor:
    if isinstance(router_logits, (tuple, list)):
        if not router_logits:
            raise ValueError("router_logits must hold at least one layer's [T, E] logits")
        first = router_logits[0]
        router_logits = torch.cat([t.to(first.device) for t in router_logits], dim=0)
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2:
        raise ValueError(f"router_logits must be a [T, E] tensor or a tuple of them, got "
                         f"{tuple(getattr(router_logits, 'shape', ())) or type(router_logits).__name__}")
    return router_logits if router_logits.dtype == torch.float64 else router_logits.float()


def _token_mask(attention_mask: torch.Tensor, tokens: int) -> torch.Tensor:
    """attention_mask [B, S] repeated once per layer, as a [tokens] fp32 mask (layer-major, as HF concatenates)."""
    per_layer = attention_mask.numel()
    if attention_mask.dim() != 2 or per_layer == 0 or tokens % per_layer:
        raise ValueError(f"attention_mask must be [B, S] with the logits' token count ({tokens}) a multiple of "
                         f"B * S, got shape {tuple(attention_mask.shape)}")
    return attention_mask.reshape(-1).float().repeat(tokens // per_layer)


def _no_autocast(t: torch.Tensor):
    """Autocast off for t's device (routing is fp32 whatever the caller's autocast region)."""
    kind = t.device.type
    if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()
