"""The layer as torch custom ops, so torch.compile (fullgraph) and autograd see it as opaque calls.

    mok::moe_forward(x, topk_ids, topk_weights, routed[], shared[], ...) -> (out [T, H], y_slots [T, K, H])
    mok::moe_backward(dout, x, topk_ids, topk_weights, routed[], shared[], y_slots, ...) -> gradients[]
    mok::mxfp8_quantize(t) -> (rowwise data, scales, colwise data, scales)

Custom ops take tensors and plain values only, so the expert containers travel as flat tensor lists
(`flatten_routed` / `unflatten_routed`) and the process group by name (`group_name`, which also registers it for
`_group`; "mok.LOCAL" for mok.LOCAL). The forward returns y_slots (the one piece of the context with a shape known
in advance, needed for the router-weight gradient). In eager mode with keep_context, the autograd node also keeps
the forward's functional context and the backward runs on it (no second schedule, no recompute). Otherwise
(keep_context=False, or a graph torch.compile traced, where the op's outputs are not the eager tensors) the
backward op recomputes the expert-side context (activation recompute) and then runs the backward. Every executor
behind mok.functional serves these ops; `backend` "" means the default for the device.
"""

from __future__ import annotations

import dataclasses

import torch

from mok import functional
from mok.experts import BIAS_NAMES, RoutedExperts, RoutedExpertsMXFP8, SharedExpert
from mok.quant import MXFP8Pair, MXFP8Tensor, mxfp8_quantize, scale_bytes

_PARTS = ("gate", "up", "down")


# ----------------------------------------------------------------------------------------------------------------
# Containers <-> tensor lists


def flatten_routed(routed) -> list[torch.Tensor]:
    """[gate, up, down] (bf16), followed in MXFP8 mode by each weight's rowwise data, scales, colwise data,
    scales, then with any bias [gate_bias, up_bias, down_bias] (a bias not given: an empty tensor). The first three
    are always the bf16 masters: the tensors gradients flow to."""
    master = routed.master if isinstance(routed, RoutedExpertsMXFP8) else routed
    flat = [getattr(master, p) for p in _PARTS]
    if isinstance(routed, RoutedExpertsMXFP8):
        for p in _PARTS:
            pair = getattr(routed, p)
            flat += [pair.rowwise.data, pair.rowwise.scales, pair.colwise.data, pair.colwise.scales]
    if master.biases():
        flat += [_NO_BIAS if getattr(master, n) is None else getattr(master, n) for n in BIAS_NAMES]
    return flat


_NO_BIAS = torch.empty(0, dtype=torch.bfloat16)


def bias_positions(num_routed: int) -> range:
    """Where the biases sit in a flattened routed list of num_routed tensors (empty: none)."""
    return range(num_routed - 3, num_routed) if num_routed in (6, 18) else range(0)


def unflatten_routed(flat: list[torch.Tensor]):
    biases = [None if flat[i].numel() == 0 else flat[i] for i in bias_positions(len(flat))] or [None] * 3
    master = RoutedExperts(*flat[:3], *biases)
    if len(flat) in (3, 6):
        return master
    pairs = [MXFP8Pair(MXFP8Tensor(flat[i], flat[i + 1], False), MXFP8Tensor(flat[i + 2], flat[i + 3], True))
             for i in range(3, 15, 4)]
    return RoutedExpertsMXFP8(master, *pairs)


def flatten_shared(shared) -> list[torch.Tensor]:
    """[gate, up, down], then the router when the shared expert is gated."""
    if shared is None:
        return []
    return [getattr(shared, p) for p in _PARTS] + ([] if shared.router is None else [shared.router])


def unflatten_shared(flat: list[torch.Tensor]):
    return SharedExpert(*flat) if flat else None


_GROUPS: dict = {}  # group_name -> the ProcessGroup (torch has no public lookup by name)


def group_name(group) -> str:
    """How a process group travels through an op: "" for None, "mok.LOCAL" for mok.LOCAL, else its name (and the
    group is remembered under it for the op's implementation)."""
    if group is None:
        return ""
    if group is not functional.LOCAL:
        _GROUPS[group.group_name] = group
    return group.group_name


def _group(name: str):
    if name == "":
        return None
    if name == functional.LOCAL.group_name:
        return functional.LOCAL
    if name not in _GROUPS:
        raise ValueError(f"group {name!r} is not a process group mok.ops.group_name was given")
    return _GROUPS[name]


_NONE, _AUTO = -1.0, -2.0  # a field left None, a field given as "auto"


def _profiles() -> list[str]:
    from mok.perf import PROFILES

    return sorted(PROFILES)


def config_to_floats(config: functional.MoKConfig | None) -> list[float]:
    """A MoKConfig as floats, its fields in order (every int field is far below 2^53, so exact; -1 for a field
    left None, -2 for "auto", gpu_profile as its index in sorted(mok.perf.PROFILES)); [] for None (the executor's
    default). The op rebuilds the very same MoKConfig from them."""
    if config is None:
        return []

    def encode(name, value):
        if value is None:
            return _NONE
        if name == "gpu_profile":
            return float(_profiles().index(value))
        return _AUTO if value == "auto" else float(value)

    return [encode(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)]


def _config(values: list[float]):
    if not values:
        return None

    def decode(name, v):
        if name == "wait_timeout_s":
            return v
        if v == _AUTO:
            return "auto"
        if v < 0:
            return None
        return _profiles()[int(v)] if name == "gpu_profile" else int(v)

    names = [f.name for f in dataclasses.fields(functional.MoKConfig)]
    return functional.MoKConfig(**{name: decode(name, v) for name, v in zip(names, values, strict=True)})


# ----------------------------------------------------------------------------------------------------------------
# The ops


class _Kept:
    """The latest eager forward's functional context, handed from the op's implementation to its autograd
    setup (which recognises it by its y_slots tensor) and cleared there."""

    y_slots = None
    context = None


# The ops are defined with torch.library's Library/define/impl rather than torch.library.custom_op: custom_op wraps
# every implementation in torch._disable_dynamo, whose first call imports torch._dynamo (seconds), which would land
# on the first mok.moe call of every process. The schemas are functional (no argument is mutated or aliased).
_LIB = torch.library.Library("mok", "DEF")
_LIB.define("moe_forward(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor[] routed, Tensor[] shared, "
            "float? swiglu_limit, str activation, float? alpha, str group, str backend, float[] config, "
            "bool keep_context, str routing_scale) -> (Tensor, Tensor)")
_LIB.define("moe_backward(Tensor dout, Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor[] routed, "
            "Tensor[] shared, Tensor y_slots, float? swiglu_limit, str activation, float? alpha, str group, "
            "str backend, float[] config, str routing_scale) -> Tensor[]")
_LIB.define("mxfp8_quantize(Tensor t) -> (Tensor, Tensor, Tensor, Tensor)")


def _impl(name: str):
    def register(fn):
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        return fn
    return register


@_impl("moe_forward")
def moe_forward(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, routed: list[torch.Tensor],
                shared: list[torch.Tensor], swiglu_limit: float | None, activation: str, alpha: float | None,
                group: str, backend: str, config: list[float], keep_context: bool,
                routing_scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [T, H] bf16, y_slots [T, K, H] bf16: each route's expert output, kept for the backward)."""
    out, ctx = functional.forward(x, topk_ids, topk_weights, unflatten_routed(routed), unflatten_shared(shared),
                                  group=_group(group), config=_config(config), backend=backend or None,
                                  swiglu_limit=swiglu_limit, activation=activation, alpha=alpha,
                                  routing_scale=routing_scale)
    _Kept.y_slots, _Kept.context = (ctx.y_slots, ctx) if keep_context else (None, None)
    return out, ctx.y_slots


@torch.library.register_fake("mok::moe_forward")
def _(x, topk_ids, topk_weights, routed, shared, swiglu_limit, activation, alpha, group, backend, config,
      keep_context, routing_scale):
    tokens, hidden = x.shape
    return x.new_empty(tokens, hidden), x.new_empty(tokens, topk_ids.shape[1], hidden)


@_impl("moe_backward")
def moe_backward(dout: torch.Tensor, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 routed: list[torch.Tensor], shared: list[torch.Tensor], y_slots: torch.Tensor,
                 swiglu_limit: float | None, activation: str, alpha: float | None, group: str, backend: str,
                 config: list[float], routing_scale: str) -> list[torch.Tensor]:
    """[dx, d topk_weights, d gate, d up, d down] + [d shared gate, up, down (, router)] with a shared expert + the
    biases' with biases (_gradient_list); weight
    gradients bf16, of the bf16 masters. Recomputes the expert-side context from the inputs, then runs the
    backward (bitwise what a kept context gives)."""
    ctx = functional.recompute_forward_context(
        x, topk_ids, topk_weights, unflatten_routed(routed), unflatten_shared(shared), group=_group(group),
        config=_config(config), backend=backend or None, swiglu_limit=swiglu_limit, y_slots=y_slots,
        activation=activation, alpha=alpha, routing_scale=routing_scale)
    return _gradient_list(functional.backward(ctx, dout))


def _gradient_list(grads: functional.Gradients) -> list[torch.Tensor]:
    """The op's gradients in its inputs' order: dx, d topk_weights, the routed weights', the shared expert's
    (flatten_shared's order), the biases'; those of absent weights left out."""
    order = (grads.x, grads.topk_weights, grads.gate, grads.up, grads.down, grads.shared_gate, grads.shared_up,
             grads.shared_down, grads.shared_router, *(getattr(grads, n) for n in BIAS_NAMES))
    return [g for g in order if g is not None]


@torch.library.register_fake("mok::moe_backward")
def _(dout, x, topk_ids, topk_weights, routed, shared, y_slots, swiglu_limit, activation, alpha, group, backend,
      config, routing_scale):
    biases = [routed[i] for i in bias_positions(len(routed)) if routed[i].numel() > 0]
    return [torch.empty_like(t) for t in (x, topk_weights, *routed[:3], *shared, *biases)]


def _setup_context(ctx, inputs, output):
    (x, topk_ids, topk_weights, routed, shared, swiglu_limit, activation, alpha, group, backend, config, keep_context,
     routing_scale) = inputs
    ctx.save_for_backward(x, topk_ids, topk_weights, output[1], *routed, *shared)
    ctx.num_routed, ctx.num_shared = len(routed), len(shared)
    ctx.args = (swiglu_limit, activation, alpha, group, backend, config, routing_scale)
    ctx.mark_non_differentiable(output[1])
    kept = _Kept.context if _Kept.y_slots is not None and _Kept.y_slots is output[1] else None
    ctx.mok_context = kept if keep_context else None
    _Kept.y_slots = _Kept.context = None


def _backward(ctx, dout, _dy_slots):
    x, topk_ids, topk_weights, y_slots, *weights = ctx.saved_tensors
    routed, shared = weights[:ctx.num_routed], weights[ctx.num_routed:]
    if ctx.mok_context is not None:  # the forward's own context: no second schedule, no recompute
        kept, ctx.mok_context = ctx.mok_context, None  # released: a second backward (retain_graph) recomputes
        grads = _gradient_list(functional.backward(kept, dout.contiguous()))
    else:
        grads = torch.ops.mok.moe_backward(dout.contiguous(), x, topk_ids, topk_weights, routed, shared, y_slots,
                                           *ctx.args)
    dx, dw, *dweights = grads
    # Gradients reach the bf16 masters and biases only; MXFP8 forms are derived data; then the shared expert's,
    # then the given biases' (in bias order).
    positions = bias_positions(ctx.num_routed)
    routed_grads = dweights[:3] + [None] * (ctx.num_routed - 3)
    bias_grads = iter(dweights[3 + ctx.num_shared:])
    for i in positions:
        if routed[i].numel() > 0:
            routed_grads[i] = next(bias_grads)
    dweights = dweights[:3 + ctx.num_shared]
    # One entry per input, shaped like it: a list for a list of tensors and None for any other value. An empty
    # list counts as a (vacuous) tensor list, a non-empty config list as one value.
    config_grad = None if ctx.args[5] else []
    # (No schema defaults: the dispatcher drops a trailing argument equal to its default, and autograd would then
    # expect one entry fewer.)
    return dx, None, dw, routed_grads, dweights[3:], None, None, None, None, None, config_grad, None, None


torch.library.register_autograd("mok::moe_forward", _backward, setup_context=_setup_context)


@_impl("mxfp8_quantize")
def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mok.quant.mxfp8_quantize of a [M, N] or [E, M, N] tensor in both orientations: (rowwise data, scales,
    colwise data, scales). An op so that compiled code quantises weights without tracing the codec's checks."""
    pair = mxfp8_quantize(t)
    return pair.rowwise.data, pair.rowwise.scales, pair.colwise.data, pair.colwise.scales


@torch.library.register_fake("mok::mxfp8_quantize")
def _(t):
    *batch, m, n = t.shape
    fp8, e8m0 = torch.float8_e4m3fn, torch.uint8
    return (t.new_empty(*batch, m, n, dtype=fp8), t.new_empty(*batch, scale_bytes(m, n), dtype=e8m0),
            t.new_empty(*batch, n, m, dtype=fp8), t.new_empty(*batch, scale_bytes(n, m), dtype=e8m0))


def quantize_routed(routed: RoutedExperts) -> RoutedExpertsMXFP8:
    """routed.to_mxfp8() through the op (traceable by torch.compile); `routed` stays the master."""
    pairs = []
    for p in _PARTS:
        row_data, row_scales, col_data, col_scales = torch.ops.mok.mxfp8_quantize(getattr(routed, p).detach())
        pairs.append(MXFP8Pair(MXFP8Tensor(row_data, row_scales, False), MXFP8Tensor(col_data, col_scales, True)))
    return RoutedExpertsMXFP8(routed, *pairs)
