"""backend="host": libmok's CPU executor (kernel/src/host) through its C ABI.

Each rank is a process; the ranks' peer-visible memory is POSIX shared memory that libmok creates and maps under a
name agreed over the torch.distributed group, and unlinks once every rank has mapped it. libmok keeps the schedule
and the forward context inside its layer object; a context that is no longer the layer's latest (another forward
ran since) is rebuilt before its backward by re-running the schedule and a recompute, which is bitwise the same.
"""

from __future__ import annotations

import itertools
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from mok import _mok, ep, functional
from mok.ep import MainGrads
from mok.experts import RoutedExpertsMXFP8
from mok.reference import Gradients

_WORKERS = {"comm_workers": 1, "compute_workers": 1}  # processes share the cores; one thread of each per rank


@dataclass
class _Layers:
    """One workspace's libmok layers (one per SwiGLU clamp, which libmok fixes at creation) and what they hold."""

    key: Any
    config: Any
    layers: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    latest: dict = field(default_factory=dict)  # layer -> the token of the schedule/context it holds now


@dataclass
class _Schedule:
    """libmok builds the schedule inside a pass's layer (its workspace is only known at the pass)."""

    topk_ids: torch.Tensor
    num_local_experts: int
    group: Any

    num_tokens = property(lambda self: self.topk_ids.shape[0])
    topk = property(lambda self: self.topk_ids.shape[1])


@dataclass
class _Context:
    state: _Layers
    layer: Any
    schedule: _Schedule
    x: torch.Tensor
    topk_weights: torch.Tensor
    routed: Any
    shared: Any
    swiglu_limit: float | None
    token: int
    y_slots: torch.Tensor | None = None


_tokens = itertools.count()


def _shm_name(group) -> str:
    """A name for this group's shared memory that every rank agrees on (rank 0 draws it)."""
    name = [f"mok-{os.getpid()}-{uuid.uuid4().hex[:12]}"]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.broadcast_object_list(name, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return name[0]


def _ring_rows(key, config, world: int) -> tuple[int, int]:
    """(minibatch, macrobatch): the config's, but the ring never larger than the most rows a rank can receive."""
    minibatch = config.minibatch_size
    worst = world * key.max_tokens * key.topk + key.num_local_experts * config.expert_padding
    return minibatch, min(config.macrobatch_size, -(-worst // minibatch) * minibatch)


def _layer(state: _Layers, group, swiglu_limit: float | None):
    """This workspace's libmok layer for `swiglu_limit`, created collectively on first use. Keyed by process and
    group shape too: a forked process (or one that initialised torch.distributed since) must not reuse a layer
    whose shared memory and ranks belong to another group."""
    rank, world = ep.group_rank_and_size(group)
    key = (swiglu_limit, os.getpid(), world, rank)
    if key in state.layers:
        return state.layers[key]
    shape, config = state.key, state.config
    minibatch, macrobatch = _ring_rows(shape, config, world)
    cfg = dict(world=world, rank=rank, experts_per_rank=shape.num_local_experts, hidden=shape.hidden,
               intermediate=shape.intermediate, top_k=shape.topk, max_tokens=max(shape.max_tokens, 1),
               shared_intermediate=shape.shared_intermediate, mxfp8=shape.mxfp8,
               swiglu_limit=0.0 if swiglu_limit is None else float(swiglu_limit),
               expert_padding=config.expert_padding, minibatch=minibatch, macrobatch=macrobatch,
               timeout_ms=max(1, int(config.wait_timeout_s * 1000)), **_WORKERS)
    _, workspace_bytes = _mok.layer_sizes(cfg)
    workspace = torch.empty(workspace_bytes + 64, dtype=torch.uint8)
    offset = -workspace.data_ptr() % 64  # libmok wants 64-byte alignment
    layer = _mok.Layer(cfg, _shm_name(group), workspace.data_ptr() + offset, workspace_bytes)
    state.layers[key], state.memory[key] = layer, workspace
    return layer


def _masters(routed, shared) -> dict[str, torch.Tensor]:
    """The bf16 weights that get gradients, by MainGrads field name (MXFP8 experts: their bf16 masters)."""
    routed = routed.master if isinstance(routed, RoutedExpertsMXFP8) else routed
    names = [("gate", routed.gate), ("up", routed.up), ("down", routed.down)]
    if shared is not None:
        names += [("shared_gate", shared.gate), ("shared_up", shared.up), ("shared_down", shared.down)]
    return dict(names)


def _weights(routed, shared) -> dict:
    w = {}
    if isinstance(routed, RoutedExpertsMXFP8):
        for name in ("gate", "up", "down"):
            pair = getattr(routed, name)
            for form in ("rowwise", "colwise"):
                q = getattr(pair, form)
                w[f"{name}_{form}"] = (q.data.data_ptr(), q.scales.data_ptr())
        routed = routed.master
    for name in ("gate", "up", "down"):
        w[name] = getattr(routed, name).data_ptr()
        if shared is not None:
            w[f"shared_{name}"] = getattr(shared, name).data_ptr()
    return w


class HostExecutor:
    """functional.Executor over libmok's host executor: CPU tensors, gloo (or no) process groups."""

    name = "host"

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def create_workspace(self, key, config) -> _Layers:
        return _Layers(key, config)

    def build_schedule(self, topk_ids, num_local_experts, group, workspace) -> _Schedule:
        return _Schedule(topk_ids.contiguous(), num_local_experts, group)

    def forward(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace, swiglu_limit,
                need_context):
        ctx, out = self._run(x, topk_weights, routed, shared, schedule, workspace, swiglu_limit, want_output=True)
        return out, (ctx if need_context else None)

    def recompute_forward_context(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace,
                                  swiglu_limit, y_slots):
        return self._run(x, topk_weights, routed, shared, schedule, workspace, swiglu_limit, want_output=False)[0]

    def backward(self, ctx: _Context, dout, main_grads: MainGrads | None) -> Gradients:
        if ctx.state.latest.get(ctx.layer) != ctx.token:
            self._load(ctx)
        main = main_grads or MainGrads()
        # libmok adds fp32 weight gradients into these: the caller's main_grad buffers, or fresh zeros.
        fp32 = {n: getattr(main, n) if getattr(main, n) is not None else torch.zeros(w.shape)
                for n, w in _masters(ctx.routed, ctx.shared).items()}
        dout = dout.contiguous()  # bound to a name: libmok reads it through a raw pointer
        dx, dw = torch.empty_like(ctx.x), torch.empty(ctx.topk_weights.shape, dtype=torch.float32)
        grads = {"dx": dx.data_ptr(), "dtopk_weights": dw.data_ptr(), "accumulate": 1,
                 **{n: g.data_ptr() for n, g in fp32.items()}}
        ctx.layer.backward(_weights(ctx.routed, ctx.shared), ctx.topk_weights.data_ptr(), dout.data_ptr(), grads)
        bf16 = {n: None if getattr(main, n) is not None else g.to(torch.bfloat16) for n, g in fp32.items()}
        return Gradients(dx, dw, *(bf16.get(n) for n in MainGrads._fields))

    def _run(self, x, topk_weights, routed, shared, schedule: _Schedule, workspace, swiglu_limit, want_output):
        """Schedule, then forward (-> out) or recompute (-> None) on libmok's layer: (context, out)."""
        state = workspace.buffers
        layer = _layer(state, schedule.group, swiglu_limit)
        ctx = _Context(state, layer, schedule, x.contiguous(), topk_weights.contiguous(), routed, shared, swiglu_limit,
                       next(_tokens))
        ids = schedule.topk_ids
        layer.build_schedule(ids.data_ptr(), ids.dtype == torch.int64, ids.shape[0])
        out, (t, k), h = None, ids.shape, ctx.x.shape[1]
        if want_output:
            out = torch.empty_like(ctx.x)
            layer.forward(_weights(routed, shared), ctx.x.data_ptr(), ctx.topk_weights.data_ptr(), out.data_ptr())
        else:
            layer.recompute(_weights(routed, shared), ctx.x.data_ptr())
        ctx.y_slots = torch.empty(t, k, h, dtype=torch.bfloat16)
        layer.slots(ctx.y_slots.data_ptr())
        state.latest[layer] = ctx.token
        return ctx, out

    def _load(self, ctx: _Context) -> None:
        """Make `ctx` the layer's current schedule and context again (bitwise what it was)."""
        ids = ctx.schedule.topk_ids
        ctx.layer.build_schedule(ids.data_ptr(), ids.dtype == torch.int64, ids.shape[0])
        ctx.layer.recompute(_weights(ctx.routed, ctx.shared), ctx.x.data_ptr())
        ctx.state.latest[ctx.layer] = ctx.token


# The default on CPU tensors: libmok's own executor, ahead of the pure-PyTorch "reference".
functional.register_backend(HostExecutor(), priority=10)
