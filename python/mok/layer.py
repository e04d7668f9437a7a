"""`mok.moe`: the whole layer in one differentiable call."""

from __future__ import annotations

import torch

from mok import ep, ops, validate
from mok.experts import RoutedExperts, RoutedExpertsMXFP8, SharedExpert
from mok.functional import MoKConfig


def moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, routed, shared=None, *, group=None,
        config: MoKConfig | None = None, backend: str | None = None, swiglu_limit: float | None = None):
    """The MoE layer's output [T, H] bf16 for this rank's tokens, differentiable with autograd.

    x [T, H] bf16; topk_ids [T, K] int32/int64: global expert ids in [0, W * E_local) or -1 (no route);
    topk_weights [T, K] fp32; routed: this rank's experts, RoutedExperts or RoutedExpertsMXFP8 (MXFP8 forward and
    backward; gradients go to its bf16 masters); shared: SharedExpert or None; group: the expert-parallel process
    group (None: the default group if torch.distributed is initialised, else this process alone). Gradients reach
    x, topk_weights and every bf16 weight. Collective: every rank of the group calls it, with any token count.
    """
    _check_containers(routed, shared, group)
    out, _ = torch.ops.mok.moe_forward(
        x, topk_ids, topk_weights, ops.flatten_routed(routed), ops.flatten_shared(shared), swiglu_limit,
        ops.group_name(group), backend or "", ops.config_to_ints(config))
    return out


def _check_containers(routed, shared, group) -> None:
    """The containers must be right before they can be flattened into the op's arguments. A wrong one still
    goes through the group's agreement step, so the other ranks raise too instead of waiting."""
    error = None
    if not isinstance(routed, (RoutedExperts, RoutedExpertsMXFP8)):
        error = TypeError(f"routed must be a RoutedExperts or RoutedExpertsMXFP8, got {type(routed).__name__}")
    elif shared is not None and not isinstance(shared, SharedExpert):
        error = TypeError(f"shared must be a SharedExpert or None, got {type(shared).__name__}")
    if error is not None:
        validate.agree_across_group(group, ep.group_rank_and_size(group)[1], error)
