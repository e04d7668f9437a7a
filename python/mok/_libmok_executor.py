"""functional.Executor over a libmok layer (its C ABI through mok._mok): what backend="host" and backend="cuda" share.

A subclass says where the layer's memory lives (`_memory`), which libmok executor and workers its config names
(`_config`) and which stream a pass runs on (`_stream`); everything else is this file's. libmok keeps the schedule and
the forward context inside its layer object; a context that is no longer the layer's latest (another forward ran
since: a model's next layer of the same shape) is made current again before its backward by re-running the schedule
and putting its x and y slots back (mokLayerRestoreContext), which is bitwise the same and runs no forward pass.

A pass that fails finishes libmok's group (every later call would return mokPeerAbort): the workspace then closes
its libmok layers, warns, and the next call creates new ones. A peer's deliberate stop (a call it made libmok reject,
see functional.GroupResync and LibmokExecutor.stop_group) is told apart by the error record's `abort_rank`: the rank
that aborted the group on purpose.
"""

from __future__ import annotations

import itertools
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from mok import ep, functional, validate
from mok.ep import MainGrads
from mok.experts import RoutedExpertsMXFP8
from mok.reference import Gradients


@dataclass
class _Layers:
    """One workspace's libmok layers (one per SwiGLU clamp, which libmok fixes at creation) and what they hold."""

    key: Any
    config: Any
    layers: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    latest: dict = field(default_factory=dict)  # layer -> the token of the schedule/context it holds now
    generation: int = 0  # layers closed after a failure so far: part of the next layers' shared-memory name
    idle: Any = None  # called after the layers are destroyed and before their memory is dropped (the cuda
    # executor's: wait for the device, whose queued work may still use the memory)

    def close(self) -> None:
        """Destroy every libmok layer (their group is finished, or the workspace is dropped)."""
        for key, layer in self.layers.items():
            if key[1] == os.getpid():
                layer.close()
            else:  # made before a fork: its threads live in the parent, so it is never destroyed here
                _INHERITED.append((layer, self.memory[key]))
        try:
            if self.idle is not None and self.layers:
                self.idle()
        finally:
            self.layers.clear()
            self.memory.clear()
            self.latest.clear()
            self.generation += 1


_INHERITED: list = []  # layers (and their memory) a forked process inherited and must not destroy


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
    workspace: Any
    layer: Any
    schedule: _Schedule
    x: torch.Tensor
    topk_weights: torch.Tensor
    routed: Any
    shared: Any
    swiglu_limit: float | None
    activation: str
    alpha: float | None
    token: int
    y_slots: torch.Tensor | None = None
    routing_scale: str = "output"


_tokens = itertools.count()


def aligned(nbytes: int, device: torch.device, alignment: int) -> tuple[torch.Tensor, int]:
    """A buffer of at least `nbytes` on `device` and the address in it where its `alignment`-aligned part starts
    (libmok's alignment for the memory it is given)."""
    memory = torch.empty(nbytes + alignment, dtype=torch.uint8, device=device)
    return memory, memory.data_ptr() + (-memory.data_ptr() % alignment)


def _ring_rows(key, config, world: int) -> tuple[int, int]:
    """(minibatch, macrobatch): the config's, but the ring never larger than the most rows a rank can receive."""
    minibatch = config.minibatch_size
    worst = world * key.max_tokens * key.topk + key.num_local_experts * config.expert_padding
    return minibatch, min(config.macrobatch_size, -(-worst // minibatch) * minibatch)


# libmok's names for what the user passed to mok (validate.py checks every rule first; this is for any libmok
# still has on its own, so that its message names the Python argument, not the C field).
_NAMES = {
    "config.world": "the group's size", "config.rank": "the group rank",
    "config.experts_per_rank": "routed E_local (gate.shape[0])", "config.hidden": "x.shape[1] (hidden)",
    "config.intermediate": "routed I (gate.shape[1])", "config.top_k": "topk_ids.shape[1] (topk)",
    "config.max_tokens": "the workspace's max_tokens (at least the most tokens on a rank)",
    "config.shared_intermediate": "shared I_s (shared.gate.shape[0])", "config.swiglu_limit": "swiglu_limit",
    "config.activation": "activation", "config.swiglu_alpha": "alpha", "config.routing_scale": "routing_scale",
    "config.expert_padding": "MoKConfig.expert_padding", "config.minibatch": "MoKConfig.minibatch_size",
    "config.macrobatch": "MoKConfig.macrobatch_size (capped at the rows a rank can receive)",
    "config.timeout_ms": "MoKConfig.wait_timeout_s (in ms)", "config.comm_workers": "MoKConfig.host_comm_workers",
    "config.backward_comm_workers": "MoKConfig.bwd_num_comm_sms",
    "config.compute_workers": "MoKConfig.host_compute_workers", "'config'": "'the layer's shapes'",
    "'num_tokens'": "'x.shape[0] (tokens)'", "weights.shared_": "shared.", "weights.": "routed.",
    "grads.dtopk_weights": "the topk_weights gradient", "grads.dx": "the x gradient",
    "grads.dshared_": "main_grads.shared_", "grads.d": "main_grads.",
}


def python_names(message: str) -> str:
    """libmok's message with the Python names of the arguments it names."""
    for c_name, python_name in _NAMES.items():
        message = message.replace(c_name, python_name)
    return message


class _python_names:
    """Re-raise libmok's ValueError with the Python names of the arguments it names."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is not ValueError:
            return False
        raise ValueError(python_names(str(error))) from error


def _masters(routed, shared) -> dict[str, torch.Tensor]:
    """The bf16 weights that get gradients, by MainGrads field name (MXFP8 experts: their bf16 masters)."""
    routed = routed.master if isinstance(routed, RoutedExpertsMXFP8) else routed
    names = [("gate", routed.gate), ("up", routed.up), ("down", routed.down)]
    if shared is not None:
        names += [("shared_gate", shared.gate), ("shared_up", shared.up), ("shared_down", shared.down)]
        if shared.router is not None:
            names.append(("shared_router", shared.router))
    return {**dict(names), **routed.biases()}


class _guard:
    """Around libmok's collective calls on `state`'s layer. On an executor whose calls do not agree first (resync:
    the host executor), a failure that finished the group closes the workspace's layers (the next call creates new
    ones), and a rejected call (this rank's ValueError, or a peer's: the error record's abort_rank names that peer) is
    a GroupResync, since every rank is alive to agree on what to do; any other failure (a timeout, a dead peer:
    abort_rank -1) warns and raises. On one whose calls agree first (the cuda executor, whose peers may see a
    failure a call later) the failure is raised and the layers stay: the next call's agreement (failure()) makes
    every rank raise it and close them together."""

    def __init__(self, state: _Layers, layer, executor: str, resync: bool):
        self.state, self.layer, self.executor, self.resync = state, layer, executor, resync

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None or not issubclass(kind, Exception):
            return False
        record = self.layer.error()
        if record["status"] == 0:
            return False  # rejected locally (world 1): the layer is still usable
        if not self.resync:  # its calls agree first: the next call's agreement closes every rank's layers together
            return False
        self.state.close()
        if issubclass(kind, ValueError):
            raise functional.GroupResync(str(error), error) from error
        if record["abort_rank"] not in (-1, record["rank"]):  # a peer stopped the group on purpose
            raise functional.GroupResync(str(error)) from error
        warnings.warn(f"mok: the {self.executor} executor's group failed ({error}); its libmok layers are closed and "
                      f"the next call creates new ones", RuntimeWarning, stacklevel=3)
        return False


class LibmokExecutor:
    """functional.Executor over libmok layers; a subclass names the device and the memory (host.py, cuda.py)."""

    name: str
    device_type: str  # the torch device type of every tensor whose address goes to libmok
    agrees_per_call = False  # libmok's error record carries a pass's faults to every rank

    # What a subclass provides.
    def _config(self, config, world: int, device: torch.device) -> dict:
        """The libmok config fields beyond the layer's shapes: the executor and its workers (on `device`)."""
        raise NotImplementedError

    def _memory(self, workspace, state: _Layers, cfg: dict, group, device: torch.device, name_parts: tuple):
        """(libmok layer, what must outlive it): the layer created over memory this executor places."""
        raise NotImplementedError

    def _stream(self, device: torch.device) -> int:
        """The address of the stream libmok's calls enqueue on (0: the host executor runs on the calling thread)."""
        raise NotImplementedError

    # functional.Executor
    def stop_group(self, workspace) -> None:
        """Stop the group of every libmok layer of `workspace` and close them: this rank is not entering the call.
        A schedule of -1 tokens, which libmok rejects: its peers' current call returns mokPeerAbort at once, with
        "rank r rejected its arguments" in the detail and abort_rank r in the record (functional.GroupResync)."""
        state = workspace.buffers
        ids = torch.zeros(1, 1, dtype=torch.int32, device=workspace.key.device)
        for key, layer in state.layers.items():
            if key[1] != os.getpid():
                continue  # another process's layer (inherited over a fork): not this group's
            try:
                layer.build_schedule(ids.data_ptr(), False, -1, self._stream(ids.device))
            except ValueError:
                pass  # the rejection: what this is for
        state.close()

    def close_workspace(self, workspace) -> None:
        workspace.buffers.close()

    def failure(self, workspace) -> str | None:
        """What this process's layers of `workspace` hold in libmok's error record (an earlier pass failed, or a peer
        aborted the group), or None."""
        state = workspace.buffers
        for key, layer in state.layers.items():
            if key[1] != os.getpid():
                continue
            record = layer.error()
            if record["status"] != 0:
                return (f"mok: an earlier pass of the {self.name} executor's group failed (rank {record['rank']}, "
                        f"{record['task'] or 'the pass'}): {record['detail']}; every rank's layers are closed and the "
                        f"next call makes new ones")
        return None

    def create_workspace(self, key, config) -> _Layers:
        return _Layers(key, config)

    def build_schedule(self, topk_ids, num_local_experts, group, workspace) -> _Schedule:
        return _Schedule(topk_ids.contiguous(), num_local_experts, group)

    def forward(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace, swiglu_limit,
                need_context, activation="swiglu", alpha=None, routing_scale="output"):
        ctx, out = self._run(x, topk_weights, routed, shared, schedule, workspace, (swiglu_limit, activation, alpha),
                             want_output=True, routing_scale=routing_scale)
        return out, (ctx if need_context else None)

    def recompute_forward_context(self, x, topk_ids, topk_weights, routed, shared, *, schedule, workspace,
                                  swiglu_limit, y_slots, activation="swiglu", alpha=None, routing_scale="output"):
        return self._run(x, topk_weights, routed, shared, schedule, workspace, (swiglu_limit, activation, alpha),
                         want_output=False, routing_scale=routing_scale)[0]

    def backward(self, ctx: _Context, dout, main_grads: MainGrads | None) -> Gradients:
        if ctx.state.latest.get(ctx.layer) != ctx.token:
            self._load(ctx)  # another forward ran since, or the layer was closed after a failure
        main = main_grads or MainGrads()
        masters = _masters(ctx.routed, ctx.shared)
        accumulate = any(getattr(main, n) is not None for n in masters)
        device = ctx.x.device
        if accumulate:
            # libmok adds fp32 weight gradients into every buffer at once (one mode per call): the caller's
            # main_grad buffers, and zeros for the weights the caller gave none.
            out = {n: getattr(main, n) if getattr(main, n) is not None else torch.zeros(w.shape, device=device)
                   for n, w in masters.items()}
        else:  # libmok writes the bf16 gradients itself
            out = {n: torch.empty(w.shape, dtype=torch.bfloat16, device=device) for n, w in masters.items()}
        dtype = torch.float32 if accumulate else torch.bfloat16
        dx = torch.empty_like(ctx.x)
        dw = torch.empty(ctx.topk_weights.shape, dtype=torch.float32, device=device)
        grads = {"dx": self._pointer(dx, "dx", torch.bfloat16), "accumulate": int(accumulate),
                 "dtopk_weights": self._pointer(dw, "dtopk_weights", torch.float32),
                 **{n: self._pointer(g, f"main_grads.{n}", dtype, masters[n].shape) for n, g in out.items()}}
        weights = self._weights(ctx.routed, ctx.shared)
        topk_weights = self._pointer(ctx.topk_weights, "topk_weights", torch.float32)
        dout_address = self._pointer(dout, "dout", torch.bfloat16, ctx.x.shape)
        with self._guard(ctx.state, ctx.layer), _python_names():
            ctx.layer.backward(weights, topk_weights, dout_address, grads, self._stream(device))
        bf16 = {n: None if getattr(main, n) is not None else g.to(torch.bfloat16) for n, g in out.items()}
        return Gradients(dx, dw, *(bf16.get(n) for n in MainGrads._fields))

    # The passes
    def _run(self, x, topk_weights, routed, shared, schedule: _Schedule, workspace, math: tuple, want_output,
             routing_scale="output"):
        """Schedule, then forward (-> out) or recompute (-> None) on libmok's layer: (context, out). math:
        (swiglu_limit, activation, alpha)."""
        state = workspace.buffers
        layer = self._layer(workspace, schedule.group, *math, routing_scale)
        ctx = _Context(state, workspace, layer, schedule, x.contiguous(), topk_weights.contiguous(), routed, shared,
                       *math, next(_tokens), routing_scale=routing_scale)
        self._schedule(state, layer, schedule.topk_ids)
        out, (t, k), h = None, schedule.topk_ids.shape, ctx.x.shape[1]
        weights, x_address = self._weights(routed, shared), self._pointer(ctx.x, "x", torch.bfloat16)
        stream = self._stream(x.device)
        with self._guard(state, layer), _python_names():
            weighting = self._pointer(ctx.topk_weights, "topk_weights", torch.float32, (t, k))
            if want_output:
                out = torch.empty_like(ctx.x)
                layer.forward(weights, x_address, weighting, self._pointer(out, "out", torch.bfloat16), stream)
            elif routing_scale == "input":  # the experts read bf16(w_k x): the recompute needs the weights
                layer.recompute_weighted(weights, x_address, weighting, stream)
            else:
                layer.recompute(weights, x_address, stream)
            ctx.y_slots = torch.empty(t, k, h, dtype=torch.bfloat16, device=x.device)
            layer.slots(self._pointer(ctx.y_slots, "y_slots", torch.bfloat16), stream)
        state.latest[layer] = ctx.token
        return ctx, out

    def _load(self, ctx: _Context) -> None:
        """Make `ctx` the layer's current schedule and context again (bitwise what it was): its schedule, then its x
        and y slots put back (mokLayerRestoreContext: two copies, no pass). The layer is created again if it was
        closed after a failure."""
        ctx.layer = self._layer(ctx.workspace, ctx.schedule.group, ctx.swiglu_limit, ctx.activation, ctx.alpha,
                                ctx.routing_scale)
        self._schedule(ctx.state, ctx.layer, ctx.schedule.topk_ids)
        with self._guard(ctx.state, ctx.layer), _python_names():
            ctx.layer.restore_context(self._pointer(ctx.x, "x", torch.bfloat16),
                                      self._pointer(ctx.y_slots, "y_slots", torch.bfloat16), self._stream(ctx.x.device))
        ctx.state.latest[ctx.layer] = ctx.token

    def _schedule(self, state: _Layers, layer, ids: torch.Tensor) -> None:
        address = self._pointer(ids, "topk_ids", torch.int32 if ids.dtype == torch.int32 else torch.int64)
        with self._guard(state, layer), _python_names():
            layer.build_schedule(address, ids.dtype == torch.int64, ids.shape[0], self._stream(ids.device))

    def _guard(self, state: _Layers, layer) -> _guard:
        return _guard(state, layer, self.name, resync=not self.agrees_per_call)

    # The layer and its arguments
    def _layer(self, workspace, group, swiglu_limit: float | None, activation: str, alpha: float | None,
               routing_scale: str = "output"):
        """This workspace's libmok layer for `swiglu_limit`, `activation`, `alpha` and `routing_scale`, created
        collectively on first use. Keyed by process and group shape too: a forked process (or one that initialised
        torch.distributed since) must not reuse a layer whose memory and ranks belong to another group."""
        state = workspace.buffers
        rank, world = ep.group_rank_and_size(group)
        key = (swiglu_limit, os.getpid(), world, rank, activation, alpha)  # key[1], the pid: see _Layers.close
        if routing_scale != "output":
            key += (routing_scale,)
        if key in state.layers:
            return state.layers[key]
        if validate.capturing_on(workspace.key.device):
            raise ValueError("a call captured into a CUDA graph runs on a libmok layer an eager call made before the "
                             "capture (making one allocates and, in a group, exchanges): make one eager call first")
        shape, config = state.key, state.config
        minibatch, macrobatch = _ring_rows(shape, config, world)
        cfg = dict(world=world, rank=rank, experts_per_rank=shape.num_local_experts, hidden=shape.hidden,
                   intermediate=shape.intermediate, top_k=shape.topk, max_tokens=max(shape.max_tokens, 1),
                   shared_intermediate=shape.shared_intermediate, mxfp8=shape.mxfp8,
                   swiglu_limit=0.0 if swiglu_limit is None else float(swiglu_limit), activation=activation,
                   swiglu_alpha=validate.OAI_ALPHA if alpha is None else float(alpha),
                   expert_padding=config.expert_padding, minibatch=minibatch, macrobatch=macrobatch,
                   timeout_ms=validate.timeout_ms(config.wait_timeout_s), **self._config(config, world, shape.device))
        if routing_scale == "input":
            cfg["routing_scale"] = 1  # mokRoutingScaleInput
        with _python_names():
            layer, memory = self._memory(workspace, state, cfg, group, shape.device,
                                         (swiglu_limit, activation, alpha, routing_scale))
        state.layers[key], state.memory[key] = layer, memory
        return layer

    def _pointer(self, t: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple | None = None) -> int:
        """t's data pointer for libmok, which reads (or writes) it as a dense row-major `dtype` array of `shape` on
        this executor's device. functional's checks have already held; this is the last line before a raw pointer
        leaves Python."""
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device.type != self.device_type:
            raise ValueError(f"{name} must be a {dtype} {self.device_type.upper()} tensor for libmok, got "
                             f"{getattr(t, 'dtype', type(t))} on {getattr(t, 'device', '-')}")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)} for libmok, got {tuple(t.shape)}")
        validate.check_layout(t, name)
        return t.data_ptr()

    def _weights(self, routed, shared) -> dict:
        """The weights' pointers as libmok's mokLayerWeights_t fields."""
        w = {}
        if isinstance(routed, RoutedExpertsMXFP8):
            for name in ("gate", "up", "down"):
                pair = getattr(routed, name)
                for form in ("rowwise", "colwise"):
                    q, where = getattr(pair, form), f"routed.{name}.{form}"
                    w[f"{name}_{form}"] = (self._pointer(q.data, f"{where}.data", torch.float8_e4m3fn),
                                           self._pointer(q.scales, f"{where}.scales", torch.uint8))
            routed = routed.master
        for name in ("gate", "up", "down"):
            w[name] = self._pointer(getattr(routed, name), f"routed.{name}", torch.bfloat16)
            if shared is not None:
                w[f"shared_{name}"] = self._pointer(getattr(shared, name), f"shared.{name}", torch.bfloat16)
        for name, bias in routed.biases().items():  # bf16 in both precisions
            w[name] = self._pointer(bias, f"routed.{name}", torch.bfloat16)
        if shared is not None and shared.router is not None:
            w["shared_router"] = self._pointer(shared.router, "shared.router", torch.bfloat16)
        return w
