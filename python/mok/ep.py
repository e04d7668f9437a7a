"""Expert parallelism over torch.distributed: which routed rows go where, and moving them there and back.

Global expert e lives on rank e // E_local. A rank sends each routed (token, k) row to the rank that owns its
expert with one `all_to_all_single`, and gets the expert's output row back with another. On the expert's rank
the rows are laid out expert-major and, inside an expert, in canonical order (source rank, token, k): the order
that fixes every weight-gradient sum and every token-dim MXFP8 block (docs/semantics.md). Because that order
does not depend on how tokens are spread over ranks, W ranks give bitwise the single-process result.

Works with any backend torch.distributed has (gloo on CPU, NCCL on CUDA); `group=LOCAL` (or `group=None` with
no process group of more than one rank initialised) runs in-process with no communication at all. Every wait on
another rank is bounded by the caller's timeout and names what it waited for.
"""

from __future__ import annotations

import datetime
import pickle
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from mok import reference
from mok.experts import RoutedExperts, RoutedExpertsMXFP8, SharedExpert


class _Local:
    """`mok.LOCAL`: the group of this process alone (no expert parallelism, no communication)."""

    group_name = "mok.LOCAL"

    def __repr__(self) -> str:
        return "mok.LOCAL"

    def __reduce__(self):
        return "LOCAL"  # pickles (and forks) as the one instance


LOCAL = _Local()


def resolve_group(group):
    """The expert-parallel group a call means: LOCAL for LOCAL, and for None when torch.distributed has no group
    of more than one rank; the group itself otherwise. None with a larger default group is ambiguous (it may be
    the data-parallel world) and an error."""
    if group is None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError(f"group must be the expert-parallel process group (or mok.LOCAL for this process "
                             f"alone) when torch.distributed is initialised with {dist.get_world_size()} ranks, "
                             f"got None")
        return LOCAL
    return group


def group_rank_and_size(group) -> tuple[int, int]:
    """(rank, world size) in `group` (resolved as resolve_group does); (0, 1) for LOCAL."""
    group = resolve_group(group)
    if group is LOCAL:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def wait(work, timeout_s: float, what: str) -> None:
    """Wait for an async torch.distributed call at most timeout_s; a wait that runs out is a TimeoutError naming
    `what` (gloo's own timeout, 30 minutes by default, would otherwise decide)."""
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise TimeoutError(f"waiting for {what} ran out after {timeout_s:g} s (a rank did not call, or is "
                           f"stuck): {e}") from e


def exchange_device(group) -> torch.device:
    """Where `group` can all_gather: the CPU where one of its backends serves CPU tensors ("gloo", "cpu:gloo,..."),
    else (NCCL alone: "nccl", "cuda:nccl") this process's current GPU, the one its ranks' tensors are on."""
    backend = str(dist.get_backend(group))
    devices = [part.split(":")[0] for part in backend.split(",") if ":" in part]
    if ("cpu" in devices) if devices else backend != "nccl":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def gather_objects(value, group, world: int, timeout_s: float, what: str) -> list:
    """Every rank's picklable `value`, rank order; two bounded all_gathers (sizes, then the padded bytes), on the
    device the group exchanges on (exchange_device)."""
    device = exchange_device(group)
    data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    own = torch.tensor([data.numel()], device=device)
    wait(dist.all_gather(sizes, own, group=group, async_op=True), timeout_s, what)
    sizes = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    parts = [torch.empty(max(sizes), dtype=torch.uint8, device=device) for _ in range(world)]
    wait(dist.all_gather(parts, padded, group=group, async_op=True), timeout_s, what)
    return [pickle.loads(p[:size].cpu().numpy().tobytes()) for p, size in zip(parts, sizes, strict=True)]


@dataclass(frozen=True)
class Schedule:
    """Where each routed row of this rank goes, and what this rank's experts receive.

    send_routes:       [S] int64, flat slot indices t * K + k of this rank's routed rows, ordered by
                       (global expert, t, k): rows for rank 0's experts first.
    send_splits:       rows sent to each rank (list of W ints).
    recv_splits:       rows received from each rank (list of W ints).
    recv_to_canonical: [R] int64; canonical row i of this rank's experts is received row recv_to_canonical[i].
    expert_rows:       rows of each local expert (list of E_local ints); expert e's canonical segment starts at
                       sum(expert_rows[:e]).
    """

    group: object
    rank: int
    world: int
    timeout_s: float
    num_local_experts: int
    num_tokens: int
    topk: int
    send_routes: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_to_canonical: torch.Tensor
    expert_rows: list[int]

    @property
    def num_experts(self) -> int:
        return self.world * self.num_local_experts

    def expert_segments(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Split canonical rows [R, ...] into one contiguous tensor per local expert."""
        return [seg.contiguous() for seg in torch.split(rows, self.expert_rows)]


def build_schedule(topk_ids: torch.Tensor, num_local_experts: int, group=None, timeout_s: float = 60.0) -> Schedule:
    """Plan dispatch and combine for `topk_ids` [T, K] (ids already validated; -1 = no route).

    One all_to_all of per-expert row counts: every rank learns how many rows each source sends to each of its
    experts, which is all it needs to lay the received rows out in canonical order. Every exchange of this
    schedule waits at most timeout_s.
    """
    group = resolve_group(group)
    rank, world = group_rank_and_size(group)
    num_tokens, topk = topk_ids.shape
    ids = topk_ids.reshape(-1).to(torch.int64)
    routed = torch.nonzero(ids >= 0).reshape(-1)
    # A stable sort by expert keeps (t, k) ascending inside each expert: the canonical order for this source.
    send_routes = routed[torch.sort(ids[routed], stable=True).indices]
    send_counts = torch.bincount(ids[routed], minlength=world * num_local_experts)
    recv_counts = _exchange_counts(send_counts, group, world, timeout_s)
    counts = recv_counts.reshape(world, num_local_experts)
    return Schedule(
        group=group,
        rank=rank,
        world=world,
        timeout_s=timeout_s,
        num_local_experts=num_local_experts,
        num_tokens=num_tokens,
        topk=topk,
        send_routes=send_routes,
        send_splits=send_counts.reshape(world, num_local_experts).sum(1).tolist(),
        recv_splits=counts.sum(1).tolist(),
        recv_to_canonical=_source_major_to_expert_major(counts),
        expert_rows=counts.sum(0).tolist(),
    )


def dispatch_tokens(schedule: Schedule, x: torch.Tensor) -> torch.Tensor:
    """Send token rows x [T, C] to the experts they are routed to (a token routed to k experts goes k times).
    Returns this rank's experts' rows [R, C] in canonical order (split them with `schedule.expert_segments`)."""
    return _to_experts(schedule, x[schedule.send_routes // schedule.topk])


def dispatch_slots(schedule: Schedule, slots: torch.Tensor) -> torch.Tensor:
    """Send per-slot rows slots [T, K, C] (slot (t, k) goes to expert topk_ids[t, k]) to the experts.
    Returns [R, C] in canonical order, as `dispatch_tokens`."""
    return _to_experts(schedule, slots.flatten(0, 1)[schedule.send_routes])


def combine(schedule: Schedule, expert_rows: torch.Tensor) -> torch.Tensor:
    """Send each expert output row [R, C] (canonical order) back to its token's rank. Returns the slots
    [T, K, C]; a slot with no route (-1) is zero."""
    received_order = torch.empty_like(expert_rows)
    received_order[schedule.recv_to_canonical] = expert_rows
    back = _exchange(received_order, schedule.recv_splits, schedule.send_splits, schedule, "the combine's all_to_all")
    slots = expert_rows.new_zeros(schedule.num_tokens * schedule.topk, expert_rows.shape[1])
    slots[schedule.send_routes] = back
    return slots.reshape(schedule.num_tokens, schedule.topk, expert_rows.shape[1])


def _to_experts(schedule: Schedule, send: torch.Tensor) -> torch.Tensor:
    received = _exchange(send, schedule.send_splits, schedule.recv_splits, schedule, "the dispatch's all_to_all")
    return received[schedule.recv_to_canonical]


def _source_major_to_expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Rows arrive grouped by source rank, then expert. Return, for each row in (expert, source) order, its
    position in the received buffer."""
    starts = torch.cumsum(counts.reshape(-1), 0) - counts.reshape(-1)  # start of each (source, expert) block
    starts_em, counts_em = starts.reshape(counts.shape).t().reshape(-1), counts.t().reshape(-1)
    total = int(counts_em.sum())
    block_offset = torch.cumsum(counts_em, 0) - counts_em  # where each block lands in canonical order
    shift = torch.repeat_interleave(starts_em - block_offset, counts_em, output_size=total)
    return torch.arange(total, dtype=torch.int64, device=counts.device) + shift


def _exchange_counts(send_counts: torch.Tensor, group, world: int, timeout_s: float) -> torch.Tensor:
    if world == 1:
        return send_counts
    recv = torch.empty_like(send_counts)
    wait(dist.all_to_all_single(recv, send_counts, group=group, async_op=True), timeout_s,
         "the schedule's all_to_all of row counts")
    return recv


def _exchange(send: torch.Tensor, send_splits: list[int], recv_splits: list[int], schedule: Schedule,
              what: str) -> torch.Tensor:
    if len(send_splits) == 1:
        return send
    recv = send.new_empty(sum(recv_splits), *send.shape[1:])
    work = dist.all_to_all_single(recv, send.contiguous(), recv_splits, send_splits, group=schedule.group,
                                  async_op=True)
    wait(work, schedule.timeout_s, what)
    return recv


# ----------------------------------------------------------------------------------------------------------------
# The layer over the group, with reference.py's per-expert math: the "reference" executor of mok.functional.


@dataclass
class Context:
    """What a forward keeps for its backward: the expert side (this rank's experts' input rows and activations,
    canonical order) and the token side (this rank's tokens, their routes and their y slots)."""

    schedule: Schedule
    x: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    routed: RoutedExperts | RoutedExpertsMXFP8
    shared: SharedExpert | None
    swiglu_limit: float | None
    activation: dict  # reference.py's activation= and alpha= keywords
    expert_x: list[torch.Tensor]
    activations: list[reference.ExpertActivations]
    shared_activations: reference.ExpertActivations | None  # of the padded chunks, see _shared_forward
    y_slots: torch.Tensor  # [T, K, H] bf16, zero where the route is -1
    routing_scale: str = "output"  # "input" (Llama4): the experts' rows are bf16(w_k x), out sums y_k unweighted


class MainGrads(NamedTuple):
    """Caller-owned fp32 buffers that weight gradients are added into (None = return that gradient as bf16)."""

    gate: torch.Tensor | None = None
    up: torch.Tensor | None = None
    down: torch.Tensor | None = None
    shared_gate: torch.Tensor | None = None
    shared_up: torch.Tensor | None = None
    shared_down: torch.Tensor | None = None
    gate_bias: torch.Tensor | None = None  # with routed biases: [E_local, I], [E_local, I], [E_local, H]
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None
    shared_router: torch.Tensor | None = None  # with a gated shared expert: [H]


def forward(x, topk_ids, topk_weights, routed, shared, *, schedule: Schedule, swiglu_limit=None,
            need_context: bool = True, activation: str = "swiglu", alpha: float | None = None,
            routing_scale: str = "output"):
    """out [T, H] bf16 for this rank's tokens, and the Context (None when need_context is False)."""
    ctx = recompute_forward_context(x, topk_ids, topk_weights, routed, shared, schedule=schedule,
                                    swiglu_limit=swiglu_limit, activation=activation, alpha=alpha,
                                    routing_scale=routing_scale)
    shared_y = None
    if ctx.shared_activations is not None:
        shared_y = reference.shared_term(ctx.shared_activations.y[:x.shape[0]], x, shared.router)
    out = reference.combine(ctx.y_slots, topk_ids, None if routing_scale == "input" else topk_weights, shared_y)
    return out, (ctx if need_context else None)


def recompute_forward_context(x, topk_ids, topk_weights, routed, shared, *, schedule: Schedule,
                              swiglu_limit=None, y_slots: torch.Tensor | None = None, activation: str = "swiglu",
                              alpha: float | None = None, routing_scale: str = "output") -> Context:
    """Run the forward up to (not including) the final combine. Passing the forward's y_slots skips sending
    the expert outputs back (they are bitwise what the forward had)."""
    act = _activation(activation, alpha)
    expert_x = schedule.expert_segments(_expert_rows(schedule, x, topk_weights, routing_scale))
    activations = [reference.expert_forward(rows, routed.expert(e), swiglu_limit=swiglu_limit, **act)
                   for e, rows in enumerate(expert_x)]
    if y_slots is None:
        y_slots = combine(schedule, torch.cat([a.y for a in activations]))
    activations = [a._replace(y=None) for a in activations]  # the backward never reads y on the expert side
    shared_act = None if shared is None else _shared_forward(x, shared, swiglu_limit, act)
    return Context(schedule, x, topk_ids, topk_weights, routed, shared, swiglu_limit, act, expert_x, activations,
                   shared_act, y_slots, routing_scale)


def _expert_rows(schedule: Schedule, x: torch.Tensor, topk_weights: torch.Tensor, routing_scale: str):
    """The experts' input rows: x's token rows, or with routing_scale "input" each slot's bf16(w_k * x_t) (fp32
    product)."""
    if routing_scale != "input":
        return dispatch_tokens(schedule, x)
    return dispatch_slots(schedule, (topk_weights[:, :, None] * x.float()[:, None, :]).to(torch.bfloat16))


def backward(ctx: Context, dout: torch.Tensor, main_grads: MainGrads | None = None) -> reference.Gradients:
    """All gradients given dout [T, H] bf16. Routed weight gradients are this rank's experts' (summed over
    every rank's rows); shared ones are over this rank's tokens (the trainer reduces them like any
    data-parallel weight). Weight gradients come back bf16, or None where main_grads holds a buffer they were
    added into."""
    main_grads = main_grads or MainGrads()
    dout_f = dout.float()[:, None, :]
    # dw_k = <dOut_t, y_k> directly: never recovered by dividing anything by w_k.
    dw = reference.routing_weight_gradient(dout, ctx.y_slots, ctx.topk_ids)
    dy_slots = (ctx.topk_weights[:, :, None] * dout_f).to(torch.bfloat16)
    input_scale = ctx.routing_scale == "input"
    if input_scale:  # the experts read bf16(w_k x): their dy is dOut itself
        dy_slots = dout[:, None, :].expand(*ctx.topk_ids.shape, dout.shape[1])
    dy_rows = ctx.schedule.expert_segments(dispatch_slots(ctx.schedule, dy_slots))
    grads = [reference.expert_backward(ctx.expert_x[e], ctx.routed.expert(e), ctx.activations[e], dy_rows[e],
                                       swiglu_limit=ctx.swiglu_limit, **ctx.activation) for e in range(len(dy_rows))]
    dx_slots = combine(ctx.schedule, torch.cat([g.dx for g in grads]))
    shared, router_grad = (None, None) if ctx.shared is None else _shared_backward(ctx, dout)
    if input_scale:  # dx_k is w.r.t. bf16(w_k x): dx = shared + sum_k w_k dx_k, dw_k = <x_t, dx_k>
        dw = reference.routing_weight_gradient(ctx.x, dx_slots, ctx.topk_ids)
    dx = reference.combine(dx_slots, ctx.topk_ids, ctx.topk_weights if input_scale else None,
                           None if shared is None else shared.dx)
    master = ctx.routed.master if hasattr(ctx.routed, "master") else ctx.routed
    names = ("gate", "up", "down", *master.biases())  # the bias gradients of the biases given
    routed_w = {name: torch.stack([getattr(g, name) for g in grads]) for name in names}
    shared_w = {f"shared_{n}": None if shared is None else getattr(shared, n) for n in ("gate", "up", "down")}
    shared_w["shared_router"] = router_grad
    weights = {name: _deliver(grad, getattr(main_grads, name), name)
               for name, grad in {**routed_w, **shared_w}.items()}
    return reference.Gradients(x=dx, topk_weights=dw, **weights)


# A CPU GEMM's result for one row can depend on how many rows the call has (the BLAS picks kernels by shape).
# The routed experts see the same rows in every world size, but the shared expert sees this rank's tokens, whose
# count differs from the single-process run's. So it runs on zero-padded chunks of exactly SHARED_CHUNK rows:
# every GEMM call has the same shape and each token's result depends on that token alone. Zero rows add exact
# zeros to the weight gradients.
SHARED_CHUNK = 64


def _activation(activation: str, alpha: float | None) -> dict:
    """reference.py's keywords for the activation (alpha None: "swiglu", which has none)."""
    return dict(activation=activation, alpha=reference.OAI_ALPHA if alpha is None else alpha)


def _shared_forward(x, shared, swiglu_limit, act: dict) -> reference.ExpertActivations:
    """The shared expert on x's rows zero-padded to whole chunks: activations of [ceil(T / C) * C] rows."""
    acts = [reference.expert_forward(c, shared.expert(), swiglu_limit=swiglu_limit, **act) for c in _chunks(x)]
    return reference.ExpertActivations(*(torch.cat(parts) for parts in zip(*acts, strict=True)))


def _shared_backward(ctx: Context, dout: torch.Tensor):
    """Chunk by chunk as _shared_forward; weight gradients summed over the chunks in order, in fp32. Returns
    (reference.ExpertGradients, the router's gradient or None when ungated)."""
    act, router, tokens = ctx.shared_activations, ctx.shared.router, ctx.x.shape[0]
    gated = None if router is None else reference.shared_gate_backward(ctx.x, router, act.y[:tokens], dout)
    dy = dout if gated is None else gated.dy
    chunks = zip(*(_chunks(t) for t in (ctx.x, dy, act.g, act.u, act.h)), strict=True)
    grads = [reference.expert_backward(x, ctx.shared.expert(), reference.ExpertActivations(g, u, h, None), d,
                                       swiglu_limit=ctx.swiglu_limit, **ctx.activation)
             for x, d, g, u, h in chunks]
    weight_grads = [sum(parts[1:], parts[0]) for parts in zip(*(g[1:4] for g in grads), strict=True)]
    dx = torch.cat([g.dx for g in grads])[:tokens]
    if gated is None:
        return reference.ExpertGradients(dx, *weight_grads), None
    return reference.ExpertGradients(gated.input_gradient(dx, router), *weight_grads), gated.router_gradient(ctx.x)


def _chunks(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """rows zero-padded to a multiple of SHARED_CHUNK and split into chunks; no rows: one empty chunk."""
    padded = rows.new_zeros(_round_up(rows.shape[0], SHARED_CHUNK), *rows.shape[1:])
    padded[:rows.shape[0]] = rows
    return torch.split(padded, SHARED_CHUNK) or (rows,)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _deliver(grad: torch.Tensor | None, main_grad: torch.Tensor | None, name: str):
    """An fp32 weight gradient: added into the caller's fp32 buffer (checked by validate.check_main_grads)
    if there is one, else returned bf16."""
    if grad is None or main_grad is None:
        return None if grad is None else grad.to(torch.bfloat16)
    main_grad.add_(grad)
    return None
