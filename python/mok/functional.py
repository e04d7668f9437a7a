"""The layer in pieces: config, workspace, schedule, forward, backward, context recompute.

Use this when a trainer wants control (keep or drop the backward context, recompute it later, accumulate weight
gradients into fp32 main_grad buffers, reuse a schedule). `mok.moe` is the one-call form on top of it.

An executor ("backend") does the work. Each registers one object with `register_backend`; `backend=None` picks
the highest-priority one that supports the input's device. This file ships "reference": expert parallelism over
torch.distributed (mok.ep) with reference.py's per-expert math, on any device and any process group. A later
executor (libmok's "host" executor through mok._mok, the GPU executors) plugs in by registering itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mok import ep, validate
from mok.ep import MainGrads
from mok.quant import mxfp8_quantize  # noqa: F401  (part of the functional API, as in DESIGN 3)
from mok.reference import Gradients

__all__ = [
    "MoKConfig", "Workspace", "create_workspace", "get_workspace", "build_schedule", "forward", "backward",
    "recompute_forward_context", "mxfp8_quantize", "MainGrads", "Gradients", "register_backend",
    "unregister_backend", "backends", "select_backend",
]


# ----------------------------------------------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class MoKConfig:
    """How an executor runs the layer. The result never depends on it (DESIGN 1: determinism); only speed and
    memory do. The reference executor checks it and otherwise ignores it.

    fwd_num_comm_sms / bwd_num_comm_sms: SMs that only move tokens, forward / backward (the rest compute).
    minibatch_size: rows per overlap step (comm of step i+1 overlaps compute of step i).
    macrobatch_size: rows the ring buffer holds; a multiple of minibatch_size.
    expert_padding: each expert's row segment is padded to a multiple of this (the GEMM tile height).
    wait_timeout_s: the longest any wait for a peer may take before the layer stops with an error.
    host_comm_workers / host_compute_workers: threads per rank of the host executor (backend="host") that move rows
    / compute tiles; host_compute_workers=None: the CPUs this process may run on, divided by the group's ranks
    (all on this host: they share memory), at least 1.
    """

    fwd_num_comm_sms: int = 40
    bwd_num_comm_sms: int = 28
    minibatch_size: int = 4096
    macrobatch_size: int = 131072
    expert_padding: int = 256
    wait_timeout_s: float = 60.0
    host_comm_workers: int = 1
    host_compute_workers: int | None = None

    def __post_init__(self):
        # The upper limits are libmok's (validate.py mirrors them from its C ABI), checked here so that the error
        # names the MoKConfig field and the value given, never the C field it becomes.
        for name in ("fwd_num_comm_sms", "bwd_num_comm_sms"):
            _check_int(self, name, 1, 256, "between 1 and 256 (a GPU has at most a few hundred SMs)")
        _check_int(self, "expert_padding", 1, 1024, "a power of two between 1 and 1024")
        if self.expert_padding & (self.expert_padding - 1):
            raise ValueError(f"MoKConfig.expert_padding must be a power of two between 1 and 1024, "
                             f"got {self.expert_padding}")
        _check_int(self, "minibatch_size", self.expert_padding, validate.MAX_MINIBATCH,
                   f"a multiple of expert_padding ({self.expert_padding}), at most 2^24")
        if self.minibatch_size % self.expert_padding:
            raise ValueError(f"MoKConfig.minibatch_size must be a multiple of expert_padding "
                             f"({self.expert_padding}), got {self.minibatch_size}")
        _check_int(self, "macrobatch_size", self.minibatch_size, validate.MAX_MACROBATCH,
                   f"a multiple of minibatch_size ({self.minibatch_size}), at most 2^26")
        if self.macrobatch_size % self.minibatch_size:
            raise ValueError(f"MoKConfig.macrobatch_size must be a multiple of minibatch_size "
                             f"({self.minibatch_size}), got {self.macrobatch_size}")
        _check_int(self, "host_comm_workers", 1, validate.MAX_COMM_WORKERS, "between 1 and 64 (libmok's limit)")
        if self.host_compute_workers is not None:
            _check_int(self, "host_compute_workers", 1, validate.MAX_COMPUTE_WORKERS,
                       "None or between 1 and 256 (libmok's limit)")
        t = self.wait_timeout_s
        low, high = validate.MIN_TIMEOUT_MS / 1000, validate.MAX_TIMEOUT_MS / 1000
        rule = f"a number of seconds between {low:g} (1 ms) and {high:g} (24 h)"
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise TypeError(f"MoKConfig.wait_timeout_s must be {rule}, got {type(t).__name__}")
        if not (math.isfinite(t) and low <= t <= high):
            raise ValueError(f"MoKConfig.wait_timeout_s must be {rule}, got {t!r}")


def _check_int(config, name: str, low: int, high: int, rule: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"MoKConfig.{name} must be an int ({rule}), got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"MoKConfig.{name} must be {rule}, got {value}")


# ----------------------------------------------------------------------------------------------------------------
# Executors


class Executor(Protocol):
    """What a backend provides. `schedule` and `ctx` are the executor's own objects, opaque to callers, except
    that a schedule has `num_tokens`, `topk` and `num_local_experts` and a ctx has `y_slots` ([T, K, H] bf16)."""

    name: str

    def supports(self, device: torch.device) -> bool: ...
    def create_workspace(self, key: WorkspaceKey, config: MoKConfig) -> Any: ...
    def build_schedule(self, topk_ids, num_local_experts: int, group, workspace: Workspace) -> Any: ...
    def forward(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace: Workspace,
                swiglu_limit, need_context: bool): ...
    def recompute_forward_context(self, x, topk_ids, topk_weights, routed, shared, *, schedule,
                                  workspace: Workspace, swiglu_limit, y_slots): ...
    def backward(self, ctx, dout, main_grads: MainGrads | None) -> Gradients: ...


_BACKENDS: dict[str, tuple[int, Executor]] = {}


def register_backend(executor: Executor, priority: int) -> None:
    """Make `executor` selectable as backend=executor.name; backend=None prefers the highest priority."""
    _BACKENDS[executor.name] = (priority, executor)


def unregister_backend(name: str) -> None:
    _BACKENDS.pop(name, None)


def backends() -> list[str]:
    """Registered backend names, most preferred first."""
    return [name for name, _ in sorted(_BACKENDS.items(), key=lambda kv: -kv[1][0])]


def select_backend(backend: str | None, device: torch.device) -> Executor:
    """The executor for `backend` (None: the best one that supports `device`)."""
    if backend is None:
        for name in backends():
            if _BACKENDS[name][1].supports(device):
                return _BACKENDS[name][1]
        raise RuntimeError(f"no registered backend supports device {device} (registered: {backends()})")
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(f"backend must be None or one of {backends()}, got {backend!r}")
    executor = _BACKENDS[backend][1]
    if not executor.supports(device):
        raise ValueError(f"backend {backend!r} does not support device {device}")
    return executor


class _ReferenceExecutor:
    """Expert parallelism over torch.distributed with reference.py's math: any device, any group, W = 1..72.
    Its context (ep.Context) keeps the expert side's inputs and activations and the token side's y slots."""

    name = "reference"

    def supports(self, device: torch.device) -> bool:
        return True

    def create_workspace(self, key, config):
        return None  # all_to_all_single allocates what it needs

    def build_schedule(self, topk_ids, num_local_experts, group, workspace):
        return ep.build_schedule(topk_ids, num_local_experts, group)

    def forward(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace, swiglu_limit,
                need_context):
        return ep.forward(x, topk_ids, topk_weights, routed, shared, schedule=schedule, swiglu_limit=swiglu_limit,
                          need_context=need_context)

    def recompute_forward_context(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace,
                                  swiglu_limit, y_slots):
        return ep.recompute_forward_context(x, topk_ids, topk_weights, routed, shared, schedule=schedule,
                                            swiglu_limit=swiglu_limit, y_slots=y_slots)

    def backward(self, ctx, dout, main_grads):
        return ep.backward(ctx, dout, main_grads)


register_backend(_ReferenceExecutor(), priority=0)


# ----------------------------------------------------------------------------------------------------------------
# Workspace


@dataclass(frozen=True)
class WorkspaceKey:
    """What a workspace is sized for. A call fits a workspace when its shapes equal these (T up to max_tokens)."""

    group_id: int
    device: torch.device
    max_tokens: int
    hidden: int
    topk: int
    num_local_experts: int
    intermediate: int
    shared_intermediate: int
    mxfp8: bool
    backend: str


@dataclass(frozen=True)
class Workspace:
    """Memory an executor keeps between calls, for one group, device and set of shapes."""

    key: WorkspaceKey
    config: MoKConfig
    group: Any
    buffers: Any = field(repr=False, default=None)


def create_workspace(*, max_tokens: int, hidden: int, topk: int, num_local_experts: int, intermediate: int,
                     shared_intermediate: int = 0, mxfp8: bool = False, group=None, device=None,
                     config: MoKConfig | None = None, backend: str | None = None) -> Workspace:
    """A new workspace for calls with at most `max_tokens` tokens on any rank and these shapes. Every rank of
    the group must create it with the same arguments."""
    key, config = _workspace_key(max_tokens, hidden, topk, num_local_experts, intermediate, shared_intermediate,
                                 mxfp8, group, device, config, backend)
    return Workspace(key, config, group, _BACKENDS[key.backend][1].create_workspace(key, config))


_WORKSPACES: dict[tuple, Workspace] = {}


def get_workspace(*, max_tokens: int, hidden: int, topk: int, num_local_experts: int, intermediate: int,
                  shared_intermediate: int = 0, mxfp8: bool = False, group=None, device=None,
                  config: MoKConfig | None = None, backend: str | None = None) -> Workspace:
    """create_workspace's result, made once per group, device, shapes, config and backend, then reused."""
    args = (max_tokens, hidden, topk, num_local_experts, intermediate, shared_intermediate, mxfp8, group, device,
            config, backend)
    key, config = _workspace_key(*args)
    if (key, config) not in _WORKSPACES:
        _WORKSPACES[key, config] = Workspace(key, config, group,
                                             _BACKENDS[key.backend][1].create_workspace(key, config))
    return _WORKSPACES[key, config]


def _workspace_key(max_tokens, hidden, topk, num_local_experts, intermediate, shared_intermediate, mxfp8, group,
                   device, config, backend) -> tuple[WorkspaceKey, MoKConfig]:
    device = torch.device(device if device is not None else "cpu")
    config = _config(config)
    for name, value, low, high in (("max_tokens", max_tokens, 0, validate.MAX_TOKENS),
                                   ("hidden", hidden, 1, validate.MAX_HIDDEN), ("topk", topk, 1, validate.MAX_TOPK),
                                   ("num_local_experts", num_local_experts, 1, validate.MAX_EXPERTS_PER_RANK),
                                   ("intermediate", intermediate, 1, validate.MAX_INTERMEDIATE),
                                   ("shared_intermediate", shared_intermediate, 0, validate.MAX_INTERMEDIATE)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name} must be an int in [{low}, {high}] (libmok's limit), got {value!r}")
    validate.check_mxfp8_padding(mxfp8, config.expert_padding)
    executor = select_backend(backend, device)
    # id(group): the cache holds the group object in the Workspace, so the id cannot be reused while cached.
    key = WorkspaceKey(id(group), device, max_tokens, hidden, topk, num_local_experts, intermediate,
                       shared_intermediate, bool(mxfp8), executor.name)
    return key, config


def _config(config: MoKConfig | None) -> MoKConfig:
    if config is None:
        return MoKConfig()
    if not isinstance(config, MoKConfig):
        raise TypeError(f"config must be a MoKConfig or None, got {type(config).__name__}")
    return config


# ----------------------------------------------------------------------------------------------------------------
# The layer


@dataclass
class ForwardContext:
    """What forward(need_context=True) and recompute_forward_context return for backward. Opaque."""

    executor: Executor
    inner: Any
    x_shape: tuple
    device: torch.device
    routed: Any
    shared: Any
    group: Any
    world: int

    @property
    def y_slots(self) -> torch.Tensor:
        """[T, K, H] bf16: each route's expert output as combined (zero for -1 routes). Every executor's
        context provides it: the router-weight gradient needs it, and it lets a recompute skip the combine."""
        return self.inner.y_slots


def build_schedule(topk_ids: torch.Tensor, num_local_experts: int, *, group=None, workspace: Workspace | None = None,
                   backend: str | None = None):
    """Where every routed row goes, for these topk_ids [T, K] (one all_to_all of counts). A forward given
    this schedule must get the same topk_ids; its backward reuses it. Collective: call on every rank."""
    rank, world = ep.group_rank_and_size(group)
    error = None
    try:
        validate._check_tensor(topk_ids, "topk_ids", (torch.int32, torch.int64), ndim=2)
        top = validate.MAX_EXPERTS_PER_RANK
        if isinstance(num_local_experts, bool) or not isinstance(num_local_experts, int) or \
                not 1 <= num_local_experts <= top:
            raise ValueError(f"num_local_experts must be an int in [1, {top}] (libmok's limit), got "
                             f"{num_local_experts!r}")
        validate.check_routing_limits(topk_ids, world)
        validate.check_expert_ids(topk_ids, world * num_local_experts)
        executor = select_backend(backend, topk_ids.device)
    except (TypeError, ValueError) as e:
        error = e
    validate.agree_across_group(group, world, error)
    return executor.build_schedule(topk_ids, num_local_experts, group, workspace)


def forward(x, topk_ids, topk_weights, routed, shared=None, *, group=None, config: MoKConfig | None = None,
            workspace: Workspace | None = None, schedule=None, backend: str | None = None, swiglu_limit=None,
            need_context: bool = True):
    """The layer's forward on this rank's tokens: returns (out [T, H] bf16, context or None).

    x [T, H] bf16; topk_ids [T, K] int32/int64, global expert ids in [0, W * E_local) or -1 (no route);
    topk_weights [T, K] fp32; routed: this rank's RoutedExperts (or RoutedExpertsMXFP8 for MXFP8 mode);
    shared: SharedExpert or None. need_context=False is inference mode: nothing is kept for a backward.
    Collective over `group` (None: the default group if initialised, else this process alone).
    """
    call = _prepare(x, topk_ids, topk_weights, routed, shared, group, config, workspace, schedule, backend,
                    swiglu_limit)
    out, inner = call.executor.forward(x, topk_ids, topk_weights, routed, shared, schedule=call.schedule,
                                       workspace=call.workspace, swiglu_limit=swiglu_limit,
                                       need_context=need_context)
    return out, (call.context(inner, x, routed, shared) if need_context else None)


def recompute_forward_context(x, topk_ids, topk_weights, routed, shared=None, *, group=None,
                              config: MoKConfig | None = None, workspace: Workspace | None = None, schedule=None,
                              backend: str | None = None, swiglu_limit=None, y_slots=None) -> ForwardContext:
    """The context forward(need_context=True) would have returned, for a forward run with need_context=False
    (activation recompute). Same arguments as that forward; bitwise the same context."""
    call = _prepare(x, topk_ids, topk_weights, routed, shared, group, config, workspace, schedule, backend,
                    swiglu_limit, y_slots)
    inner = call.executor.recompute_forward_context(x, topk_ids, topk_weights, routed, shared,
                                                    schedule=call.schedule, workspace=call.workspace,
                                                    swiglu_limit=swiglu_limit, y_slots=y_slots)
    return call.context(inner, x, routed, shared)


def backward(ctx: ForwardContext, dout: torch.Tensor, *, main_grads: MainGrads | None = None) -> Gradients:
    """All gradients, given dout [T, H] bf16: Gradients(x, topk_weights, gate, up, down, shared_gate, shared_up,
    shared_down). Weight gradients are bf16 (of the bf16 masters in MXFP8 mode), accumulated in fp32 in the
    canonical row order; with main_grads, a weight's fp32 gradient is added into its buffer instead and its
    entry is None. Routed weight gradients are this rank's experts'; shared ones are over this rank's tokens.
    Collective over the forward's group."""
    if not isinstance(ctx, ForwardContext):
        raise TypeError(f"ctx must be the context returned by forward(need_context=True) or "
                        f"recompute_forward_context, got {type(ctx).__name__}")
    error = None
    try:
        validate.check_dout(dout, ctx.x_shape, ctx.device)
        if main_grads is not None and not isinstance(main_grads, MainGrads):
            raise TypeError(f"main_grads must be a mok.functional.MainGrads or None, got {type(main_grads).__name__}")
        validate.check_main_grads(main_grads, ctx.routed, ctx.shared)
    except (TypeError, ValueError) as e:
        error = e
    validate.agree_across_group(ctx.group, ctx.world, error)
    return ctx.executor.backward(ctx.inner, dout, main_grads)


@dataclass
class _Call:
    executor: Executor
    workspace: Workspace
    schedule: Any
    group: Any
    world: int

    def context(self, inner, x, routed, shared) -> ForwardContext:
        return ForwardContext(self.executor, inner, tuple(x.shape), x.device, routed, shared, self.group, self.world)


def _prepare(x, topk_ids, topk_weights, routed, shared, group, config, workspace, schedule, backend,
             swiglu_limit, y_slots=None) -> _Call:
    """Check everything on every rank (one small all_gather), then find the executor, workspace and schedule."""
    rank, world = ep.group_rank_and_size(group)
    error, shape = None, None
    try:
        config = _config(config)
        shape = validate.check_layer_args(x, topk_ids, topk_weights, routed, shared, swiglu_limit, world)
        validate.check_y_slots(y_slots, (*topk_ids.shape, shape.hidden), x.device)
        executor = select_backend(backend, x.device)
        padding = (workspace.config if isinstance(workspace, Workspace) else config).expert_padding
        shape = shape._replace(expert_padding=padding)  # part of the layout every rank must agree on
        validate.check_mxfp8_padding(shape.mxfp8, padding)
        _check_workspace(workspace, shape, executor, x, group)
        _check_schedule(schedule, x, shape)
    except (TypeError, ValueError) as e:
        error = e
    tokens = validate.agree_across_group(group, world, error, shape, x.shape[0] if shape else 0)
    padding = shape.expert_padding
    rows = _routed_rows(world, max(tokens), shape, padding)
    if rows > validate.MAX_ROWS:
        raise ValueError(f"group size ({world}) x the most tokens on a rank ({max(tokens)}) x topk ({shape.topk}) "
                         f"+ E_local x expert_padding must be at most 2^31 - 1 routed rows (libmok's limit), "
                         f"got {rows}")
    if workspace is None:
        workspace = get_workspace(max_tokens=_workspace_tokens(max(tokens), world, shape, padding),
                                  hidden=shape.hidden, topk=shape.topk, num_local_experts=shape.num_local_experts,
                                  intermediate=shape.intermediate,
                                  shared_intermediate=shape.shared_intermediate, mxfp8=shape.mxfp8, group=group,
                                  device=x.device, config=config, backend=executor.name)
    elif max(tokens) > workspace.key.max_tokens:
        raise ValueError(f"workspace was made for max_tokens={workspace.key.max_tokens}, but a rank has "
                         f"{max(tokens)} tokens")
    if schedule is None:
        schedule = executor.build_schedule(topk_ids, shape.num_local_experts, group, workspace)
    return _Call(executor, workspace, schedule, group, world)


def _check_workspace(workspace, shape, executor, x, group) -> None:
    if workspace is None:
        return
    if not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must be a Workspace from create_workspace/get_workspace, "
                        f"got {type(workspace).__name__}")
    k = workspace.key
    if k.group_id != id(group):
        raise ValueError("workspace must have been made for this call's group")
    made = (k.hidden, k.topk, k.num_local_experts, k.intermediate, k.shared_intermediate, k.mxfp8, k.backend,
            k.device)
    wanted = (shape.hidden, shape.topk, shape.num_local_experts, shape.intermediate, shape.shared_intermediate,
              shape.mxfp8, executor.name, x.device)
    if made != wanted:
        raise ValueError(f"workspace must match the call's (hidden, topk, E_local, I, I_s, mxfp8, backend, device) "
                         f"= {wanted}, got {made}")


def _check_schedule(schedule, x, shape) -> None:
    if schedule is None:
        return
    made = tuple(getattr(schedule, a, None) for a in ("num_tokens", "topk", "num_local_experts"))
    wanted = (x.shape[0], shape.topk, shape.num_local_experts)
    if made != wanted:
        raise ValueError(f"schedule must be built from this call's topk_ids (T, K, E_local) = {wanted}, got {made}")


def _routed_rows(world: int, max_tokens: int, shape, padding: int) -> int:
    return world * max_tokens * shape.topk + shape.num_local_experts * padding


def _workspace_tokens(tokens: int, world: int, shape, padding: int) -> int:
    """The max_tokens of an implicit workspace: `tokens` rounded up to a power of two (so that a few workspaces
    serve calls of any size), but never past libmok's limits, which `tokens` itself is known to meet."""
    fits = int((validate.MAX_ROWS - shape.num_local_experts * padding) // (world * shape.topk))
    return max(tokens, min(_round_up_pow2(tokens), validate.MAX_TOKENS, fits))


def _round_up_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
