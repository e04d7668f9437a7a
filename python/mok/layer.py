"""`mok.moe`: the whole layer in one differentiable call."""

from __future__ import annotations

import torch

from mok import ep, functional, ops, validate
from mok.experts import RoutedExperts, RoutedExpertsMXFP8, SharedExpert
from mok.functional import MoKConfig


def moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, routed, shared=None, *, group=None,
        config: MoKConfig | None = None, backend: str | None = None, swiglu_limit: float | None = None,
        keep_context: bool = True, activation: str = "swiglu", alpha: float | None = None,
        routing_scale: str = "output"):
    """The MoE layer's output [T, H] for this rank's tokens (bf16, or x's dtype under autocast), differentiable.

    x [T, H] bf16, or float32/float16 inside a torch.autocast(dtype=torch.bfloat16) region of x's device (then
    cast to bf16 here and the output cast back to x's dtype, gradients reaching x in its dtype); topk_ids [T, K]
    int32/int64: global expert ids in [0, W * E_local) or -1 (no route); topk_weights [T, K] fp32 or bf16 (bf16
    widened to fp32, exactly; its gradient comes back bf16); routed: this rank's experts, RoutedExperts or
    RoutedExpertsMXFP8 (MXFP8 forward and backward; gradients go to its bf16 masters); shared: SharedExpert or
    None; group: the expert-parallel process group, or mok.LOCAL for this process alone (None means mok.LOCAL
    when torch.distributed is not initialised or has one rank, and is an error otherwise). Gradients reach x,
    topk_weights and every bf16 weight. keep_context: the backward runs on the forward's context (True), or
    recomputes it from the saved inputs (False: less memory held between forward and backward). Collective:
    every rank of the group calls it, with any token count. activation: the experts' gated activation, "swiglu"
    (h = silu(g') * u') or "swiglu_oai" (gpt-oss: h = g' * sigmoid(alpha * g') * (u' + 1)), with g' = min(g, L) and
    u' = clamp(u, -L, L) for L = swiglu_limit; alpha: swiglu_oai's, None (1.702) or a finite float > 0, and None
    with "swiglu". routing_scale: "output" (out = shared(x) + sum_k w_k y_k(x)) or "input" (Llama4: out = shared(x)
    + sum_k y_k(bf16(w_k x)), the routing weight scaling each expert's input row; docs/semantics.md).
    """
    group = ep.resolve_group(group)
    caller_dtype = x.dtype if isinstance(x, torch.Tensor) else None
    x, topk_weights = autocast_inputs(x), routing_weights(topk_weights)
    _check_before_op(x, topk_ids, topk_weights, routed, shared, config, group, swiglu_limit, backend)
    activation, alpha = _checked_activation(activation, alpha, x, config, group)
    routing_scale = _checked(validate.check_routing_scale, routing_scale, x, config, group)
    out, _ = torch.ops.mok.moe_forward(
        x, topk_ids, topk_weights, ops.flatten_routed(routed), ops.flatten_shared(shared),
        None if swiglu_limit is None else float(swiglu_limit), activation, alpha, ops.group_name(group), backend or "",
        ops.config_to_floats(config), bool(keep_context), routing_scale)  # functional turns autocast off inside
    ops._Kept.y_slots = ops._Kept.context = None  # the autograd node has it, or nothing needs it (no_grad)
    return out if out.dtype == caller_dtype else out.to(caller_dtype)


def autocast_inputs(x):
    """x as the layer takes it: a float32/float16 x inside an autocast region whose dtype is bf16 for x's
    device becomes bf16 (a differentiable cast, so x's gradient comes back in its dtype), as autocast does for a
    matmul; anything else is passed on unchanged (and checked as it is: outside autocast, x must be bf16)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.float16):
        return x
    kind = x.device.type
    if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16:
        return x.to(torch.bfloat16)
    return x


def routing_weights(topk_weights):
    """bf16 routing weights (what a bf16 model's router gives) widened to fp32: exact, every bf16 value is an
    fp32 value, and differentiable (the gradient comes back bf16)."""
    if isinstance(topk_weights, torch.Tensor) and topk_weights.dtype == torch.bfloat16:
        return topk_weights.float()
    return topk_weights


# ops.flatten_routed's order: the bf16 masters, then each weight's MXFP8 forms.
_FLAT_NAMES = ("gate", "up", "down", *(f"{p}.{form}.{kind}" for p in ("gate", "up", "down")
                                       for form in ("rowwise", "colwise") for kind in ("data", "scales")))


def _checked_activation(activation, alpha, x, config, group) -> tuple[str, float | None]:
    """validate.check_activation before the op (whose schema takes a str and a float); a failure goes through the
    group's agreement step like _check_before_op's."""
    return _checked(validate.check_activation, (activation, alpha), x, config, group)


def _checked(check, value, x, config, group):
    """check(*value) (or check(value)) before the op; a failure goes through the group's agreement step."""
    try:
        return check(*value) if isinstance(value, tuple) else check(value)
    except (TypeError, ValueError) as error:
        _raise_together(error, x, config, group)


def _raise_together(error: Exception, x, config, group):
    """Raise this rank's failed check on every rank: through the group's agreement step, so that the others raise
    too instead of waiting; on this rank alone while x's stream is being captured into a CUDA graph, where no call
    agrees (functional._captured_call)."""
    if not validate.capturing(x):
        timeout = config.wait_timeout_s if isinstance(config, MoKConfig) else MoKConfig().wait_timeout_s
        functional._agree(group, ep.group_rank_and_size(group)[1], timeout, error, {}, 0)
    raise error


def _check_before_op(x, topk_ids, topk_weights, routed, shared, config, group, swiglu_limit, backend) -> None:
    """What must hold before the arguments can become the op's (the op's implementation checks the rest): types,
    dense weights, and one device (the dispatcher would route a call with a meta tensor to the shape-only
    implementation).
    A failure still goes through the group's agreement step, so the other ranks raise too instead of waiting."""
    error = None
    try:
        for name, t in (("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.device != x.device:
                raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
        if not isinstance(routed, (RoutedExperts, RoutedExpertsMXFP8)):
            raise TypeError(f"routed must be a RoutedExperts or RoutedExpertsMXFP8, got {type(routed).__name__}")
        if shared is not None and not isinstance(shared, SharedExpert):
            raise TypeError(f"shared must be a SharedExpert or None, got {type(shared).__name__}")
        for name, tensors in (("routed", ops.flatten_routed(routed)), ("shared", ops.flatten_shared(shared))):
            for part, w in zip(_FLAT_NAMES, tensors, strict=False):
                if w.device != x.device:
                    raise ValueError(f"{name}.{part} must be on x's device {x.device}, got {w.device}")
                # The op rebuilds the containers from these tensors, and the containers reject a strided one.
                validate.check_layout(w, f"{name}.{part}")
        if config is not None and not isinstance(config, MoKConfig):
            raise TypeError(f"config must be a MoKConfig or None, got {type(config).__name__}")
        if backend is not None and not isinstance(backend, str):
            raise TypeError(f"backend must be None or a backend name, got {type(backend).__name__}")
        validate.check_swiglu_limit(swiglu_limit)
    except (TypeError, ValueError) as e:
        error = e
    if error is not None:
        _raise_together(error, x, config, group)
