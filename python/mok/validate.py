"""Argument checks for the layer, run before any work starts, with the same verdict on every rank.

Each rank checks its own arguments, then the group exchanges one small record per rank (the error, if any, and
the shapes that must agree). Every rank then raises the same error, prefixed with the lowest failing rank, so a
bad argument on one rank can never leave the others blocked in a collective.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch
import torch.distributed as dist

from mok.experts import RoutedExperts, RoutedExpertsMXFP8, SharedExpert
from mok.quant import padding_offsets, scale_bytes

# libmok's limits, mirrored from its C ABI (kernel/src/api/limits.hpp; docs/c-api.md "Config
# rules") so that Python rejects a value before it reaches libmok, naming what the user passed. Every backend
# applies them: a call that works on one backend works on all.
MAX_WORLD = 72  # config.world: the group's size
MAX_HIDDEN = 1 << 20  # config.hidden: x.shape[1]
MAX_INTERMEDIATE = 1 << 20  # config.intermediate, config.shared_intermediate: routed I, shared I_s
MAX_EXPERTS_PER_RANK = 1 << 20  # config.experts_per_rank: routed E_local
MAX_TOPK = 1 << 10  # config.top_k: topk_ids.shape[1]
MAX_TOKENS = 1 << 24  # config.max_tokens: tokens (rows of x) per rank
MAX_MINIBATCH = 1 << 24  # config.minibatch: MoKConfig.minibatch_size
MAX_MACROBATCH = 1 << 26  # config.macrobatch: MoKConfig.macrobatch_size
MAX_COMM_WORKERS, MAX_COMPUTE_WORKERS = 64, 256  # config.comm_workers, config.compute_workers: MoKConfig.host_*
MIN_TIMEOUT_MS, MAX_TIMEOUT_MS = 1, 24 * 3600 * 1000  # config.timeout_ms: MoKConfig.wait_timeout_s
MXFP8_PADDING = 32  # config.expert_padding is a multiple of this in MXFP8 precision
MAX_ROWS = 2**31 - 1  # world x max_tokens x top_k + E_local x expert_padding (the routed rows a rank can receive)


def timeout_ms(seconds: float) -> int:
    """MoKConfig.wait_timeout_s as libmok's config.timeout_ms: whole milliseconds, rounded to nearest."""
    return max(MIN_TIMEOUT_MS, round(seconds * 1000))


class LayerShape(NamedTuple):
    """What every rank of the group must agree on (token counts may differ)."""

    hidden: int
    topk: int
    num_local_experts: int
    intermediate: int
    shared_intermediate: int  # 0 without a shared expert
    mxfp8: bool
    swiglu_limit: float | None
    expert_padding: int = 0  # MoKConfig.expert_padding (the call's, or its workspace's); set by the caller
    activation: str = "swiglu"  # "swiglu" or "swiglu_oai"
    alpha: float | None = None  # swiglu_oai's alpha; None with "swiglu"
    routing_scale: str = "output"  # "output" (w_k scales y_k) or "input" (Llama4: w_k scales the expert's input)
    biases: bool = False  # the routed experts carry biases (gate_bias, up_bias or down_bias)


def check_layer_args(x, topk_ids, topk_weights, routed, shared, swiglu_limit, world: int, activation="swiglu",
                     alpha=None, routing_scale="output") -> LayerShape:
    """Check one rank's arguments; return the shape record to agree on. Raises TypeError/ValueError naming the
    argument and the rule."""
    _check_tensor(x, "x", (torch.bfloat16,), ndim=2)
    _check_tensor(topk_ids, "topk_ids", (torch.int32, torch.int64), ndim=2, device=x.device)
    _check_tensor(topk_weights, "topk_weights", (torch.float32,), ndim=2, device=x.device)
    tokens, hidden = x.shape
    topk = topk_ids.shape[1]
    _check_at_most(tokens, MAX_TOKENS, "x must have at most 2^24 tokens (rows) per rank")
    _check_at_most(hidden, MAX_HIDDEN, "x.shape[1] (the hidden size) must be at most 2^20")
    check_routing_limits(topk_ids, world)
    if topk_ids.shape[0] != tokens:
        raise ValueError(f"topk_ids must have one row per token of x ({tokens}), got shape {tuple(topk_ids.shape)}")
    if topk < 1:
        raise ValueError(f"topk_ids must have at least one column (K >= 1), got shape {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)} (same T and K), "
                         f"got {tuple(topk_weights.shape)}")
    _check_routed(routed, hidden, x.device)
    _check_shared(shared, hidden, x.device)
    _check_at_most(routed.num_experts, MAX_EXPERTS_PER_RANK, "routed experts' E_local (gate.shape[0]) must be at most "
                   "2^20")
    _check_at_most(routed.intermediate_size, MAX_INTERMEDIATE, "routed experts' I (gate.shape[1]) must be at most 2^20")
    if shared is not None:
        _check_at_most(shared.intermediate_size, MAX_INTERMEDIATE, "shared expert's I_s (gate.shape[0]) must be at "
                       "most 2^20")
    limit = check_swiglu_limit(swiglu_limit)
    activation, alpha = check_activation(activation, alpha)
    routing_scale = check_routing_scale(routing_scale)
    num_local = routed.num_experts
    check_expert_ids(topk_ids, world * num_local)
    return LayerShape(hidden, topk, num_local, routed.intermediate_size,
                      0 if shared is None else shared.intermediate_size,
                      isinstance(routed, RoutedExpertsMXFP8), limit, activation=activation, alpha=alpha,
                      routing_scale=routing_scale, biases=bool(_master(routed).biases()))


def _master(routed):
    """The bf16 experts: RoutedExperts itself, or RoutedExpertsMXFP8's masters."""
    return routed.master if isinstance(routed, RoutedExpertsMXFP8) else routed


def check_routing_limits(topk_ids: torch.Tensor, world: int) -> None:
    """libmok's limits on what topk_ids [T, K] and the group describe (T <= 2^24, K <= 1024, W <= 72)."""
    _check_at_most(topk_ids.shape[0], MAX_TOKENS, "topk_ids must have at most 2^24 rows (tokens) per rank")
    _check_at_most(topk_ids.shape[1], MAX_TOPK, "topk_ids must have at most 1024 columns (K <= 1024)")
    _check_at_most(world, MAX_WORLD, "the group must have at most 72 ranks")


def check_mxfp8_padding(mxfp8: bool, expert_padding: int) -> None:
    """MXFP8 experts need tiles of whole 32-row token blocks (libmok's config.expert_padding rule, on every backend)."""
    if mxfp8 and expert_padding % MXFP8_PADDING:
        raise ValueError(f"MoKConfig.expert_padding must be a multiple of 32 with MXFP8 experts (token blocks "
                         f"start on tiles), got {expert_padding}")


def capturing(t) -> bool:
    """Whether t is a CUDA tensor whose device's current stream is being captured into a CUDA graph."""
    return getattr(t, "is_cuda", False) and _stream_capturing(t.device)


def capturing_on(device: torch.device) -> bool:
    """Whether `device` is a CUDA device whose current stream is being captured into a CUDA graph."""
    return device.type == "cuda" and _stream_capturing(device)


def _stream_capturing(device) -> bool:
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def reads_values(t: torch.Tensor) -> bool:
    """Whether a check may read t's values on the host: not while the current stream of t's CUDA device is being
    captured into a CUDA graph, where the read's synchronisation is an error. libmok's cuda executor checks the ids
    on the device then (its schedule build records a bad one: the layer's next call raises it)."""
    return not capturing(t)


def check_expert_ids(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Every id is -1 (no route) or a global expert in [0, num_experts) (unless a graph is being captured)."""
    if topk_ids.numel() == 0 or not reads_values(topk_ids):
        return
    low, high = int(topk_ids.min()), int(topk_ids.max())
    if low < -1 or high >= num_experts:
        bad = low if low < -1 else high
        raise ValueError(f"topk_ids must be -1 (no route) or an expert id in [0, {num_experts}) "
                         f"(world size x E_local), got {bad}")


def check_swiglu_limit(limit) -> float | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        raise TypeError(f"swiglu_limit must be None or a positive float, got {type(limit).__name__}")
    if not (math.isfinite(limit) and limit > 0):
        raise ValueError(f"swiglu_limit must be None or a finite float > 0, got {limit}")
    if not _FLOAT32.tiny <= limit <= _FLOAT32.max:
        # libmok takes the clamp as a float: 1e-50 would become 0 there, which means "no clamp".
        raise ValueError(f"swiglu_limit must be None or a normal float32 > 0 (between {_FLOAT32.tiny:.4g} and "
                         f"{_FLOAT32.max:.4g}; libmok's config.swiglu_limit is a float), got {limit}")
    return float(limit)


ROUTING_SCALES = ("output", "input")


def check_routing_scale(routing_scale) -> str:
    """Where the routing weights apply: "output" (out = shared + sum_k w_k y_k(x), the default) or "input"
    (Llama4: out = shared + sum_k y_k(bf16(w_k x)))."""
    if not isinstance(routing_scale, str):
        raise TypeError(f"routing_scale must be \"output\" or \"input\", got {type(routing_scale).__name__}")
    if routing_scale not in ROUTING_SCALES:
        raise ValueError(f"routing_scale must be \"output\" or \"input\", got {routing_scale!r}")
    return routing_scale


_FLOAT32 = torch.finfo(torch.float32)
ACTIVATIONS = ("swiglu", "swiglu_oai")
OAI_ALPHA = 1.702  # gpt-oss's alpha, swiglu_oai's default


def check_activation(activation, alpha) -> tuple[str, float | None]:
    """(activation, alpha) as the layer takes them: alpha None with "swiglu"; with "swiglu_oai" a finite float32 > 0,
    1.702 (gpt-oss) when None."""
    if not isinstance(activation, str):
        raise TypeError(f"activation must be \"swiglu\" or \"swiglu_oai\", got {type(activation).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be \"swiglu\" or \"swiglu_oai\", got {activation!r}")
    if activation == "swiglu":
        if alpha is not None:
            raise ValueError(f"alpha must be None with activation=\"swiglu\" (it is swiglu_oai's), got {alpha!r}")
        return activation, None
    if alpha is None:
        return activation, OAI_ALPHA
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be None or a positive float with activation=\"swiglu_oai\", got "
                        f"{type(alpha).__name__}")
    if not (math.isfinite(alpha) and _FLOAT32.tiny <= alpha <= _FLOAT32.max):
        # libmok takes alpha as a float (config.swiglu_alpha): finite and > 0 there too.
        raise ValueError(f"alpha must be None or a finite float > 0 (a normal float32) with "
                         f"activation=\"swiglu_oai\", got {alpha}")
    return activation, float(alpha)


def agree_across_group(group, world: int, error: Exception | None, shape: LayerShape | None = None,
                       tokens: int = 0) -> list[int]:
    """Raise on every rank if any rank failed its checks or the ranks' shapes disagree; else return every
    rank's token count. One all_gather of a small record per rank."""
    if world == 1:
        if error is not None:
            raise error
        return [tokens]
    records = [None] * world
    dist.all_gather_object(records, (_portable(error), shape, tokens), group=group)
    for rank, (err, _, _) in enumerate(records):
        if err is not None:
            kind, message = err
            raise kind(f"rank {rank}: {message}")
    if shape is not None:
        for field in LayerShape._fields:
            values = [getattr(s, field) for _, s, _ in records]
            if len(set(values)) > 1:
                listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
                raise ValueError(f"every rank of the group must have the same {field} ({_FIELD_SOURCE[field]}), "
                                 f"got {listing}")
    return [t for _, _, t in records]


def check_dout(dout, x_shape: tuple, device) -> None:
    """The backward's incoming gradient: bf16, the output's shape, x's device, contiguous."""
    _check_tensor(dout, "dout", (torch.bfloat16,), ndim=2, device=device)
    if tuple(dout.shape) != tuple(x_shape):
        raise ValueError(f"dout must have the output's shape {tuple(x_shape)}, got {tuple(dout.shape)}")


def check_y_slots(y_slots, shape: tuple, device) -> None:
    """The forward's y_slots handed back to a recompute: None, or bf16 [T, K, H] on x's device, contiguous."""
    if y_slots is None:
        return
    _check_tensor(y_slots, "y_slots", (torch.bfloat16,), ndim=3, device=device)
    if tuple(y_slots.shape) != tuple(shape):
        raise ValueError(f"y_slots must be the forward's [T, K, H] = {tuple(shape)}, got {tuple(y_slots.shape)}")


def check_main_grads(main_grads, routed, shared) -> None:
    """Each buffer given is float32, shaped like its weight, on its weight's device, contiguous, and shares no
    memory with another buffer (None = not given). Executors add into the buffers through their data (libmok
    through a raw pointer), so a strided view would get the wrong elements and an expanded one (stride 0) would
    be written past its end."""
    if main_grads is None:
        return
    master = _master(routed)
    weights = {"gate": master.gate, "up": master.up, "down": master.down}
    for part in ("gate", "up", "down", "router"):
        weights[f"shared_{part}"] = None if shared is None else getattr(shared, part)
    for name in ("gate_bias", "up_bias", "down_bias"):
        weights[name] = getattr(master, name)
    for name, weight in weights.items():
        buf = getattr(main_grads, name)
        if buf is None:
            continue
        if weight is None:
            what = ("routed has no " + name if name.endswith("_bias") else
                    "the shared expert has no router" if shared is not None else "the layer has no shared expert")
            raise ValueError(f"main_grads.{name} must be None: {what}")
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.float32:
            raise TypeError(f"main_grads.{name} must be a float32 tensor, got "
                            f"{getattr(buf, 'dtype', type(buf).__name__)}")
        if buf.shape != weight.shape or buf.device != weight.device:
            raise ValueError(f"main_grads.{name} must have its weight's shape {tuple(weight.shape)} on "
                             f"{weight.device}, got {tuple(buf.shape)} on {buf.device}")
        check_layout(buf, f"main_grads.{name}")
    _check_disjoint({n: getattr(main_grads, n) for n in weights if getattr(main_grads, n) is not None}, "main_grads")


_FIELD_SOURCE = {
    "hidden": "x.shape[1]",
    "topk": "topk_ids.shape[1]",
    "num_local_experts": "routed E_local",
    "intermediate": "routed I",
    "shared_intermediate": "shared I_s, 0 without shared",
    "mxfp8": "routed is RoutedExpertsMXFP8",
    "swiglu_limit": "swiglu_limit",
    "activation": "activation",
    "alpha": "alpha",
    "routing_scale": "routing_scale",
    "expert_padding": "MoKConfig.expert_padding",
}


def _portable(error: Exception | None):
    if error is None:
        return None
    kind = type(error) if isinstance(error, (TypeError, ValueError)) else RuntimeError
    return kind, str(error)


def check_layout(t: torch.Tensor, name: str) -> None:
    """t is dense and row-major (is_contiguous): executors read it, and libmok reads and writes it, as one flat
    array from its data pointer. Strided views (t.t(), slices) and expanded ones (stride 0) are not."""
    if t.is_contiguous():
        return
    zero = [d for d, (n, s) in enumerate(zip(t.shape, t.stride(), strict=True)) if n > 1 and s == 0]
    why = f" (dim {zero[0]} has stride 0: an expand()ed view)" if zero else ""
    raise ValueError(f"{name} must be contiguous (call .contiguous()), got shape {tuple(t.shape)} strides "
                     f"{t.stride()}{why}")


def _check_disjoint(tensors: dict, what: str) -> None:
    """No two of `tensors` (contiguous) share memory: each is written as its own buffer."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), n) for n, t in tensors.items()
                   if t.numel())
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise ValueError(f"{what}.{second} must not share memory with {what}.{first} (each is its own buffer)")


def _check_at_most(value: int, limit: int, rule: str) -> None:
    if value > limit:
        raise ValueError(f"{rule} (libmok's limit), got {value}")


def _check_tensor(t, name: str, dtypes: tuple, ndim: int, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be {allowed}, got {str(t.dtype).removeprefix('torch.')}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on x's device {device}, got {t.device}")
    check_layout(t, name)


def _check_routed(routed, hidden: int, device) -> None:
    if not isinstance(routed, (RoutedExperts, RoutedExpertsMXFP8)):
        raise TypeError(f"routed must be a RoutedExperts or RoutedExpertsMXFP8, got {type(routed).__name__}")
    if routed.hidden_size != hidden:
        raise ValueError(f"routed experts' hidden size must equal x.shape[1] ({hidden}), got {routed.hidden_size}")
    master = _master(routed)
    _check_weights(master, "routed", device)
    if isinstance(routed, RoutedExpertsMXFP8):
        _check_mxfp8_forms(routed, device)


def _check_mxfp8_forms(routed, device) -> None:
    """Each MXFP8 form's data and scales: on x's device and contiguous (libmok reads them through pointers as
    the dense arrays mxfp8_quantize writes; a strided copy with the same values would be read wrongly), and its
    scales in the SM100 layout with finite padding."""
    for part in ("gate", "up", "down"):
        for form in ("rowwise", "colwise"):
            q = getattr(getattr(routed, part), form)
            for kind in ("data", "scales"):
                t, name = getattr(q, kind), f"routed.{part}.{form}.{kind}"
                if t.device != device:
                    raise ValueError(f"{name} must be on x's device {device}, got {t.device}")
                check_layout(t, name)
            _check_mxfp8_scales(q, f"routed.{part}.{form}.scales")


def _check_mxfp8_scales(q, name: str) -> None:
    """q.scales holds each [R, C] matrix's scales in the SM100 layout: scale_bytes(R, C) bytes per matrix (rows
    padded to 128, k blocks to 4; MXFP8Tensor checks this when it is made, checked again here because libmok reads
    that many bytes), and no padding byte is e8m0's NaN 255: a block-scaled MMA reads the padding, and a NaN scale
    there would make every output it meets NaN (mxfp8_quantize writes 127, 2^0)."""
    *batch, rows, cols = q.data.shape
    expected = (*batch, scale_bytes(rows, cols))
    if tuple(q.scales.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} (the SM100 scale layout of [{rows}, {cols}] matrices, "
                         f"docs/mxfp8.md), got {tuple(q.scales.shape)}")
    if not reads_values(q.scales):  # a graph being captured: checked by the eager calls before it
        return
    pad = padding_offsets(rows, cols).to(q.scales.device)
    if pad.numel() and bool((q.scales[..., pad] == 255).any()):
        raise ValueError(f"{name} holds the NaN scale 255 at a padding byte (rows past {rows} or k blocks past "
                         f"{-(-cols // 32)}); padding scales must be finite (mxfp8_quantize writes 127)")


def _check_shared(shared, hidden: int, device) -> None:
    if shared is None:
        return
    if not isinstance(shared, SharedExpert):
        raise TypeError(f"shared must be a SharedExpert or None, got {type(shared).__name__}")
    if shared.hidden_size != hidden:
        raise ValueError(f"shared expert's hidden size must equal x.shape[1] ({hidden}), got {shared.hidden_size}")
    _check_weights(shared, "shared", device)
    if shared.router is not None and shared.router.device != device:
        raise ValueError(f"shared.router must be on x's device {device}, got {shared.router.device}")


def _check_weights(experts, name: str, device) -> None:
    for part in ("gate", "up", "down"):
        w = getattr(experts, part)
        if w.device != device:
            raise ValueError(f"{name}.{part} must be on x's device {device}, got {w.device}")
        check_layout(w, f"{name}.{part}")
