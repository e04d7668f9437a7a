"""The MoE layer's exact math in plain PyTorch: the oracle every libmok executor is checked against.

docs/semantics.md states the math, the rounding points and the row order. In short:

- precision="bf16": GEMMs accumulate in fp32 and store bf16 (g, u, h, y, dh, dg, du, dx_k); SwiGLU and the
  combines run in fp32; weight gradients accumulate in fp32 and are returned fp32.
- MXFP8 mode (routed = RoutedExpertsMXFP8): the same, except that every routed GEMM operand is quantised to
  MXFP8 along that GEMM's reduction dim (from its stored bf16 value) before the fp32 GEMM. The shared expert
  stays bf16.
- precision="float64": the same formulas with everything in float64 and no rounding (on the bf16 master weights
  in MXFP8 mode): the oracle tests compare against.
- NaN propagates (IEEE): a NaN in x or dout gives NaN wherever it enters the math; an MXFP8 block that holds a NaN
  or an infinity becomes NaN as a whole.

The per-expert building blocks (swiglu, swiglu_backward, expert_forward, expert_backward, combine) are public and
stable: the expert-parallel path calls them on the rows each rank owns, so the algorithm lives here once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch

from mok.experts import BIAS_NAMES, ExpertWeights, RoutedExperts, RoutedExpertsMXFP8, SharedExpert
from mok.quant import MXFP8Pair, mxfp8_fake_quantize

PRECISIONS = ("bf16", "float64")
ACTIVATIONS = ("swiglu", "swiglu_oai")
OAI_ALPHA = 1.702  # gpt-oss's alpha (and its clamp is 7.0)


class ExpertActivations(NamedTuple):
    """One expert's forward on its rows [T, .]: g, u, h [T, I] and y [T, H], as stored (bf16, float64 oracle)."""

    g: torch.Tensor
    u: torch.Tensor
    h: torch.Tensor
    y: torch.Tensor


class ExpertGradients(NamedTuple):
    """One expert's backward: per-row input gradient dx [T, H] (stored dtype) and the weight gradients
    gate, up [I, H], down [H, I] (fp32, float64 oracle), summed over the rows in the order given."""

    dx: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    gate_bias: torch.Tensor | None = None  # [I]: the rows' sum of dg, with a gate bias
    up_bias: torch.Tensor | None = None  # [I]: of du
    down_bias: torch.Tensor | None = None  # [H]: of dy


class Gradients(NamedTuple):
    """All gradients of the layer. x: like x; topk_weights: fp32 (0 for -1 routes); weights: fp32 (float64 in the
    oracle), of the bf16 masters in MXFP8 mode; shared_*: None without a shared expert."""

    x: torch.Tensor
    topk_weights: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    shared_gate: torch.Tensor | None
    shared_up: torch.Tensor | None
    shared_down: torch.Tensor | None
    gate_bias: torch.Tensor | None = None  # [E_local, I] with routed.gate_bias (fp32, float64 in the oracle)
    up_bias: torch.Tensor | None = None  # [E_local, I] with routed.up_bias
    down_bias: torch.Tensor | None = None  # [E_local, H] with routed.down_bias
    shared_router: torch.Tensor | None = None  # [H] with shared.router


# ----------------------------------------------------------------------------------------------------------------
# Per-expert building blocks


def swiglu(
    g: torch.Tensor, u: torch.Tensor, limit: float | None = None, activation: str = "swiglu", alpha: float = OAI_ALPHA
) -> torch.Tensor:
    """With a = min(g, L), b = clamp(u, -L, L):
    activation "swiglu":     h = silu(a) * b, silu(z) = z * sigmoid(z), evaluated as (a * sigmoid(a)) * b;
    activation "swiglu_oai": h = a * sigmoid(alpha * a) * (b + 1) (gpt-oss), evaluated as
                             (a * sigmoid(alpha * a)) * (b + 1), alpha * a and b + 1 each rounded first.

    Computed in fp32 (float64 when g or u is float64) and returned unrounded; callers store it. limit None = no clamp.
    """
    _check_activation(activation, alpha)
    a, b = _clamped(g, u, limit)
    z, f = _gate_argument(a, activation, alpha), _up_factor(b, activation)
    return a * torch.sigmoid(z) * f


def swiglu_backward(
    g: torch.Tensor,
    u: torch.Tensor,
    dh: torch.Tensor,
    limit: float | None = None,
    activation: str = "swiglu",
    alpha: float = OAI_ALPHA,
):
    """(dg, du) of swiglu from the stored g, u and the incoming dh, unrounded, in swiglu's compute dtype.

    With z = a ("swiglu") or alpha * a ("swiglu_oai"), f = b or b + 1, s = sigmoid(z):
    dg = (dh * f) * (s * (1 + z * (1 - s))), except 0 where g > L; du = dh * (a * s), except 0 where |u| > L.
    For numbers these are torch.clamp's autograd masks (inclusive at
    +-L); a NaN g or u is not clamped, so its gradient passes as NaN (torch.clamp's would be 0: docs/semantics.md).
    """
    _check_activation(activation, alpha)
    a, b = _clamped(g, u, limit)
    dh = dh.to(a.dtype)
    z, f = _gate_argument(a, activation, alpha), _up_factor(b, activation)
    s = torch.sigmoid(z)
    dg = dh * f * (s * (1 + z * (1 - s)))
    du = dh * (a * s)
    if limit is not None:
        # Masks compare in the compute dtype: a bf16 comparison would round L to bf16.
        gc, uc = g.to(a.dtype), u.to(a.dtype)
        zero = torch.zeros((), dtype=a.dtype, device=a.device)
        dg = torch.where(gc > limit, zero, dg)
        du = torch.where((uc > limit) | (uc < -limit), zero, du)
    return dg, du


def expert_forward(
    x: torch.Tensor,
    weights: ExpertWeights,
    *,
    swiglu_limit: float | None = None,
    precision: str = "bf16",
    activation: str = "swiglu",
    alpha: float = OAI_ALPHA,
) -> ExpertActivations:
    """One expert on its rows x [T, H] (canonical row order): g, u = x W_gate^T + b_gate, x W_up^T + b_up;
    h = swiglu(g, u); y = h W_down^T + b_down (a bias added to the fp32 sum before it is stored).
    GEMMs accumulate in fp32 and store bf16; MXFP8 weights (weights.is_mxfp8) quantise x and h
    along their last dim first. precision="float64": all float64, no rounding (bf16 weights only)."""
    p = _Precision(precision, weights)
    xa = p.act(x)
    g = p.store(p.biased(p.gemm(xa, p.weight(weights.gate, "rowwise")), weights.gate_bias))
    u = p.store(p.biased(p.gemm(xa, p.weight(weights.up, "rowwise")), weights.up_bias))
    h = p.store(swiglu(g, u, swiglu_limit, activation, alpha))
    y = p.store(p.biased(p.gemm(p.act(h), p.weight(weights.down, "rowwise")), weights.down_bias))
    return ExpertActivations(g, u, h, y)


def expert_backward(
    x: torch.Tensor,
    weights: ExpertWeights,
    act: ExpertActivations,
    dy: torch.Tensor,
    *,
    swiglu_limit: float | None = None,
    precision: str = "bf16",
    activation: str = "swiglu",
    alpha: float = OAI_ALPHA,
) -> ExpertGradients:
    """Backward of expert_forward on the same rows, given dy [T, H] (stored: bf16, or float64 in the oracle).

    dh = dy W_down; (dg, du) = swiglu_backward; dx = [dg du] [W_gate; W_up] in one fp32 accumulation; all stored.
    Weight gradients dW_down = dy^T h, dW_gate = dg^T x, dW_up = du^T x reduce over the rows in fp32 (in MXFP8 mode
    each operand is quantised along the rows: blocks of 32 rows from the first row, a partial last block).
    """
    p = _Precision(precision, weights)
    dy = p.store(dy)
    dh = p.store(p.gemm(p.act(dy), p.weight(weights.down, "colwise")))
    dg, du = (p.store(d) for d in swiglu_backward(act.g, act.u, dh, swiglu_limit, activation, alpha))
    dgu = torch.cat([p.act(dg), p.act(du)], dim=1)
    w_gu = torch.cat([p.weight(weights.gate, "colwise"), p.weight(weights.up, "colwise")], dim=1)
    dx = p.store(p.gemm(dgu, w_gu))
    x_t = p.act(x.t())
    dg_t, du_t, dy_t = p.act(dg.t()), p.act(du.t()), p.act(dy.t())
    # A bias's gradient: the rows' sum of dg, du or dy as its weight gradient reads them.
    return ExpertGradients(
        dx=dx,
        gate=p.gemm(dg_t, x_t),
        up=p.gemm(du_t, x_t),
        down=p.gemm(dy_t, p.act(act.h.t())),
        gate_bias=None if weights.gate_bias is None else dg_t.sum(1),
        up_bias=None if weights.up_bias is None else du_t.sum(1),
        down_bias=None if weights.down_bias is None else dy_t.sum(1),
    )


def combine(
    slots: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    first: torch.Tensor | None = None,
    *,
    precision: str = "bf16",
) -> torch.Tensor:
    """out_t = store(float(first_t) + sum_k w_k * float(slots[t, k])), summed in fp32 (float64 in the oracle) with
    `first` (the shared expert's term; 0 when None) first, then k = 0..K-1 in order. Each product is rounded before
    its addition (no fused multiply-add). Slots whose id is -1 are skipped. topk_weights None means w = 1 (the
    backward's dx sum). slots [T, K, H]; returns [T, H] bf16 (float64 in the oracle)."""
    acc_dtype = _acc_dtype(precision)
    T, K, H = slots.shape
    acc = torch.zeros(T, H, dtype=acc_dtype, device=slots.device) if first is None else first.to(acc_dtype)
    for k in range(K):
        term = slots[:, k].to(acc_dtype)
        if topk_weights is not None:
            term = topk_weights[:, k : k + 1].to(acc_dtype) * term
        acc = torch.where(topk_ids[:, k : k + 1] >= 0, acc + term, acc)
    return acc.to(_store_dtype(precision))


def routing_weight_gradient(rows: torch.Tensor, slots: torch.Tensor, topk_ids: torch.Tensor,
                            precision: str = "bf16") -> torch.Tensor:
    """dw[t, k] = <rows_t, slots[t, k]> over H in fp32 (float64 in the oracle), 0 for a -1 route: dOut and the y
    slots when the weights scale the outputs, x and the dx slots when they scale the inputs. Computed directly,
    never recovered by dividing something by w_k."""
    acc = _acc_dtype(precision)
    return torch.where(topk_ids >= 0, (rows.to(acc)[:, None, :] * slots.to(acc)).sum(-1), 0).to(acc)


def shared_gate(x: torch.Tensor, router: torch.Tensor, precision: str = "bf16") -> torch.Tensor:
    """The gated shared expert's per-token gate g_t = sigmoid(x_t . router), [T], in fp32 (float64 in the oracle)."""
    acc = _acc_dtype(precision)
    return torch.sigmoid(x.to(acc) @ router.to(acc))


def shared_term(y: torch.Tensor, x: torch.Tensor, router: torch.Tensor | None, precision: str = "bf16"):
    """The shared expert's term of out (combine's `first`): its stored output y [T, H], or g_t * y_t in fp32 (one
    rounding) when gated."""
    return y if router is None else shared_gate(x, router, precision)[:, None] * y.to(_acc_dtype(precision))


class SharedGateBackward(NamedTuple):
    """The gate's part of the backward: dy = store(g_t * dOut_t) (what the shared expert's backward reads) and
    dlogit_t = (ds_t * g_t) * (1 - g_t), ds_t = <dOut_t, y_t> (fp32, float64 in the oracle)."""

    dy: torch.Tensor
    dlogit: torch.Tensor

    def input_gradient(self, dx: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
        """The shared expert's dx with the gate's term: store(dx_t + dlogit_t * router)."""
        return (dx.to(self.dlogit.dtype) + self.dlogit[:, None] * router.to(self.dlogit.dtype)).to(dx.dtype)

    def router_gradient(self, x: torch.Tensor) -> torch.Tensor:
        """d router = sum_t dlogit_t * x_t, [H] in the accumulation dtype."""
        return (self.dlogit[:, None] * x.to(self.dlogit.dtype)).sum(0)


def shared_gate_backward(x, router, y, dout, precision: str = "bf16") -> SharedGateBackward:
    """x, y (the stored shared output), dout [T, H]."""
    acc = _acc_dtype(precision)
    gate = shared_gate(x, router, precision)
    d = dout.to(acc)
    ds = (d * y.to(acc)).sum(-1)
    return SharedGateBackward((gate[:, None] * d).to(_store_dtype(precision)), ds * gate * (1 - gate))


# ----------------------------------------------------------------------------------------------------------------
# The whole layer


@dataclasses.dataclass(frozen=True, eq=False)  # tensors: compare by identity
class Routing:
    """The routed (token, k) pairs in canonical order: expert-major, then ascending token, then k.

    slots:  [R] int64 flat slot indices t * K + k (-1 routes left out).
    tokens: [R] int64 token index of each row.
    counts: rows per expert (a list of E ints); segments() gives each expert's slice of slots and tokens.
    """

    slots: torch.Tensor
    tokens: torch.Tensor
    counts: list

    def segments(self):
        """(expert, slice) for every expert, in expert order (empty experts included)."""
        start = 0
        for e, n in enumerate(self.counts):
            yield e, slice(start, start + n)
            start += n


def route(topk_ids: torch.Tensor, num_experts: int) -> Routing:
    """Canonical row order for topk_ids [T, K] (ids in [-1, num_experts))."""
    K = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).to(torch.int64)
    slots = torch.nonzero(flat >= 0).flatten()  # ascending t * K + k = ascending (t, k)
    order = torch.sort(flat[slots], stable=True).indices  # stable: (t, k) order kept inside each expert
    slots = slots[order]
    counts = torch.bincount(flat[slots], minlength=num_experts).tolist()
    return Routing(slots=slots, tokens=slots // K, counts=counts)


@dataclasses.dataclass(frozen=True, eq=False)  # tensors: compare by identity
class Context:
    """What the forward keeps for the backward."""

    x: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    routed: RoutedExperts | RoutedExpertsMXFP8
    shared: SharedExpert | None
    swiglu_limit: float | None
    precision: str
    routing: Routing
    activations: list  # ExpertActivations per expert, in expert order
    shared_activations: ExpertActivations | None
    y_slots: torch.Tensor  # [T, K, H] stored y_k (zeros for -1 routes)
    activation: str = "swiglu"
    alpha: float = OAI_ALPHA
    routing_scale: str = "output"  # "input": the experts ran on scaled_rows(), out summed the y_k unweighted


def scaled_rows(x: torch.Tensor, topk_weights: torch.Tensor, routing: Routing, precision: str) -> torch.Tensor:
    """Each routed row's expert input with routing_scale="input" (Llama4): store(w_k * x_t), the product in fp32
    (float64 in the oracle), rows in canonical order."""
    acc = _acc_dtype(precision)
    w_rows = topk_weights.reshape(-1)[routing.slots].to(acc)[:, None]
    return (w_rows * x[routing.tokens].to(acc)).to(_store_dtype(precision))


def forward(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    routed: RoutedExperts | RoutedExpertsMXFP8,
    shared: SharedExpert | None = None,
    *,
    swiglu_limit: float | None = None,
    precision: str = "bf16",
    activation: str = "swiglu",
    alpha: float = OAI_ALPHA,
    routing_scale: str = "output",
):
    """The layer's forward on one process: returns (out [T, H], Context).

    activation "swiglu" (default) or "swiglu_oai" (gpt-oss) with its alpha: see swiglu().
    routing_scale "output" (default): out = shared + sum_k w_k y_k(x); "input" (Llama4): expert k runs on
    store(w_k * x_t) and out = shared + sum_k y_k (docs/semantics.md).

    x [T, H] bf16; topk_ids [T, K] int32/int64 in [-1, E) (-1 = no route); topk_weights [T, K] fp32.
    MXFP8 mode is selected by passing RoutedExpertsMXFP8. precision="float64" is the oracle (float64 out).
    """
    _check_inputs(x, topk_ids, topk_weights, routed, shared, swiglu_limit, precision)
    _check_activation(activation, alpha)
    if routing_scale not in ("output", "input"):
        raise ValueError(f"routing_scale must be 'output' or 'input', got {routing_scale!r}")
    act_args = dict(swiglu_limit=swiglu_limit, precision=precision, activation=activation, alpha=alpha)
    if precision == "float64" and isinstance(routed, RoutedExpertsMXFP8):
        routed = routed.master  # the oracle is the exact math the MXFP8 mode approximates
    T, K = topk_ids.shape
    H = x.shape[1]
    store = _store_dtype(precision)
    x = x.to(store)  # a no-op in bf16 mode
    routing = route(topk_ids, routed.num_experts)
    x_rows = scaled_rows(x, topk_weights, routing, precision) if routing_scale == "input" else x[routing.tokens]
    y_slots = torch.zeros(T * K, H, dtype=store, device=x.device)
    activations = []
    for e, rows in routing.segments():
        act = expert_forward(x_rows[rows], routed.expert(e), **act_args)
        y_slots[routing.slots[rows]] = act.y
        activations.append(act)
    shared_act = None
    if shared is not None:
        shared_act = expert_forward(x, shared.expert(), **act_args)
    y_slots = y_slots.view(T, K, H)
    first = None if shared_act is None else shared_term(shared_act.y, x, shared.router, precision)
    out_weights = None if routing_scale == "input" else topk_weights  # input: the y_k add unweighted
    out = combine(y_slots, topk_ids, out_weights, first, precision=precision)
    ctx = Context(
        x, topk_ids, topk_weights, routed, shared, swiglu_limit, precision, routing, activations, shared_act, y_slots,
        activation, alpha, routing_scale,
    )
    return out, ctx


def backward(ctx: Context, dout: torch.Tensor) -> Gradients:
    """All gradients of the layer given dout [T, H] (bf16; any float dtype in the oracle)."""
    x, precision, routing = ctx.x, ctx.precision, ctx.routing
    master = ctx.routed.master if isinstance(ctx.routed, RoutedExpertsMXFP8) else ctx.routed
    T, K = ctx.topk_ids.shape
    H = x.shape[1]
    _check_dout(dout, (T, H), precision, x.device)
    store, acc = _store_dtype(precision), _acc_dtype(precision)
    dout = dout.to(store)
    # dw_k = <dOut_t, y_k> directly: never recovered by dividing something by w_k.
    dw = routing_weight_gradient(dout, ctx.y_slots, ctx.topk_ids, precision)

    w_rows = ctx.topk_weights.reshape(-1)[routing.slots].to(acc)[:, None]
    dy_rows = (w_rows * dout[routing.tokens].to(acc)).to(store)
    x_rows = x[routing.tokens]
    input_scale = ctx.routing_scale == "input"
    if input_scale:  # the expert's input was store(w_k x): dy is dOut itself
        dy_rows, x_rows = dout[routing.tokens], scaled_rows(x, ctx.topk_weights, routing, precision)
    dx_slots = torch.zeros(T * K, H, dtype=store, device=x.device)
    wgrads = []
    for e, rows in routing.segments():
        grads = expert_backward(
            x_rows[rows],
            ctx.routed.expert(e),
            ctx.activations[e],
            dy_rows[rows],
            swiglu_limit=ctx.swiglu_limit,
            precision=precision,
            activation=ctx.activation,
            alpha=ctx.alpha,
        )
        dx_slots[routing.slots[rows]] = grads.dx
        wgrads.append(grads)

    shared, shared_dx, router_grad = None, None, None
    if ctx.shared is not None:
        router = ctx.shared.router
        gated = None if router is None else shared_gate_backward(x, router, ctx.shared_activations.y, dout, precision)
        shared = expert_backward(
            x, ctx.shared.expert(), ctx.shared_activations, dout if gated is None else gated.dy,
            swiglu_limit=ctx.swiglu_limit, precision=precision, activation=ctx.activation, alpha=ctx.alpha,
        )
        shared_dx = shared.dx if gated is None else gated.input_gradient(shared.dx, router)
        router_grad = None if gated is None else gated.router_gradient(x)
    dx_slots = dx_slots.view(T, K, H)
    if input_scale:  # dx_k is w.r.t. store(w_k x): dx = shared + sum_k w_k dx_k; dw_k = <x_t, dx_k>, x unscaled
        dw = routing_weight_gradient(x, dx_slots, ctx.topk_ids, precision)
    dx_weights = ctx.topk_weights if input_scale else None
    dx = combine(dx_slots, ctx.topk_ids, dx_weights, shared_dx, precision=precision)
    return Gradients(
        x=dx,
        topk_weights=dw,
        gate=torch.stack([g.gate for g in wgrads]),
        up=torch.stack([g.up for g in wgrads]),
        down=torch.stack([g.down for g in wgrads]),
        shared_gate=None if shared is None else shared.gate,
        shared_up=None if shared is None else shared.up,
        shared_down=None if shared is None else shared.down,
        **{n: torch.stack([getattr(g, n) for g in wgrads]) for n in BIAS_NAMES if getattr(master, n) is not None},
        shared_router=router_grad,
    )


# ----------------------------------------------------------------------------------------------------------------
# Internals


class _Precision:
    """How one expert's GEMMs see their operands, for a precision and a kind of weights."""

    def __init__(self, precision: str, weights: ExpertWeights):
        _check_precision(precision)
        if precision == "float64" and weights.is_mxfp8:
            raise TypeError("weights must be bf16 for precision='float64' (the oracle runs on the bf16 masters)")
        self.mxfp8 = weights.is_mxfp8
        self.acc_dtype = _acc_dtype(precision)
        self.store_dtype = _store_dtype(precision)

    def store(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.store_dtype)

    def biased(self, t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """A GEMM's sum t with its bf16 bias (per column) added in the accumulation dtype, or t."""
        return t if bias is None else t + bias.to(self.acc_dtype)

    def act(self, t: torch.Tensor) -> torch.Tensor:
        """An activation operand [M, K] blocked along its last dim, in the accumulation dtype."""
        return mxfp8_fake_quantize(t, nonfinite="nan") if self.mxfp8 else t.to(self.acc_dtype)

    def weight(self, w, orientation: str) -> torch.Tensor:
        """A weight as the [N, K] operand of a GEMM: 'rowwise' = as stored, 'colwise' = transposed."""
        if isinstance(w, MXFP8Pair):
            return getattr(w, orientation).dequantize(self.acc_dtype)
        return (w if orientation == "rowwise" else w.t()).to(self.acc_dtype)

    @staticmethod
    def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a [M, K] times b [N, K]^T, accumulated in a's dtype (products of bf16 or MXFP8 values are exact in fp32)."""
        return a @ b.t()


def _gate_argument(a: torch.Tensor, activation: str, alpha: float) -> torch.Tensor:
    """sigmoid's argument: a, or alpha * a rounded to a's dtype (alpha as that dtype: fp32 in the bf16 modes)."""
    return a if activation == "swiglu" else torch.tensor(alpha, dtype=a.dtype, device=a.device) * a


def _up_factor(b: torch.Tensor, activation: str) -> torch.Tensor:
    return b if activation == "swiglu" else b + 1


def _check_activation(activation, alpha) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if activation == "swiglu_oai" and not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0 with activation 'swiglu_oai', got {alpha!r}")


def _clamped(g: torch.Tensor, u: torch.Tensor, limit: float | None):
    dtype = torch.float64 if torch.float64 in (g.dtype, u.dtype) else torch.float32
    a, b = g.to(dtype), u.to(dtype)
    if limit is None:
        return a, b
    return a.clamp(max=limit), b.clamp(-limit, limit)


def _acc_dtype(precision: str) -> torch.dtype:
    return torch.float64 if precision == "float64" else torch.float32


def _store_dtype(precision: str) -> torch.dtype:
    return torch.float64 if precision == "float64" else torch.bfloat16


def _check_precision(precision) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def _check_inputs(x, topk_ids, topk_weights, routed, shared, limit, precision) -> None:
    _check_precision(precision)
    if not isinstance(routed, (RoutedExperts, RoutedExpertsMXFP8)):
        raise TypeError(f"routed must be RoutedExperts or RoutedExpertsMXFP8, got {type(routed).__name__}")
    if shared is not None and not isinstance(shared, SharedExpert):
        raise TypeError(f"shared must be a SharedExpert or None, got {type(shared).__name__}")
    _check_tensor(x, "x", 2)
    _check_tensor(topk_ids, "topk_ids", 2)
    _check_tensor(topk_weights, "topk_weights", 2)
    H, E = routed.hidden_size, routed.num_experts
    if x.dtype != torch.bfloat16 and not (precision == "float64" and x.is_floating_point()):
        raise TypeError(f"x must be bfloat16, got {x.dtype}")
    if x.shape[1] != H:
        raise ValueError(f"x must be [T, H] with H = {H} (the experts' hidden size), got {tuple(x.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_ids.shape[0] != x.shape[0] or topk_ids.shape[1] < 1:
        raise ValueError(
            f"topk_ids must be [T, K] with T = {x.shape[0]} (x's tokens) and K >= 1, got {tuple(topk_ids.shape)}"
        )
    if topk_ids.numel() and not bool(((topk_ids >= -1) & (topk_ids < E)).all()):
        raise ValueError(f"topk_ids values must be in [-1, {E}) (-1 = no route, {E} experts)")
    if topk_weights.dtype != torch.float32 and not (precision == "float64" and topk_weights.is_floating_point()):
        raise TypeError(f"topk_weights must be float32, got {topk_weights.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}"
        )
    if shared is not None and shared.hidden_size != H:
        raise ValueError(f"shared must have hidden size {H} (the routed experts'), got {shared.hidden_size}")
    if limit is not None and not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit > 0):
        raise ValueError(f"swiglu_limit must be None or a finite number > 0, got {limit!r}")
    devices = {t.device for t in (x, topk_ids, topk_weights, _any_weight(routed))}
    if len(devices) != 1:
        raise ValueError(
            f"x, topk_ids, topk_weights and the experts must be on one device, got {sorted(map(str, devices))}"
        )


def _check_tensor(t, name: str, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")


def _check_dout(dout, shape: tuple, precision: str, device) -> None:
    _check_tensor(dout, "dout", 2)
    if tuple(dout.shape) != shape:
        raise ValueError(f"dout must have the output's shape {shape}, got {tuple(dout.shape)}")
    if dout.dtype != torch.bfloat16 and not (precision == "float64" and dout.is_floating_point()):
        raise TypeError(f"dout must be bfloat16, got {dout.dtype}")
    if dout.device != device:
        raise ValueError(f"dout must be on x's device {device}, got {dout.device}")


def _any_weight(routed) -> torch.Tensor:
    return (routed.master if isinstance(routed, RoutedExpertsMXFP8) else routed).gate
