"""Expert weight containers: the routed experts of one rank (bf16 or MXFP8) and the optional shared expert.

Shapes (H = hidden size, I = routed intermediate size, I_s = shared intermediate size):
- RoutedExperts:  gate, up [E_local, I, H]; down [E_local, H, I]; bf16.
- SharedExpert:   gate, up [I_s, H];        down [H, I_s];         bf16.
- RoutedExpertsMXFP8: the bf16 master it was made from plus each weight in the two MXFP8 orientations its GEMMs
  need (docs/mxfp8.md): gate/up row-wise (blocks along H, forward) and column-wise (blocks along I, dgrad);
  down row-wise (blocks along I, forward) and column-wise (blocks along H, dgrad).
"""

from __future__ import annotations

import dataclasses

import torch

from mok.quant import MXFP8Pair, mxfp8_quantize

BIAS_NAMES = ("gate_bias", "up_bias", "down_bias")


@dataclasses.dataclass(frozen=True, eq=False)  # tensors: compare by identity
class ExpertWeights:
    """One expert's gate, up [I, H] and down [H, I]: bf16 tensors, or MXFP8Pair forms of them."""

    gate: torch.Tensor | MXFP8Pair
    up: torch.Tensor | MXFP8Pair
    down: torch.Tensor | MXFP8Pair
    gate_bias: torch.Tensor | None = None  # [I] bf16 (None: zero)
    up_bias: torch.Tensor | None = None  # [I] bf16
    down_bias: torch.Tensor | None = None  # [H] bf16

    @property
    def is_mxfp8(self) -> bool:
        return isinstance(self.gate, MXFP8Pair)


@dataclasses.dataclass(frozen=True, eq=False)  # tensors: compare by identity
class RoutedExperts:
    """The E_local routed experts of one rank, bf16: gate, up [E_local, I, H], down [E_local, H, I], and optional
    biases (gpt-oss), each on its own (None: zero): gate_bias, up_bias [E_local, I], down_bias [E_local, H], bf16,
    added to g, u and y in fp32 before each is rounded (docs/semantics.md)."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    def __post_init__(self):
        for name in ("gate", "up", "down"):
            _check_weight(getattr(self, name), name, ndim=3)
        e, i, h = self.gate.shape
        _check_shape(self.up, "up", (e, i, h), "gate's [E_local, I, H]")
        _check_shape(self.down, "down", (e, h, i), "[E_local, H, I] with gate's E_local, I, H")
        for name, width in (("gate_bias", i), ("up_bias", i), ("down_bias", h)):
            bias = getattr(self, name)
            if bias is None:
                continue
            _check_weight(bias, name, ndim=2)
            _check_shape(bias, name, (e, width), "[E_local, I] or [E_local, H] with gate's E_local, I, H")
            if bias.device != self.gate.device:
                raise ValueError(f"{name} must be on gate's device {self.gate.device}, got {bias.device}")
        _check_same_device(self)
        _check_dense(self)

    def biases(self) -> dict:
        """The biases given, by field name."""
        return {n: getattr(self, n) for n in BIAS_NAMES if getattr(self, n) is not None}

    @property
    def num_experts(self) -> int:
        return self.gate.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.gate.shape[2]

    @property
    def intermediate_size(self) -> int:
        return self.gate.shape[1]

    def expert(self, e: int) -> ExpertWeights:
        return ExpertWeights(self.gate[e], self.up[e], self.down[e],
                             *(None if getattr(self, n) is None else getattr(self, n)[e] for n in BIAS_NAMES))

    def to_mxfp8(self) -> RoutedExpertsMXFP8:
        """Quantise every weight in both orientations (forward GEMMs use row-wise, dgrad GEMMs column-wise)."""
        return RoutedExpertsMXFP8(
            master=self,
            gate=mxfp8_quantize(self.gate, name="gate"),
            up=mxfp8_quantize(self.up, name="up"),
            down=mxfp8_quantize(self.down, name="down"),
        )


@dataclasses.dataclass(frozen=True, eq=False)  # tensors: compare by identity
class RoutedExpertsMXFP8:
    """MXFP8 routed experts: `master` (the bf16 RoutedExperts they were quantised from; weight gradients are
    gradients of the master) and MXFP8Pair forms of gate, up [E_local, I, H] and down [E_local, H, I].

    The forms are a snapshot: after an optimiser step changes the master, make new ones with master.to_mxfp8().
    """

    master: RoutedExperts
    gate: MXFP8Pair
    up: MXFP8Pair
    down: MXFP8Pair

    def __post_init__(self):
        if not isinstance(self.master, RoutedExperts):
            raise TypeError(f"master must be a RoutedExperts, got {type(self.master).__name__}")
        for name in ("gate", "up", "down"):
            _check_pair(getattr(self, name), name, tuple(getattr(self.master, name).shape))

    num_experts = property(lambda self: self.master.num_experts)
    hidden_size = property(lambda self: self.master.hidden_size)
    intermediate_size = property(lambda self: self.master.intermediate_size)

    def expert(self, e: int) -> ExpertWeights:
        # The biases stay bf16 in MXFP8 mode: the master's.
        biases = self.master.expert(e)
        return ExpertWeights(self.gate.expert(e), self.up.expert(e), self.down.expert(e), biases.gate_bias,
                             biases.up_bias, biases.down_bias)


@dataclasses.dataclass(frozen=True, eq=False)  # tensors: compare by identity
class SharedExpert:
    """The shared expert, bf16: gate, up [I_s, H], down [H, I_s]. It sees every token and stays bf16 in MXFP8 mode.

    router [H] bf16 (optional; Qwen2-MoE's shared_expert_gate): the shared output of token t is scaled by
    sigmoid(x_t . router), computed in fp32 (docs/semantics.md, "Gated shared expert"); None: ungated."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    router: torch.Tensor | None = None

    def __post_init__(self):
        for name in ("gate", "up", "down"):
            _check_weight(getattr(self, name), name, ndim=2)
        i, h = self.gate.shape
        _check_shape(self.up, "up", (i, h), "gate's [I_s, H]")
        _check_shape(self.down, "down", (h, i), "[H, I_s] with gate's I_s, H")
        if self.router is not None:
            _check_weight(self.router, "router", ndim=1)
            _check_shape(self.router, "router", (h,), "[H] with gate's H")
            if self.router.device != self.gate.device:
                raise ValueError(f"router must be on gate's device {self.gate.device}, got {self.router.device}")
        _check_same_device(self)
        _check_dense(self)

    @property
    def hidden_size(self) -> int:
        return self.gate.shape[1]

    @property
    def intermediate_size(self) -> int:
        return self.gate.shape[0]

    def expert(self) -> ExpertWeights:
        return ExpertWeights(self.gate, self.up, self.down)


def _check_weight(w, name: str, ndim: int) -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype != torch.bfloat16:
        raise TypeError(f"{name} must be bfloat16 (quantise with to_mxfp8() for MXFP8), got {w.dtype}")
    if w.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(w.shape)}")
    if any(s == 0 for s in w.shape):
        raise ValueError(f"{name} must have no empty dim, got shape {tuple(w.shape)}")


def _check_shape(w: torch.Tensor, name: str, expected: tuple, rule: str) -> None:
    if tuple(w.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} ({rule}), got {tuple(w.shape)}")


def _check_dense(experts) -> None:
    """Checked where the weights are handed in (after their shapes, which say more when both are wrong):
    executors read each as one dense row-major array, and a copy made here would be a second tensor that an
    optimiser's in-place step on the caller's one never reaches."""
    from mok.validate import check_layout  # here: validate imports this module

    for name in ("gate", "up", "down", "router", *BIAS_NAMES):
        if getattr(experts, name, None) is not None:
            check_layout(getattr(experts, name), name)


def _check_same_device(experts) -> None:
    devices = {experts.gate.device, experts.up.device, experts.down.device}
    if len(devices) != 1:
        raise ValueError(f"gate, up and down must be on one device, got {sorted(map(str, devices))}")


def _check_pair(pair, name: str, shape: tuple) -> None:
    if not isinstance(pair, MXFP8Pair) or pair.rowwise is None or pair.colwise is None:
        raise TypeError(f"{name} must be an MXFP8Pair with both rowwise and colwise forms")
    transposed = (*shape[:-2], shape[-1], shape[-2])
    if tuple(pair.rowwise.data.shape) != shape or pair.rowwise.transposed:
        raise ValueError(f"{name}.rowwise must be a non-transposed {shape} form, got {tuple(pair.rowwise.data.shape)}")
    if tuple(pair.colwise.data.shape) != transposed or not pair.colwise.transposed:
        raise ValueError(f"{name}.colwise must be a transposed {transposed} form, got {tuple(pair.colwise.data.shape)}")
