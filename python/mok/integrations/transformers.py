"""HuggingFace transformers' MoE models with their experts on libmok (transformers 5.x, tested with 5.24.0).

    import mok.integrations.transformers as mok_hf   # registers "mok" with transformers' ExpertsInterface
    mok_hf.configure(group=ep_group)                 # once; the default group is mok.LOCAL in one process
    model.set_experts_implementation("mok")          # or from_pretrained(..., experts_implementation="mok")

Every experts module of the model (the classes transformers decorates with @use_experts_implementation) then
runs `experts_forward`: HF's router, shared experts and losses stay HF's, and mok computes sum_k w_k expert(x).
`mok.nn.MoE.from_hf(block)` (here: `moe_from_hf`) instead replaces a whole MoE block, router included.

Layouts: HF stores each module's experts as gate_up_proj [E, 2I, H] (gate rows, then up rows; or [E, H, 2I] when
is_transposed; gate and up alternating when not is_concatenated) and down_proj [E, H, I] ([E, I, H] transposed).
mok reads dense gate, up [E_local, I, H] and down [E_local, H, I]. Expert biases (has_bias, gpt-oss):
gate_up_proj_bias [E, 2I] splits as gate_up_proj's columns do into gate_bias, up_bias [E_local, I], and
down_proj_bias [E, H] is down_bias; gpt-oss's gating (_apply_gate) is mok's "swiglu_oai" with the module's alpha
and limit. A weight whose rank-local view already is that
(a bf16 down_proj in HF's default layout) is passed as a view of HF's parameter: no copy. The others are converted
once per weight version: the bf16 copies are cached on the module and remade only when the parameter's version
counter (`tensor._version`, bumped by every in-place change: optimizer steps, `copy_` under no_grad) or its
data_ptr (`param.data = ...`) changes. Gradients go back into HF's layout through the same views, one write per
backward. Changes made through `param.data` in place bump no version: call `clear_cache(model)` after them.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from mok import ep
from mok.experts import RoutedExperts, RoutedExpertsMXFP8
from mok.functional import MoKConfig
from mok.layer import moe
from mok.nn import MoE
from mok.quant import mxfp8_quantize
from mok.routers import Router, Routing

try:
    import transformers
    from transformers.activations import SiLUActivation
    from transformers.integrations import moe as _hf_moe
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("mok.integrations.transformers needs HuggingFace transformers >= 5 (pip install "
                      "transformers==5.24.0, the version it is tested with)") from e

NAME = "mok"


@dataclasses.dataclass(frozen=True)
class Settings:
    """How every experts module set to "mok" calls mok.moe: the expert-parallel group (None: mok's rule, mok.LOCAL
    when torch.distributed has no group of more than one rank), the backend (None: mok's choice), MXFP8 experts,
    the MoKConfig and keep_context (see mok.moe)."""

    group: object = None
    backend: str | None = None
    mxfp8: bool = False
    config: MoKConfig | None = None
    keep_context: bool = True


_settings = Settings()


def configure(*, group=None, backend: str | None = None, mxfp8: bool = False, config: MoKConfig | None = None,
              keep_context: bool = True) -> Settings:
    """Set, for the whole process, how the experts modules running on "mok" call it; returns the previous
    settings (pass them to `configure(**dataclasses.asdict(previous))`, or use `settings` to read them)."""
    global _settings
    if not isinstance(mxfp8, bool):
        raise TypeError(f"mxfp8 must be a bool, got {type(mxfp8).__name__}")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be None or a backend name, got {type(backend).__name__}")
    if config is not None and not isinstance(config, MoKConfig):
        raise TypeError(f"config must be a MoKConfig or None, got {type(config).__name__}")
    previous = _settings
    _settings = Settings(group, backend, mxfp8, config, bool(keep_context))
    return previous


def settings() -> Settings:
    return _settings


# How many weight conversions (HF layout -> mok's dense bf16) ran in this process: tests read it to check that a
# forward after the first one converts nothing until a weight changes.
conversions = 0


def unsupported_reason(experts: nn.Module) -> str | None:
    """Why mok cannot compute this HF experts module exactly, or None when it can."""
    for name in ("gate_up_proj", "down_proj", "num_experts"):
        if not hasattr(experts, name):
            return f"it has no {name} (not an experts module of transformers' experts interface)"
    if getattr(experts, "_is_expert_parallel", False):
        return ("transformers' own expert parallelism shards it; mok distributes the experts itself: load the "
                "model without transformers' EP and give mok the group (configure(group=...))")
    if not getattr(experts, "has_gate", False):
        return "its experts have no gate projection (has_gate=False); mok's experts are SwiGLU"
    if getattr(experts, "has_bias", False):
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            if getattr(experts, name, None) is None:
                return f"it has biases (has_bias=True) but no {name}, the names mok maps"
    if getattr(experts, "has_post_expert_norm", False):
        return "it normalises each expert's output (has_post_expert_norm=True), not in mok's semantics"
    gating = getattr(type(experts), "_apply_gate", None)
    if gating is _gpt_oss_gate():
        return None  # gpt-oss's clamped SwiGLU: mok's "swiglu_oai" with the module's alpha and limit
    if gating is not _hf_moe._default_apply_gate:
        return "it has its own gating function (_apply_gate), neither mok's SwiGLU nor gpt-oss's"
    act = getattr(experts, "act_fn", None)
    if not isinstance(act, (SiLUActivation, nn.SiLU)):
        return f"its activation is {type(act).__name__}; mok's experts use SiLU (SwiGLU)"
    return None


def _gpt_oss_gate():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    return GptOssExperts._apply_gate


def activation_of(experts: nn.Module) -> dict:
    """mok.moe's activation arguments equal to a supported experts module's gating: SwiGLU, or gpt-oss's
    "swiglu_oai" with the module's alpha and limit (gate clamped above, up clamped both ways)."""
    if getattr(type(experts), "_apply_gate", None) is _gpt_oss_gate():
        return {"activation": "swiglu_oai", "alpha": float(experts.alpha), "swiglu_limit": float(experts.limit)}
    return {"activation": "swiglu", "alpha": None, "swiglu_limit": None}


def check_supported(experts: nn.Module) -> None:
    reason = unsupported_reason(experts)
    if reason is not None:
        raise ValueError(f"{type(experts).__name__} cannot run on mok: {reason}")


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The "mok" entry of transformers' ExpertsInterface: HF's experts forward (tokens [T, H], the router's
    top_k_index [T, K] (global expert ids) and top_k_weights [T, K]) computed by mok.moe over the configured
    group. Activations of another dtype are cast to bf16 and the result back; routing weights go in as fp32."""
    check_supported(self)
    s = _settings
    group = ep.resolve_group(s.group)
    rank, world = ep.group_rank_and_size(group)
    routed = routed_experts(self, rank, world, mxfp8=s.mxfp8)
    x = hidden_states.to(torch.bfloat16).contiguous()
    weights = top_k_weights.to(torch.float32).contiguous()
    out = moe(x, top_k_index.contiguous(), weights, routed, None, group=group, config=s.config, backend=s.backend,
              keep_context=s.keep_context, **activation_of(self))
    return out.to(hidden_states.dtype)


def mok_views(experts: nn.Module, gate_up: torch.Tensor, down: torch.Tensor, lo: int = 0, hi: int | None = None):
    """(gate, up, down) of experts lo..hi-1 as views of HF-layout tensors (the parameters, or gradient buffers of
    their shape) in mok's orientation: [n, I, H], [n, I, H], [n, H, I]."""
    gate_up, down = gate_up[lo:hi], down[lo:hi]
    if getattr(experts, "is_transposed", False):
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    inter = gate_up.shape[1] // 2
    if getattr(experts, "is_concatenated", True):
        return gate_up[:, :inter], gate_up[:, inter:], down
    return gate_up[:, 0::2], gate_up[:, 1::2], down


def mok_bias_views(experts: nn.Module, gate_up_bias: torch.Tensor, down_bias: torch.Tensor, lo: int = 0,
                   hi: int | None = None):
    """(gate_bias, up_bias, down_bias) of experts lo..hi-1 as views of HF's gate_up_proj_bias [E, 2I] (split as
    gate_up_proj's columns are) and down_proj_bias [E, H]: [n, I], [n, I], [n, H]."""
    gate_up_bias, down_bias = gate_up_bias[lo:hi], down_bias[lo:hi]
    inter = gate_up_bias.shape[1] // 2
    if getattr(experts, "is_concatenated", True):
        return gate_up_bias[:, :inter], gate_up_bias[:, inter:], down_bias
    return gate_up_bias[:, 0::2], gate_up_bias[:, 1::2], down_bias


def routed_experts(experts: nn.Module, rank: int = 0, world: int = 1, *, mxfp8: bool = False):
    """This rank's experts (rank * E / world ... ) of an HF experts module as mok.RoutedExperts (RoutedExpertsMXFP8
    with mxfp8), differentiable with respect to HF's gate_up_proj and down_proj; see the module doc for when
    it copies."""
    check_supported(experts)
    num = experts.num_experts
    if num % world:
        raise ValueError(f"{type(experts).__name__} has {num} experts, not a multiple of the group's {world} ranks")
    local = num // world
    lo, hi = rank * local, (rank + 1) * local
    gate_up, down = experts.gate_up_proj, experts.down_proj
    pieces = _from_hf(experts, "gate_up_proj", lambda t: mok_views(experts, t, down, lo, hi)[:2], (lo, hi))
    (down_mok,) = _from_hf(experts, "down_proj", lambda t: mok_views(experts, gate_up, t, lo, hi)[2:], (lo, hi))
    biases = ()
    if getattr(experts, "has_bias", False):
        gate_up_bias, down_bias = experts.gate_up_proj_bias, experts.down_proj_bias
        biases = _from_hf(experts, "gate_up_proj_bias",
                          lambda t: mok_bias_views(experts, t, down_bias, lo, hi)[:2], (lo, hi))
        biases += _from_hf(experts, "down_proj_bias",
                           lambda t: mok_bias_views(experts, gate_up_bias, t, lo, hi)[2:], (lo, hi))
    routed = RoutedExperts(pieces[0], pieces[1], down_mok, *biases)
    return _mxfp8(experts, routed, (lo, hi)) if mxfp8 else routed


def clear_cache(model: nn.Module) -> None:
    """Drop the converted weights of every experts module in `model` (after changing weights through .data)."""
    for module in model.modules():
        module.__dict__.pop("_mok_cache", None)


def _version_key(param: torch.Tensor, extra) -> tuple:
    return (param.data_ptr(), param._version, param.dtype, tuple(param.shape), param.device, extra)


def _from_hf(experts: nn.Module, name: str, views_of, extra) -> tuple:
    """mok's weights from HF parameter `name`: views when they are dense bf16 already, else the cached copies of
    the current weight version, connected to the parameter by _FromHF."""
    global conversions
    param = getattr(experts, name)
    views = views_of(param)
    if all(v.dtype == torch.bfloat16 and v.is_contiguous() for v in views):
        return views  # mok reads HF's parameter in place
    key = _version_key(param, extra)
    cache = experts.__dict__.setdefault("_mok_cache", {})
    entry = cache.get(name)
    if entry is None or entry[0] != key:
        with torch.no_grad():
            copies = tuple(v.to(torch.bfloat16, copy=True, memory_format=torch.contiguous_format) for v in views)
        cache[name] = entry = (key, copies)
        conversions += 1
    return _FromHF.apply(param, views_of, entry[1])


class _FromHF(torch.autograd.Function):
    """A parameter -> its converted copies (made beforehand). The backward writes each copy's gradient into a zero
    gradient of the parameter's shape and dtype through the views the copies were made from."""

    @staticmethod
    def forward(ctx, param, views_of, copies):
        ctx.views_of, ctx.like = views_of, (param.shape, param.dtype, param.device)
        return tuple(c.detach() for c in copies)

    @staticmethod
    def backward(ctx, *grads):
        shape, dtype, device = ctx.like
        grad = torch.zeros(shape, dtype=dtype, device=device)
        for view, g in zip(ctx.views_of(grad), grads, strict=True):
            if g is not None:
                view.copy_(g)
        return grad, None, None


def _mxfp8(experts: nn.Module, routed: RoutedExperts, extra) -> RoutedExpertsMXFP8:
    """MXFP8 forms of `routed`, quantised once per version of both HF parameters (the masters stay differentiable)."""
    global conversions
    key = (_version_key(experts.gate_up_proj, extra), _version_key(experts.down_proj, extra))
    cache = experts.__dict__.setdefault("_mok_cache", {})
    entry = cache.get("mxfp8")
    if entry is None or entry[0] != key:
        with torch.no_grad():
            pairs = tuple(mxfp8_quantize(getattr(routed, p).detach(), name=p) for p in ("gate", "up", "down"))
        cache["mxfp8"] = entry = (key, pairs)
        conversions += 1
    return RoutedExpertsMXFP8(routed, *entry[1])


# ---- mok.nn.MoE.from_hf: a whole block, router included ----


class HFMoE(MoE):
    """A mok.nn.MoE made from a transformers MoE block by `moe_from_hf`. It takes and returns the model's dtype
    (mok computes in bf16) and routes the tokens as given (mok's fp32 router); where mok's router cannot express
    HF's (DeepSeek-V3's grouped sigmoid top-k with score-correction bias and scaling), `router` is HF's router
    module itself and route() calls it. From gpt-oss's GptOssMLP, forward returns (out, router scores [T, K]) as
    that block does (returns_router_scores)."""

    uses_hf_router = False
    returns_router_scores = False  # gpt-oss's GptOssMLP returns (out, router scores [T, K]); its HFMoE does too
    returns_router_logits = False  # Llama4's Llama4TextMoe returns (out, router logits [T, E]); its HFMoE does too

    def route(self, x: torch.Tensor) -> Routing:
        if not self.uses_hf_router:
            return super().route(x)
        logits, weights, ids = self.router(x)  # HF's router: DeepSeek-V3's, whose scores are sigmoids
        logits = logits.to(torch.float32)
        return Routing(ids, weights.to(torch.float32), logits, logits.sigmoid())

    def forward(self, x: torch.Tensor, output_router_logits: bool = False):
        tokens = x.reshape(-1, x.shape[-1])
        ids, weights, logits, _ = self.route(tokens)
        recorder = self._modules.get("logits_recorder")  # see _logits_recorder
        if recorder is not None:
            recorder(logits)
        out = self.run_experts(tokens.to(torch.bfloat16).contiguous(), ids.contiguous(), weights.contiguous())
        out = out.reshape(x.shape).to(x.dtype)
        if output_router_logits or self.returns_router_logits:
            return out, logits
        return (out, weights) if self.returns_router_scores else out


def _logits_recorder(hf_router: nn.Module, router: nn.Module, index: int = 0) -> nn.Module:
    """A module HF's output recording takes for the block's router: transformers records router_logits with a forward
    hook on every instance of the router's class (OutputRecorder(<Router>, index=0)), installed at the model's first
    forward. An HFMoE with mok's router calls this identity with its logits, so HF's load-balancing loss sees them as
    it saw the replaced router's. Its `weight` is mok's router weight (not a parameter of its own), so HF's weight
    initialisation, which matches the same class, initialises the router mok uses (and its `bias`, gpt-oss's). The
    logits sit at `index` of its output, where the model's recorder reads them (1 for Llama4's Llama4Router)."""
    has_bias = getattr(hf_router, "bias", None) is not None  # gpt-oss's router bias, initialised by HF as the weight
    key = (type(hf_router), has_bias, index)
    if key not in _RECORDERS:
        _RECORDERS[key] = _recorder_class(*key)
    recorder = _RECORDERS[key]()
    recorder.__dict__["router"] = router  # not a submodule: the layer owns it
    return recorder


_RECORDERS: dict = {}  # (HF router class, has a bias, index) -> its recorder class: one per kind of block


def _recorder_class(hf_class: type, has_bias: bool, index: int) -> type:
    def forward(self, logits):
        return (logits, None, None) if index == 0 else (None, logits)

    def init(self):
        nn.Module.__init__(self)

    members = {"__init__": init, "forward": forward, "weight": property(lambda self: self.__dict__["router"].weight)}
    if has_bias:
        members["bias"] = property(lambda self: self.__dict__["router"].bias)
    return type(f"MokLogitsOf{hf_class.__name__}", (hf_class,), members)


def _hf_router(block: nn.Module) -> nn.Module | None:
    """The block's router module: .gate (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, DeepSeek-V3) or .router (gpt-oss)."""
    router = getattr(block, "gate", None)
    return router if router is not None else getattr(block, "router", None)


def _router_kind(block: nn.Module) -> dict | None:
    """mok.routers.Router's arguments (kind, normalize, bias) equal to the block's router, or None to keep HF's."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.olmoe.modeling_olmoe import OlmoeTopKRouter
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    router = _hf_router(block)
    if type(router) in (Qwen3MoeTopKRouter, Qwen2MoeTopKRouter, OlmoeTopKRouter):
        return {"kind": "softmax_topk", "normalize": bool(router.norm_topk_prob)}
    if type(router) is MixtralTopKRouter:
        if getattr(block, "jitter_noise", 0):
            raise ValueError("MixtralSparseMoeBlock with router_jitter_noise > 0 cannot become a mok.nn.MoE: mok's "
                             "router has no jitter noise (use set_experts_implementation('mok') instead)")
        return {"kind": "softmax_topk", "normalize": True}
    if type(router) is GptOssTopKRouter:  # top-k of x W^T + b, then a softmax over those k
        return {"kind": "topk_softmax", "bias": True}
    if type(router) is DeepseekV3TopkRouter:
        return None
    raise ValueError(f"moe_from_hf supports the MoE blocks of Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, DeepSeek-V3 and "
                     f"gpt-oss; "
                     f"{type(block).__name__}'s router {type(router).__name__} is not one of them "
                     f"(set_experts_implementation('mok') runs any supported experts module with HF's router)")


def moe_from_hf(block: nn.Module, *, group=None, backend: str | None = None, mxfp8: bool = False,
                config: MoKConfig | None = None) -> HFMoE:
    """A mok.nn.MoE (HFMoE) equal to a transformers MoE block, its weights copied once from HF's names:
    gate.weight (router.weight, router.bias for gpt-oss) -> router.weight, router.bias (fp32);
    experts.gate_up_proj -> gate, up (this rank's experts, bf16); experts.down_proj -> down;
    experts.gate_up_proj_bias -> gate_bias, up_bias; experts.down_proj_bias -> down_bias (gpt-oss);
    shared_experts (shared_expert in Qwen2-MoE).{gate,up,down}_proj.weight -> shared_gate, shared_up, shared_down;
    shared_expert_gate.weight [1, H] (Qwen2-MoE) -> shared_router [H]."""
    if type(block).__name__ == "Llama4TextMoe":
        return _llama4_from_hf(block, group=group, backend=backend, mxfp8=mxfp8, config=config)
    experts, hf_router = getattr(block, "experts", None), _hf_router(block)
    if experts is None or hf_router is None:
        raise ValueError(f"{type(block).__name__} is not a transformers MoE block (it needs .gate or .router, and "
                         f".experts)")
    check_supported(experts)
    kind = _router_kind(block)
    shared = getattr(block, "shared_experts", None)
    shared = getattr(block, "shared_expert", None) if shared is None else shared  # Qwen2-MoE's name
    shared_gate = getattr(block, "shared_expert_gate", None)  # Qwen2-MoE: Linear(H, 1), no bias
    if shared_gate is not None and (shared is None or shared_gate.bias is not None):
        raise ValueError(f"{type(block).__name__}'s shared_expert_gate must gate a shared expert and have no bias")
    if shared is not None and not isinstance(shared.act_fn, (SiLUActivation, nn.SiLU)):
        raise ValueError(f"{type(block).__name__}'s shared experts use {type(shared.act_fn).__name__}, not SiLU")
    hidden, inter = experts.down_proj.shape[1:] if not experts.is_transposed else experts.down_proj.shape[:0:-1]
    shared_inter = shared.gate_proj.weight.shape[0] if shared is not None else 0
    device, topk = experts.down_proj.device, hf_router.top_k
    router = None if kind is None else Router(hidden, experts.num_experts, topk, **kind, device=device)
    has_bias = bool(getattr(experts, "has_bias", False))
    layer = HFMoE(hidden, inter, experts.num_experts, topk, shared_intermediate=shared_inter, router=router,
                  mxfp8=mxfp8, group=group, backend=backend, config=config, device=device, expert_bias=has_bias,
                  shared_expert_gate=shared_gate is not None, **activation_of(experts))
    rank, world = ep.group_rank_and_size(group)
    lo, hi = rank * (experts.num_experts // world), (rank + 1) * (experts.num_experts // world)
    with torch.no_grad():
        pairs = list(zip((layer.gate, layer.up, layer.down),
                         mok_views(experts, experts.gate_up_proj, experts.down_proj, lo, hi), strict=True))
        if has_bias:
            pairs += zip((layer.gate_bias, layer.up_bias, layer.down_bias),
                         mok_bias_views(experts, experts.gate_up_proj_bias, experts.down_proj_bias, lo, hi),
                         strict=True)
        if shared is not None:
            pairs += [(layer.shared_gate, shared.gate_proj.weight), (layer.shared_up, shared.up_proj.weight),
                      (layer.shared_down, shared.down_proj.weight)]
        if shared_gate is not None:
            pairs.append((layer.shared_router, shared_gate.weight[0]))
        if router is not None:
            pairs.append((router.weight, hf_router.weight))
            if router.bias is not None:
                pairs.append((router.bias, hf_router.bias))
        for mine, theirs in pairs:
            mine.copy_(theirs)
    if router is None:
        layer.router = hf_router  # HF's router module, its parameters and buffers
        layer.uses_hf_router = True
    else:
        layer.logits_recorder = _logits_recorder(hf_router, layer.router)
    layer.returns_router_scores = type(block).__name__ == "GptOssMLP"  # it returns (out, router scores)
    return layer


def _llama4_from_hf(block: nn.Module, *, group, backend, mxfp8, config) -> HFMoE:
    """Llama4's Llama4TextMoe as an HFMoE: its router is sigmoid of the top-k logits, unnormalised (mok's
    "sigmoid_topk" with its defaults), its weights scale each expert's input row (routing_scale="input": HF's
    routed_in = x * score) and the expert outputs add unweighted to the shared expert's. Llama4TextExperts stores
    gate_up_proj [E, H, 2I] (gate the first I columns, up the last I) and down_proj [E, I, H]: transposed against
    mok's gate, up [E, I, H] and down [E, H, I]. No biases; SiLU in the experts and in the shared expert."""
    experts, hf_router, shared = block.experts, block.router, block.shared_expert
    for where, act in (("experts", experts.act_fn), ("shared_expert", shared.activation_fn)):
        if not isinstance(act, (SiLUActivation, nn.SiLU)):
            raise ValueError(f"Llama4TextMoe's {where} use {type(act).__name__}, not SiLU (mok's experts are SwiGLU)")
    num, hidden, inter = experts.num_experts, experts.hidden_size, experts.expert_dim
    rank, world = ep.group_rank_and_size(group)
    if num % world:
        raise ValueError(f"Llama4TextMoe has {num} experts, not a multiple of the group's {world} ranks")
    lo, hi = rank * (num // world), (rank + 1) * (num // world)
    device = experts.down_proj.device
    router = Router(hidden, num, hf_router.top_k, kind="sigmoid_topk", device=device)
    layer = HFMoE(hidden, inter, num, hf_router.top_k, shared_intermediate=shared.gate_proj.weight.shape[0],
                  router=router, mxfp8=mxfp8, group=group, backend=backend, config=config, device=device,
                  routing_scale="input")
    gate_up, down = experts.gate_up_proj[lo:hi], experts.down_proj[lo:hi]
    with torch.no_grad():
        for mine, theirs in ((layer.gate, gate_up[:, :, :inter].transpose(1, 2)),
                             (layer.up, gate_up[:, :, inter:].transpose(1, 2)), (layer.down, down.transpose(1, 2)),
                             (layer.shared_gate, shared.gate_proj.weight), (layer.shared_up, shared.up_proj.weight),
                             (layer.shared_down, shared.down_proj.weight), (router.weight, hf_router.weight)):
            mine.copy_(theirs)
    layer.logits_recorder = _logits_recorder(hf_router, router, index=1)  # OutputRecorder(Llama4Router, index=1)
    layer.returns_router_logits = True
    return layer


_hf_moe.ExpertsInterface.register(NAME, experts_forward)
__all__ = ["HFMoE", "Settings", "check_supported", "clear_cache", "configure", "experts_forward", "moe_from_hf",
           "routed_experts", "settings", "transformers", "unsupported_reason"]
