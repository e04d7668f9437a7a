"""The layer in pieces: config, workspace, schedule, forward, backward, context recompute.

Use this when a trainer wants control (keep or drop the backward context, recompute it later, accumulate weight
gradients into fp32 main_grad buffers, reuse a schedule). `mok.moe` is the one-call form on top of it.

An executor ("backend") does the work. Each registers one object with `register_backend`; `backend=None` picks
the highest-priority one that supports the input's device. This file ships "reference": expert parallelism over
torch.distributed (mok.ep) with reference.py's per-expert math, on any device and any process group. A later
executor (libmok's "host" executor through mok._mok, the GPU executors) plugs in by registering itself.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mok import ep, validate
from mok.ep import MainGrads
from mok.experts import RoutedExpertsMXFP8
from mok.quant import mxfp8_quantize  # noqa: F401  (part of the functional API, as in DESIGN 3)
from mok.reference import Gradients

__all__ = [
    "MoKConfig", "Workspace", "create_workspace", "get_workspace", "build_schedule", "forward", "backward",
    "recompute_forward_context", "mxfp8_quantize", "MainGrads", "Gradients", "register_backend",
    "unregister_backend", "backends", "select_backend", "clear_workspaces", "LOCAL", "MAX_CACHED_WORKSPACES",
]

LOCAL = ep.LOCAL


# ----------------------------------------------------------------------------------------------------------------
# Config


@dataclass(frozen=True)
class MoKConfig:
    """How an executor runs the layer. The result never depends on it (DESIGN 1: determinism); only speed and
    memory do. The reference executor checks it and otherwise ignores it.

    fwd_num_comm_sms / bwd_num_comm_sms: workers that only move tokens in the forward (and recompute) / backward, the
    rest of the executor's fixed workers computing; None: the executor's choice. On backend="host" they are comm
    threads out of the layer's host_comm_workers + host_compute_workers (each fewer than that total; None:
    host_comm_workers); a GPU executor splits its SMs (its choice: 40 forward, 28 backward).
    minibatch_size: rows per overlap step (comm of step i+1 overlaps compute of step i).
    macrobatch_size: rows the ring buffer holds; a multiple of minibatch_size.
    expert_padding: each expert's row segment is padded to a multiple of this (the GEMM tile height).
    wait_timeout_s: the longest any wait for a peer may take before the layer stops with an error.
    host_comm_workers / host_compute_workers: threads per rank of the host executor (backend="host") that move rows
    / compute tiles; host_compute_workers=None: the CPUs this process may run on, divided by the group's ranks
    (all on this host: they share memory), at least 1.

    "auto" (fwd_num_comm_sms, bwd_num_comm_sms, minibatch_size, macrobatch_size): the autotuner (mok.tune.best over
    mok.perf, a model of a GPU) chooses the value when the workspace is made, for its shapes, group size and
    gpu_profile (cached: one search per shape); `workspace.config` holds the values chosen. gpu_profile: the GPU
    profile it models (mok.perf.PROFILES: "GB200", "B200", ...); None: on CUDA the device's name picks it, on
    another device "auto" is an error (the model has no CPU). On backend="host" the comm fields become the GPU's
    comm share of the host's workers (docs/performance.md, "The autotuner"). The reference executor ignores
    these fields, "auto" too.
    """

    fwd_num_comm_sms: int | str | None = None
    bwd_num_comm_sms: int | str | None = None
    minibatch_size: int | str = 4096
    macrobatch_size: int | str = 131072
    expert_padding: int = 256
    wait_timeout_s: float = 60.0
    host_comm_workers: int = 1
    host_compute_workers: int | None = None
    gpu_profile: str | None = None

    def __post_init__(self):
        # The upper limits are libmok's (validate.py mirrors them from its C ABI), checked here so that the error
        # names the MoKConfig field and the value given, never the C field it becomes.
        for name in ("fwd_num_comm_sms", "bwd_num_comm_sms"):
            if getattr(self, name) is not None and not _auto(self, name):
                _check_int(self, name, 1, 256, "None or between 1 and 256 (a GPU has at most a few hundred SMs), "
                           "or 'auto'")
        _check_int(self, "expert_padding", 1, 1024, "a power of two between 1 and 1024")
        if self.expert_padding & (self.expert_padding - 1):
            raise ValueError(f"MoKConfig.expert_padding must be a power of two between 1 and 1024, "
                             f"got {self.expert_padding}")
        if not _auto(self, "minibatch_size"):
            _check_int(self, "minibatch_size", self.expert_padding, validate.MAX_MINIBATCH,
                       f"'auto' or a multiple of expert_padding ({self.expert_padding}), at most 2^24")
            if self.minibatch_size % self.expert_padding:
                raise ValueError(f"MoKConfig.minibatch_size must be 'auto' or a multiple of expert_padding "
                                 f"({self.expert_padding}), got {self.minibatch_size}")
        if not _auto(self, "macrobatch_size"):
            # with minibatch_size "auto", the minibatch chosen divides it: a multiple of expert_padding does
            unit, unit_name = ((self.expert_padding, "expert_padding") if _auto(self, "minibatch_size") else
                               (self.minibatch_size, "minibatch_size"))
            _check_int(self, "macrobatch_size", unit, validate.MAX_MACROBATCH,
                       f"'auto' or a multiple of {unit_name} ({unit}), at most 2^26")
            if self.macrobatch_size % unit:
                raise ValueError(f"MoKConfig.macrobatch_size must be 'auto' or a multiple of {unit_name} "
                                 f"({unit}), got {self.macrobatch_size}")
        if self.gpu_profile is not None:
            from mok.perf import PROFILES

            if not isinstance(self.gpu_profile, str) or self.gpu_profile not in PROFILES:
                raise ValueError(f"MoKConfig.gpu_profile must be None or one of {sorted(PROFILES)} (mok.perf's "
                                 f"GPU profiles), got {self.gpu_profile!r}")
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


def _auto(config, name: str) -> bool:
    """Whether the field is "auto" (any other string is refused by _check_int, naming the field)."""
    value = getattr(config, name)
    return isinstance(value, str) and value == "auto"


def _check_int(config, name: str, low: int, high: int, rule: str) -> None:
    value = getattr(config, name)
    if isinstance(value, str):
        raise ValueError(f"MoKConfig.{name} must be {rule}, got {value!r}")
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
    # True (the default when absent): every call exchanges its arguments. False: only a workspace's first call does,
    # and the executor reports data faults to every rank itself, stops its peers' pass through `stop_group(ws)`
    # and raises GroupResync when a peer stopped it (the host executor, through libmok's error record).
    agrees_per_call: bool

    # Optional: reads_schedule_config (default True): whether the executor reads the comm SM, minibatch and
    # macrobatch fields (False: their "auto" is not resolved); workers(config, world) -> int: its fixed workers that
    # the comm fields split when they are not a GPU's SMs (absent: a GPU executor, whose SMs the profile has).
    def supports(self, device: torch.device) -> bool: ...
    def create_workspace(self, key: WorkspaceKey, config: MoKConfig) -> Any: ...
    def build_schedule(self, topk_ids, num_local_experts: int, group, workspace: Workspace) -> Any: ...
    def forward(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace: Workspace,
                swiglu_limit, need_context: bool, activation: str = "swiglu", alpha: float | None = None): ...
    # activation "swiglu" or "swiglu_oai", alpha None with "swiglu" (checked by validate.check_activation); an
    # executor that serves routing_scale="input" (Llama4) takes routing_scale= too, given only with that value
    def recompute_forward_context(self, x, topk_ids, topk_weights, routed, shared, *, schedule,
                                  workspace: Workspace, swiglu_limit, y_slots, activation: str = "swiglu",
                                  alpha: float | None = None): ...
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


def select_backend(backend: str | None, device: torch.device, shape=None, backward: bool = False) -> Executor:
    """The executor for `backend` (None: the best one that supports `device` and, when `shape` (a
    validate.LayerShape) is given, runs that layer: an executor's optional refusal(shape, backward, device) says why
    not). backward: the call keeps or recomputes a context for a backward."""
    if backend is None:
        for name in backends():
            executor = _BACKENDS[name][1]
            if executor.supports(device) and _refusal(executor, shape, backward, device) is None:
                return executor
        raise RuntimeError(f"no registered backend supports device {device} (registered: {backends()})")
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(f"backend must be None or one of {backends()}, got {backend!r}")
    executor = _BACKENDS[backend][1]
    if not executor.supports(device):
        raise ValueError(f"backend {backend!r} does not support device {device}")
    reason = _refusal(executor, shape, backward, device)
    if reason is not None:
        raise ValueError(f"backend {executor.name!r} cannot run this layer: {reason}; backend='reference' runs it")
    return executor


def _call_executor(backend, device, shape, backward: bool, workspace) -> Executor:
    """A layer call's executor: `backend`'s; with backend None, the workspace's when one is given, otherwise the
    best that runs the layer. Each refuses the layer with its reason."""
    if backend is None and isinstance(workspace, Workspace):
        backend = workspace.key.backend
    return select_backend(backend, device, shape, backward)


# Which executor built each schedule build_schedule returned (by id, dropped with the schedule): a call whose
# executor is another one rebuilds a schedule that only holds its ids, and refuses one that holds a plan.
_SCHEDULE_OWNERS: dict[int, str] = {}


def _owned(schedule, executor):
    _SCHEDULE_OWNERS[id(schedule)] = executor.name
    weakref.finalize(schedule, _SCHEDULE_OWNERS.pop, id(schedule), None)
    return schedule


def _schedule_for(executor, schedule):
    """`schedule` for this call's executor: itself when that executor built it (or nobody knows), None (built again
    by the call, from its ids) when another built a schedule of its ids alone (libmok's executors build theirs inside
    the pass), else a ValueError naming both."""
    owner = _SCHEDULE_OWNERS.get(id(schedule)) if schedule is not None else None
    if owner is None or owner == executor.name:
        return schedule
    if getattr(schedule, "topk_ids", None) is not None:
        return None
    raise ValueError(f"schedule was built by backend {owner!r}, but this call runs on {executor.name!r} (it cannot "
                     f"run this layer on {owner!r}, or was told to): build the schedule with backend={executor.name!r}")


def _refusal(executor, shape, backward: bool, device: torch.device) -> str | None:
    refusal = getattr(executor, "refusal", None)
    return None if refusal is None or shape is None else refusal(shape, backward, device)


class _ReferenceExecutor:
    """Expert parallelism over torch.distributed with reference.py's math: any device, any group, W = 1..72.
    Its context (ep.Context) keeps the expert side's inputs and activations and the token side's y slots."""

    name = "reference"
    agrees_per_call = True  # its all_to_alls are torch.distributed calls anyway; the exchange gives every rank
    # a bad argument's reason
    reads_schedule_config = False  # comm SMs, minibatch, macrobatch: "auto" is left unresolved (no model run)

    def supports(self, device: torch.device) -> bool:
        return True

    def create_workspace(self, key, config):
        return None  # all_to_all_single allocates what it needs

    def build_schedule(self, topk_ids, num_local_experts, group, workspace):
        timeout = (workspace.config if workspace is not None else MoKConfig()).wait_timeout_s
        return ep.build_schedule(topk_ids, num_local_experts, group, timeout)

    def forward(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace, swiglu_limit,
                need_context, activation="swiglu", alpha=None, routing_scale="output"):
        return ep.forward(x, topk_ids, topk_weights, routed, shared, schedule=schedule, swiglu_limit=swiglu_limit,
                          need_context=need_context, activation=activation, alpha=alpha, routing_scale=routing_scale)

    def recompute_forward_context(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace,
                                  swiglu_limit, y_slots, activation="swiglu", alpha=None, routing_scale="output"):
        return ep.recompute_forward_context(x, topk_ids, topk_weights, routed, shared, schedule=schedule,
                                            swiglu_limit=swiglu_limit, y_slots=y_slots, activation=activation,
                                            alpha=alpha, routing_scale=routing_scale)

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
    """Memory an executor keeps between calls, for one group, device and set of shapes. `nonce` is a name the
    group agreed on when the workspace was made (the host executor names its shared memory after it)."""

    key: WorkspaceKey
    config: MoKConfig
    group: Any
    buffers: Any = field(repr=False, default=None)
    nonce: str = ""


def create_workspace(*, max_tokens: int, hidden: int, topk: int, num_local_experts: int, intermediate: int,
                     shared_intermediate: int = 0, mxfp8: bool = False, group=None, device=None,
                     config: MoKConfig | None = None, backend: str | None = None) -> Workspace:
    """A new workspace for calls with at most `max_tokens` tokens on any rank and these shapes. Collective: every
    rank of the group creates it with the same arguments (one bounded exchange checks that)."""
    key, config = _workspace_key(max_tokens, hidden, topk, num_local_experts, intermediate, shared_intermediate,
                                 mxfp8, group, device, config, backend)
    group = ep.resolve_group(group)
    _, world = ep.group_rank_and_size(group)
    _, nonce = _agree(group, world, config.wait_timeout_s, None, {"workspace": _without_group(key)}, 0)
    return _new_workspace(key, config, group, nonce)


# Implicit workspaces (mok.moe, and functional calls without one), least recently used last. Bounded: a model with
# more distinct layer shapes than this re-creates the oldest ones (every rank evicts the same: they make the same
# calls). clear_workspaces() drops them all.
MAX_CACHED_WORKSPACES = 8
_WORKSPACES: OrderedDict[tuple, Workspace] = OrderedDict()


def get_workspace(*, max_tokens: int, hidden: int, topk: int, num_local_experts: int, intermediate: int,
                  shared_intermediate: int = 0, mxfp8: bool = False, group=None, device=None,
                  config: MoKConfig | None = None, backend: str | None = None) -> Workspace:
    """create_workspace's result, made once per group, device, shapes, config and backend, then reused (the first
    call is collective, as create_workspace)."""
    key, config = _workspace_key(max_tokens, hidden, topk, num_local_experts, intermediate, shared_intermediate,
                                 mxfp8, group, device, config, backend)
    if ("explicit", key, config) not in _WORKSPACES:
        _cache(("explicit", key, config), create_workspace(
            max_tokens=max_tokens, hidden=hidden, topk=topk, num_local_experts=num_local_experts,
            intermediate=intermediate, shared_intermediate=shared_intermediate, mxfp8=mxfp8, group=group,
            device=device, config=config, backend=backend))
    _WORKSPACES.move_to_end(("explicit", key, config))
    return _WORKSPACES["explicit", key, config]


def clear_workspaces() -> None:
    """Drop every cached workspace and close the executors' resources they hold (libmok layers, shared memory).
    Call it on every rank of a group together: the next call makes new workspaces, which is collective."""
    while _WORKSPACES:
        _close(_WORKSPACES.popitem(last=False)[1])


atexit.register(clear_workspaces)  # libmok layers end their threads before the interpreter goes


def _cache(key: tuple, workspace: Workspace) -> None:
    _WORKSPACES[key] = workspace
    _WORKSPACES.move_to_end(key)
    while len(_WORKSPACES) > MAX_CACHED_WORKSPACES:
        _close(_WORKSPACES.popitem(last=False)[1])


def _close(workspace: Workspace) -> None:
    close = getattr(_BACKENDS.get(workspace.key.backend, (0, None))[1], "close_workspace", None)
    if close is not None:
        close(workspace)


def _new_workspace(key: WorkspaceKey, config: MoKConfig, group, nonce: str) -> Workspace:
    executor = _BACKENDS[key.backend][1]
    config = _resolve_auto(config, key, group, executor)
    return Workspace(key, config, group, executor.create_workspace(key, config), nonce)


def _resolve_auto(config: MoKConfig, key: WorkspaceKey, group, executor) -> MoKConfig:
    """config with its "auto" fields chosen by the autotuner for the workspace's shapes (mok.tune.resolve_config;
    every rank resolves alike: the same shapes, group size, profile and a deterministic model). An executor
    that reads none of these fields (reads_schedule_config False) keeps "auto"."""
    if not getattr(executor, "reads_schedule_config", True) or not any(
            _auto(config, f) for f in ("fwd_num_comm_sms", "bwd_num_comm_sms", "minibatch_size", "macrobatch_size")):
        return config
    from mok import tune

    world = ep.group_rank_and_size(group)[1]
    workers = getattr(executor, "workers", None)
    return tune.resolve_config(config, world=world, experts_per_rank=key.num_local_experts, hidden=key.hidden,
                               intermediate=key.intermediate, topk=key.topk, tokens=key.max_tokens,
                               shared_intermediate=key.shared_intermediate, mxfp8=key.mxfp8, device=key.device,
                               workers=None if workers is None else workers(config, world))


def _workspace_key(max_tokens, hidden, topk, num_local_experts, intermediate, shared_intermediate, mxfp8, group,
                   device, config, backend) -> tuple[WorkspaceKey, MoKConfig]:
    device = torch.device(device if device is not None else "cpu")
    config = _config(config)
    group = ep.resolve_group(group)
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


def _without_group(key: WorkspaceKey) -> WorkspaceKey:
    return WorkspaceKey(0, *dataclasses.astuple(key)[1:])


def _config(config: MoKConfig | None) -> MoKConfig:
    if config is None:
        return MoKConfig()
    if not isinstance(config, MoKConfig):
        raise TypeError(f"config must be a MoKConfig or None, got {type(config).__name__}")
    return config


# ----------------------------------------------------------------------------------------------------------------
# Agreement: the one exchange of torch.distributed, bounded by wait_timeout_s


_SOURCES = {**validate._FIELD_SOURCE, "backend": "the backend that runs it", "config": "MoKConfig",
            "device": "x.device.type", "call": "the call (forward, backward)", "workspace": "create_workspace's "
            "arguments"}


class GroupResync(Exception):
    """Raised by an executor when a peer stopped the group's pass on purpose (mok aborts its executor's group
    when a rank cannot enter a call: a rejected argument, or more tokens than the workspace holds). Every rank
    then agrees again: the reason is raised everywhere, or the workspace is rebuilt and the call retried.
    `error`: this rank's own rejected argument, if that was the cause."""

    def __init__(self, message: str, error: Exception | None = None):
        super().__init__(message)
        self.error = error


def _agree(group, world: int, timeout_s: float, error: Exception | None, record: dict,
           tokens: int) -> tuple[list[int], str]:
    """Raise on every rank if any rank failed its checks or the ranks' records disagree; else return every rank's
    token count and a name rank 0 drew. One bounded exchange of a small record per rank."""
    if world == 1:
        if error is not None:
            raise error
        return [tokens], uuid.uuid4().hex[:16]
    mine = (validate._portable(error), record, tokens, uuid.uuid4().hex[:16])
    records = ep.gather_objects(mine, group, world, timeout_s, "every rank of the group to agree on the layer's "
                                "arguments (the workspace agreement)")
    for rank, (err, _, _, _) in enumerate(records):
        if err is not None:
            kind, message = err
            raise kind(message if message.startswith("rank ") else f"rank {rank}: {message}")
    for name in record:
        values = [r.get(name) for _, r, _, _ in records]
        if any(v != values[0] for v in values):
            listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise ValueError(f"every rank of the group must have the same {name} ({_SOURCES.get(name, name)}), "
                             f"got {listing}")
    return [t for _, _, t, _ in records], records[0][3]


def _agree_call(executor, workspace, group, world: int, timeout_s: float, error: Exception | None, record: dict,
                tokens: int) -> tuple[list[int], str]:
    """_agree for a call, with the health of the executor's state in `workspace`: an executor with failure(workspace)
    (the cuda executor: an earlier pass failed, its error record says, seen by some ranks before others) makes every
    rank raise that failure, and a call that raises on every rank here closes the workspace's executor state on every
    rank, so that all make it anew at the next call together."""
    failure = getattr(executor, "failure", None) if _per_call(executor) else None
    if failure is None or workspace is None:
        return _agree(group, world, timeout_s, error, record, tokens)
    if error is None:
        failed = failure(workspace)
        error = None if failed is None else RuntimeError(failed)
    try:
        return _agree(group, world, timeout_s, error, record, tokens)
    except Exception:
        executor.close_workspace(workspace)
        raise


def _captured_call(executor, workspace, error: Exception | None) -> None:
    """A call while its stream is being captured into a CUDA graph agrees with no peer: a replay repeats no host
    exchange (and an NCCL one would be captured). So this rank's own error, and a failure its executor's record holds
    (left for the next eager call's agreement to close every rank's layers together), are raised here alone. Every
    rank captures the same calls; a rank whose capture raised is at no barrier of its peers' replays, which fail when
    their wait runs out (config.wait_timeout_s)."""
    if error is not None:
        raise error
    failure = getattr(executor, "failure", None)
    failed = failure(workspace) if failure is not None and workspace is not None else None
    if failed is not None:
        raise RuntimeError(failed)


def _captured_workspace(group, x, shape, config, executor, workspace, tokens: int, error: Exception | None):
    """The workspace of a call captured into a CUDA graph (_captured_call): one an eager call of this layer has
    made and agreed on, holding this rank's tokens; a capture neither allocates nor exchanges."""
    held = None if error is not None else _held_workspace(workspace, group, x, shape, config, executor)
    if error is None and (held is None or held.key.max_tokens < tokens):
        error = ValueError(f"a call captured into a CUDA graph runs in the workspace an eager call of the same "
                           f"layer made (at least {tokens} tokens) before the capture: make one eager call first")
    _captured_call(executor, held, error)
    return held


def _held_workspace(workspace, group, x, shape, config, executor) -> Workspace | None:
    """The workspace a call on `x` would run in, as far as it exists yet: the given one, or the cached implicit
    one (None for arguments that name none)."""
    if workspace is not None or executor is None or not isinstance(x, torch.Tensor):
        return workspace if isinstance(workspace, Workspace) else None
    return _WORKSPACES.get(_implicit_key(group, x.device, shape, config, executor))


def _call_record(call: str, shape, executor, config, device) -> dict:
    return {"call": call, **shape._asdict(), "backend": executor.name, "config": config, "device": device.type}


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
    workspace: Workspace | None = None

    @property
    def y_slots(self) -> torch.Tensor:
        """[T, K, H] bf16: each route's expert output as combined (zero for -1 routes). Every executor's
        context provides it: the router-weight gradient needs it, and it lets a recompute skip the combine."""
        return self.inner.y_slots


def build_schedule(topk_ids: torch.Tensor, num_local_experts: int, *, group=None, workspace: Workspace | None = None,
                   backend: str | None = None):
    """Where every routed row goes, for these topk_ids [T, K] (the reference executor: one all_to_all of counts;
    the host executor: at the forward, inside libmok). A forward given this schedule must get the same
    topk_ids; its backward reuses it. Collective: call on every rank."""
    group = ep.resolve_group(group)
    rank, world = ep.group_rank_and_size(group)
    error, executor = None, None
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
    timeout = (workspace.config if isinstance(workspace, Workspace) else MoKConfig()).wait_timeout_s
    if validate.capturing(topk_ids):
        _captured_call(executor, None, error)
    elif executor is None or _per_call(executor):
        _agree(group, world, timeout, error, {}, 0)
    elif error is not None:
        raise error  # a host schedule is local: libmok's forward is the collective step
    return _owned(executor.build_schedule(topk_ids, num_local_experts, group, workspace), executor)


def forward(x, topk_ids, topk_weights, routed, shared=None, *, group=None, config: MoKConfig | None = None,
            workspace: Workspace | None = None, schedule=None, backend: str | None = None, swiglu_limit=None,
            need_context: bool = True, activation: str = "swiglu", alpha: float | None = None,
            routing_scale: str = "output"):
    """The layer's forward on this rank's tokens: returns (out [T, H] bf16, context or None).

    x [T, H] bf16; topk_ids [T, K] int32/int64, global expert ids in [0, W * E_local) or -1 (no route);
    topk_weights [T, K] fp32; routed: this rank's RoutedExperts (or RoutedExpertsMXFP8 for MXFP8 mode);
    shared: SharedExpert or None. need_context=False is inference mode: nothing is kept for a backward.
    activation: "swiglu" (silu(g') * u') or "swiglu_oai" (gpt-oss: g' * sigmoid(alpha * g') * (u' + 1)); alpha:
    swiglu_oai's, None (meaning 1.702) or a finite float > 0, and None with "swiglu". Both are part of the
    workspace's key and of what every rank must agree on, like swiglu_limit. routing_scale: "output" (out = shared +
    sum_k w_k y_k(x)) or "input" (Llama4: out = shared + sum_k y_k(bf16(w_k x))), also agreed on by every rank.
    Collective over `group`: the expert-parallel process group, or mok.LOCAL for this process alone (None means
    LOCAL unless torch.distributed is initialised with more than one rank, where it is an error).
    """
    def run(call):
        with no_autocast(x.device):
            return call.executor.forward(x, topk_ids, topk_weights, routed, shared, schedule=call.schedule,
                                         workspace=call.workspace, swiglu_limit=swiglu_limit,
                                         need_context=need_context, **call.activation)

    call, (out, inner) = _run("forward", run, x, topk_ids, topk_weights, routed, shared, group, config, workspace,
                              schedule, backend, swiglu_limit, None, activation, alpha, routing_scale,
                              backward=need_context)
    return out, (call.context(inner, x, routed, shared) if need_context else None)


def recompute_forward_context(x, topk_ids, topk_weights, routed, shared=None, *, group=None,
                              config: MoKConfig | None = None, workspace: Workspace | None = None, schedule=None,
                              backend: str | None = None, swiglu_limit=None, y_slots=None,
                              activation: str = "swiglu", alpha: float | None = None,
                              routing_scale: str = "output") -> ForwardContext:
    """The context forward(need_context=True) would have returned, for a forward run with need_context=False
    (activation recompute). Same arguments as that forward; bitwise the same context."""
    def run(call):
        with no_autocast(x.device):
            return call.executor.recompute_forward_context(x, topk_ids, topk_weights, routed, shared,
                                                           schedule=call.schedule, workspace=call.workspace,
                                                           swiglu_limit=swiglu_limit, y_slots=y_slots,
                                                           **call.activation)

    call, inner = _run("forward", run, x, topk_ids, topk_weights, routed, shared, group, config, workspace,
                       schedule, backend, swiglu_limit, y_slots, activation, alpha, routing_scale, backward=True)
    return call.context(inner, x, routed, shared)


def backward(ctx: ForwardContext, dout: torch.Tensor, *, main_grads: MainGrads | None = None) -> Gradients:
    """All gradients, given dout [T, H] bf16: Gradients(x, topk_weights, gate, up, down, shared_gate, shared_up,
    shared_down, the biases', shared_router). Weight gradients are bf16 (of the bf16 masters in MXFP8 mode),
    accumulated in fp32 in the canonical row order; with main_grads, a weight's fp32 gradient is added into its
    buffer instead and its entry is None. Routed weight gradients are this rank's experts'; shared ones are over
    this rank's tokens. Collective over the forward's group."""
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
    timeout = ctx.workspace.config.wait_timeout_s if ctx.workspace is not None else MoKConfig().wait_timeout_s
    if validate.capturing_on(ctx.device):
        _captured_call(ctx.executor, ctx.workspace, error)
    elif _per_call(ctx.executor):
        _agree_call(ctx.executor, ctx.workspace, ctx.group, ctx.world, timeout, error, {"call": "backward"}, 0)
    elif error is not None:
        _stop_peers(ctx.executor, ctx.workspace)
        _agree(ctx.group, ctx.world, timeout, error, {}, 0)
    with no_autocast(ctx.device):
        try:
            return ctx.executor.backward(ctx.inner, dout, main_grads)
        except GroupResync as resync:
            _agree(ctx.group, ctx.world, timeout, resync.error, {}, 0)  # raises the reason on every rank
            return ctx.executor.backward(ctx.inner, dout, main_grads)


def no_autocast(device: torch.device):
    """Autocast off for device's type while an executor runs: its math has fixed rounding points
    (docs/semantics.md), which an enclosing autocast region would otherwise lower to bf16 (the reference
    executor's fp32 GEMMs; a backward run inside the caller's region inherits it too)."""
    kind = device.type
    if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()


@dataclass
class _Call:
    executor: Executor
    workspace: Workspace
    schedule: Any
    group: Any
    world: int
    activation: dict  # the executor's activation= and alpha= (validated), and routing_scale="input" when so

    def context(self, inner, x, routed, shared) -> ForwardContext:
        return ForwardContext(self.executor, inner, tuple(x.shape), x.device, routed, shared, self.group, self.world,
                              self.workspace)


def _run(name, run, *args, backward: bool):
    """_prepare, then run(call); a GroupResync (a peer could not enter the call) agrees again with that peer,
    which raises its reason here too or rebuilds the workspace, and runs the call once more. backward: the call
    keeps (or recomputes) a context for a backward, which the executor must be able to run."""
    call = _prepare(name, *args, backward=backward)
    try:
        return call, run(call)
    except GroupResync as resync:
        call = _prepare(name, *args, resync=resync, backward=backward)
        return call, run(call)


def _prepare(name, x, topk_ids, topk_weights, routed, shared, group, config, workspace, schedule, backend,
             swiglu_limit, y_slots=None, activation="swiglu", alpha=None, routing_scale="output",
             resync: GroupResync | None = None, backward: bool = True) -> _Call:
    """Check this rank's arguments, then find the executor, workspace and schedule. The first call of a
    workspace (and a reference-executor call) agrees with the group in one bounded exchange; a host-executor
    call that fits its workspace has no torch.distributed call at all."""
    group = ep.resolve_group(group)
    rank, world = ep.group_rank_and_size(group)
    error, shape, executor, tokens = None, None, None, x.shape[0] if isinstance(x, torch.Tensor) else 0
    try:
        config = _config(config)
        shape = validate.check_layer_args(x, topk_ids, topk_weights, routed, shared, swiglu_limit, world,
                                          activation, alpha, routing_scale)
        validate.check_y_slots(y_slots, (*topk_ids.shape, shape.hidden), x.device)
        padding = (workspace.config if isinstance(workspace, Workspace) else config).expert_padding
        shape = shape._replace(expert_padding=padding)  # part of the layout every rank must agree on
        validate.check_mxfp8_padding(shape.mxfp8, padding)
        executor = _call_executor(backend, x.device, shape, backward, workspace)
        _check_workspace(workspace, shape, executor, x, group)
        _check_schedule(schedule, x, shape)
        schedule = _schedule_for(executor, schedule)
        _check_rows(world, tokens, shape, padding)
    except (TypeError, ValueError) as e:
        error = e
    timeout = (workspace.config if isinstance(workspace, Workspace) else
               config if isinstance(config, MoKConfig) else MoKConfig()).wait_timeout_s
    if error is not None and (shape is None or executor is None):
        # A rank with a bad value (an id out of range) still has to stop its peers' pass on the workspace they
        # are in: the one these shapes name.
        shape, executor = _guess(x, topk_ids, routed, shared, swiglu_limit, workspace, config, backend, activation,
                                 alpha, routing_scale, backward)
    if resync is not None and resync.error is not None:
        error = error or resync.error
    if any(validate.capturing(t) for t in (x, topk_ids, topk_weights)):
        workspace = _captured_workspace(group, x, shape, config, executor, workspace, tokens, error)
    elif executor is None or _per_call(executor) or world == 1:
        record = {} if error is not None else _call_record(name, shape, executor, config, x.device)
        held = _held_workspace(workspace, group, x, shape, config, executor)
        counts, nonce = _agree_call(executor, held, group, world, timeout, error, record, tokens)
        _check_rows(world, max(counts), shape, shape.expert_padding)
        if workspace is not None and max(counts) > workspace.key.max_tokens:
            raise ValueError(f"workspace was made for max_tokens={workspace.key.max_tokens}, but a rank has "
                             f"{max(counts)} tokens")
        workspace = workspace or _implicit(group, x.device, shape, config, executor, world, max(counts), nonce)
    else:
        workspace = _steady_workspace(name, group, world, timeout, error, x, shape, config, executor, workspace,
                                      tokens, resync)
    if workspace.key.max_tokens < tokens:
        raise ValueError(f"workspace was made for max_tokens={workspace.key.max_tokens}, but this rank has "
                         f"{tokens} tokens")
    if schedule is None:
        schedule = executor.build_schedule(topk_ids, shape.num_local_experts, group, workspace)
    math = dict(activation=shape.activation, alpha=shape.alpha)
    if shape.routing_scale != "output":  # only then: an executor without the option keeps its signature
        math["routing_scale"] = shape.routing_scale
    return _Call(executor, workspace, schedule, group, world, math)


def _steady_workspace(name, group, world, timeout, error, x, shape, config, executor, workspace, tokens, resync):
    """The workspace of a call on an executor whose pass reports data faults itself (libmok's error record): no
    exchange while the call fits. Otherwise this rank stops its peers' pass (they get GroupResync) and agrees
    with them: an error is raised on every rank, or every rank makes the workspace the call needs."""
    implicit = workspace is None
    key = _implicit_key(group, x.device, shape, config, executor) if shape is not None else None
    current = _WORKSPACES.get(key) if implicit and key is not None else workspace
    if resync is None and error is None and current is not None and tokens <= current.key.max_tokens:
        if implicit:
            _WORKSPACES.move_to_end(key)
        return current
    if resync is None and current is not None:
        _stop_peers(executor, current)
    if error is None and not implicit and tokens > workspace.key.max_tokens:
        error = ValueError(f"workspace was made for max_tokens={workspace.key.max_tokens}, but this rank has "
                           f"{tokens} tokens")
    record = {} if error is not None else _call_record(name, shape, executor, config, x.device)
    counts, nonce = _agree(group, world, timeout, error, record, tokens)
    _check_rows(world, max(counts), shape, shape.expert_padding)
    if not implicit:
        return workspace
    most = max(counts + ([current.key.max_tokens] if current is not None else []))
    if current is not None:
        _close(_WORKSPACES.pop(key))
    return _implicit(group, x.device, shape, config, executor, world, most, nonce)


def _guess(x, topk_ids, routed, shared, swiglu_limit, workspace, config, backend, activation, alpha, routing_scale,
           backward):
    """(shape, executor) of a call whose checks failed, as far as its arguments tell (the executor its peers'
    select_backend picks); (None, None) if they don't."""
    try:
        master = routed.master if isinstance(routed, RoutedExpertsMXFP8) else routed
        padding = (workspace.config if isinstance(workspace, Workspace) else config).expert_padding
        shape = validate.LayerShape(x.shape[1], topk_ids.shape[1], master.gate.shape[0], master.gate.shape[1],
                                    0 if shared is None else shared.gate.shape[0],
                                    isinstance(routed, RoutedExpertsMXFP8), validate.check_swiglu_limit(swiglu_limit),
                                    padding, *validate.check_activation(activation, alpha),
                                    validate.check_routing_scale(routing_scale), bool(master.biases()))
        return shape, _call_executor(backend, x.device, shape, backward, workspace)
    except Exception:  # noqa: BLE001 - a guess: the call's own error is what gets raised
        return None, None


def _per_call(executor) -> bool:
    return getattr(executor, "agrees_per_call", True)


def _stop_peers(executor, workspace) -> None:
    """Make the peers' pass on `workspace` return at once (they then agree with this rank, see GroupResync)."""
    stop = getattr(executor, "stop_group", None)
    if stop is not None and workspace is not None:
        stop(workspace)


def _implicit_key(group, device, shape, config, executor) -> tuple:
    return ("implicit", id(group), device, shape, config, executor.name)


def _implicit(group, device, shape, config, executor, world, tokens, nonce) -> Workspace:
    """The cached workspace for these shapes, made (without another exchange: the caller has just agreed) if the
    cached one is missing or too small."""
    key = _implicit_key(group, device, shape, config, executor)
    cached = _WORKSPACES.get(key)
    if cached is not None and cached.key.max_tokens >= tokens:
        _WORKSPACES.move_to_end(key)
        return cached
    if cached is not None:
        _close(_WORKSPACES.pop(key))
    padding = shape.expert_padding
    made = WorkspaceKey(id(group), device, _workspace_tokens(tokens, world, shape, padding), shape.hidden,
                        shape.topk, shape.num_local_experts, shape.intermediate, shape.shared_intermediate,
                        shape.mxfp8, executor.name)
    workspace = _new_workspace(made, config, group, nonce)
    _cache(key, workspace)
    return workspace


def _check_rows(world: int, tokens: int, shape, padding: int) -> None:
    rows = _routed_rows(world, tokens, shape, padding)
    if rows > validate.MAX_ROWS:
        raise ValueError(f"group size ({world}) x the most tokens on a rank ({tokens}) x topk ({shape.topk}) "
                         f"+ E_local x expert_padding must be at most 2^31 - 1 routed rows (libmok's limit), "
                         f"got {rows}")


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
