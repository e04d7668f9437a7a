"""backend="cuda" as far as a machine without a GPU can check it: how a call picks an executor that can run its layer
(an executor's refusal, the fallback to the next one, a named backend's reason), what libmok's cuda executor refuses,
the symmetric-memory addresses, and that it reports itself unusable here with libmok's reason. tests/gpu runs it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from backends import needs_host
from dist_utils import run_group
from test_expert_bias import biased_inputs
from test_layer import I_SHARED, INTER, H, make_inputs

import mok
from mok import functional, validate

pytestmark = needs_host


def shape(hidden=64, intermediate=48, shared=0, mxfp8=False, padding=256, biases=False) -> validate.LayerShape:
    return validate.LayerShape(hidden, 2, 4, intermediate, shared, mxfp8, None, padding, biases=biases)


class Picky(functional._ReferenceExecutor):
    """The reference executor, but refusing biased layers and backwards, as libmok's cuda executor refuses some
    layers: a call that it cannot run must go to the next backend."""

    name = "picky"

    def __init__(self):
        self.forwards = 0

    def refusal(self, layer, backward, device):
        if layer.biases:
            return "no biases here"
        return "no backward here" if backward else None

    def forward(self, *args, **kwargs):
        self.forwards += 1
        return super().forward(*args, **kwargs)


@pytest.fixture
def picky():
    executor = Picky()
    functional.register_backend(executor, priority=100)
    yield executor
    functional.unregister_backend("picky")
    functional.clear_workspaces()


def test_select_backend_skips_an_executor_that_refuses_the_layer(picky):
    cpu = torch.device("cpu")
    assert functional.select_backend(None, cpu) is picky  # by device alone
    assert functional.select_backend(None, cpu, shape(), backward=False) is picky
    assert functional.select_backend(None, cpu, shape(biases=True)).name == "host"
    assert functional.select_backend(None, cpu, shape(), backward=True).name == "host"
    with pytest.raises(ValueError, match="backend 'picky' cannot run this layer: no biases here; backend='reference' "
                                         "runs it"):
        functional.select_backend("picky", cpu, shape(biases=True))
    with pytest.raises(ValueError, match="backend 'picky' cannot run this layer: no backward here"):
        functional.select_backend("picky", cpu, shape(), backward=True)


def test_a_call_runs_on_the_first_executor_that_runs_its_layer(picky):
    x, ids, weights, routed, shared, _ = make_inputs(16, 4, 2)
    functional.forward(x, ids, weights, routed, shared, need_context=False)
    assert picky.forwards == 1  # an inference forward: picky runs it
    functional.forward(x, ids, weights, routed, shared, need_context=True)
    functional.recompute_forward_context(x, ids, weights, routed, shared)
    assert picky.forwards == 1  # a context for a backward: the next backend
    x, ids, weights, biased, shared, _ = biased_inputs(16, 4, 2)
    out, _ = functional.forward(x, ids, weights, biased, shared, need_context=False)
    assert picky.forwards == 1  # biases: the next backend
    expected, _ = functional.forward(x, ids, weights, biased, shared, need_context=False, backend="host")
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="backend 'picky' cannot run this layer: no biases here"):
        functional.forward(x, ids, weights, biased, shared, need_context=False, backend="picky")


def test_a_workspace_keeps_its_executor_and_a_schedule_of_ids_follows_the_call(picky):
    """A workspace is its executor's object: a call given one runs there or raises that executor's reason. A schedule
    that holds only its ids (libmok's executors build theirs inside the pass) is built again for the executor the
    call takes; one that holds a plan (the reference executor's) is refused naming both."""
    x, ids, weights, biased, shared, _ = biased_inputs(16, 4, 2)
    workspace = functional.create_workspace(max_tokens=16, hidden=H, topk=2, num_local_experts=4, intermediate=INTER,
                                            shared_intermediate=I_SHARED)  # by device: picky
    assert workspace.key.backend == "picky"
    with pytest.raises(ValueError, match="backend 'picky' cannot run this layer: no biases here"):
        functional.forward(x, ids, weights, biased, shared, workspace=workspace, need_context=False)
    x, ids, weights, routed, shared, _ = make_inputs(16, 4, 2)
    functional.forward(x, ids, weights, routed, shared, workspace=workspace, need_context=False)
    assert picky.forwards == 1
    ids_only = functional.build_schedule(ids, 4, backend="host")
    out, _ = functional.forward(x, ids, weights, routed, shared, schedule=ids_only, need_context=False)
    assert picky.forwards == 2  # picky runs it, from the same ids
    assert torch.equal(out, functional.forward(x, ids, weights, routed, shared, need_context=False, backend="host")[0])
    plan = functional.build_schedule(ids, 4)  # by device: picky, a reference executor (a plan)
    with pytest.raises(ValueError, match="schedule was built by backend 'picky', but this call runs on 'host'"):
        functional.forward(x, ids, weights, routed, shared, schedule=plan, need_context=True)


def test_the_shape_says_whether_the_routed_experts_carry_biases():
    x, ids, weights, routed, shared, _ = biased_inputs(16, 4, 2)
    assert validate.check_layer_args(x, ids, weights, routed, shared, None, 1).biases
    x, ids, weights, routed, shared, _ = make_inputs(16, 4, 2)
    assert not validate.check_layer_args(x, ids, weights, routed, shared, None, 1).biases


@pytest.mark.skipif(not mok._mok.executor_compiled(3), reason="libmok was built without its cuda executor "
                    "(MOK_ENABLE_CUDA=OFF or no CUTLASS): its shape rules are not there to ask")
def test_cuda_asks_libmok_for_its_shape_rules():
    """The widths and the MXFP8 padding are libmok's rules (mokLayerGetSizes), asked without a GPU."""
    from mok.cuda import CudaExecutor

    cuda, gpu = CudaExecutor(), torch.device("cuda", 0)
    for padding in (128, 256, 1024):  # any padding: the minibatch libmok asks about is one tile
        assert cuda.refusal(shape(padding=padding), True, gpu) is None
    assert "'x.shape[1] (hidden)' (60) must be a multiple of 8" in cuda.refusal(shape(hidden=60), True, gpu)
    mx = shape(mxfp8=True, hidden=64, intermediate=64, padding=128)
    assert cuda.refusal(mx, False, gpu) is None and cuda.refusal(mx, True, gpu) is None  # the backward too
    for layer in (shape(biases=True), shape(biases=True, mxfp8=True, hidden=64, intermediate=64, padding=128)):
        assert cuda.refusal(layer, True, gpu) is None  # expert biases: their own steps add them
    assert "must be a multiple of 32" in cuda.refusal(shape(mxfp8=True, intermediate=48, padding=128), False, gpu)
    assert "'MoKConfig.expert_padding' (32) must be a multiple of 128" in \
        cuda.refusal(shape(mxfp8=True, hidden=64, intermediate=64, padding=32), False, gpu)


def test_the_fused_executors_workers_are_the_devices_sms():
    """backend="sm100": a CTA per worker, fwd_num_comm_sms / bwd_num_comm_sms of them moving rows (None: 40 and 28,
    fewer on a small device), a compute worker per other SM (at most libmok's 256); a split that leaves no SM to
    compute, or more comm workers than libmok takes, refused naming its field."""
    from mok.cuda import fused_workers

    assert fused_workers(functional.MoKConfig(), 148) == {"comm_workers": 40, "compute_workers": 108,
                                                          "backward_comm_workers": 28}
    assert fused_workers(functional.MoKConfig(), 20) == {"comm_workers": 19, "compute_workers": 1,
                                                         "backward_comm_workers": 19}
    split = functional.MoKConfig(fwd_num_comm_sms=8, bwd_num_comm_sms=16)
    assert fused_workers(split, 300) == {"comm_workers": 8, "compute_workers": 256, "backward_comm_workers": 16}
    for field, value in (("fwd_num_comm_sms", 148), ("bwd_num_comm_sms", 65), ("fwd_num_comm_sms", 0)):
        config = SimpleNamespace(**{"fwd_num_comm_sms": None, "bwd_num_comm_sms": None, field: value})  # 0 too
        with pytest.raises(ValueError, match=rf"MoKConfig.{field} must be between 1 and 64 on backend 'sm100'.*"
                                             rf"got {value}"):
            fused_workers(config, 148)


def test_symmetric_bases_are_each_allocation_plus_the_own_offset():
    from mok.cuda import symmetric_bases

    allocations = [0x7000_0000, 0x9000_0000, 0x5000_0000]  # rank order, as a rendezvous gives them
    assert symmetric_bases(allocations, 0x9000_0200, rank=1) == [0x7000_0200, 0x9000_0200, 0x5000_0200]
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[0, 1, 2\] a buffer not aligned to 256 bytes"):
        symmetric_bases(allocations, 0x9000_0010, rank=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU runs tests/gpu/test_cuda_backend_gpu.py")
def test_without_a_gpu_cuda_is_not_chosen_and_says_why():
    from mok.cuda import CudaExecutor

    usable, reason = CudaExecutor().usable(torch.device("cuda", 0))
    assert not usable and reason  # libmok's words: not compiled, or no GPU
    assert [b.reason for b in mok.backends() if b.name == "cuda"] == [reason]  # as mok.backends() says
    assert functional.select_backend(None, torch.device("cuda", 0)).name == "reference"
    assert functional.select_backend(None, torch.device("cuda")).name == "reference"  # no index: the current one
    with pytest.raises(ValueError, match="backend 'cuda' does not support device cuda:0"):
        functional.select_backend("cuda", torch.device("cuda", 0))


def test_value_checks_stand_aside_only_while_a_cuda_graph_is_captured(monkeypatch):
    """The ids' range and the MXFP8 padding scales are read on the host, except on a CUDA device whose current stream
    is being captured (a read would synchronise, which capture forbids)."""
    cuda_tensor = SimpleNamespace(is_cuda=True, device=-1)  # -1: torch.cuda.device leaves the current one
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert validate.reads_values(cuda_tensor)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not validate.reads_values(cuda_tensor)
    assert validate.reads_values(torch.zeros(1))  # a CPU tensor is read whatever a GPU's stream does
    with pytest.raises(ValueError, match=r"an expert id in \[0, 8\)"):
        validate.check_expert_ids(torch.tensor([[8]]), 8)  # and its ids checked


def test_a_group_exchanges_on_the_cpu_unless_it_has_only_nccl(monkeypatch):
    """ep.gather_objects (the agreement's exchange) runs where the group's backend can: an NCCL-only group ("nccl",
    "cuda:nccl") takes CUDA tensors, the GPU of this process; a gloo group, or one with a CPU backend beside NCCL, the
    CPU."""
    from mok import ep

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    cases = (("gloo", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"), ("nccl", "cuda:3"), ("cuda:nccl", "cuda:3"))
    for backend, device in cases:
        monkeypatch.setattr(ep.dist, "get_backend", lambda group, name=backend: name)
        assert ep.exchange_device(None) == torch.device(device)


def test_a_rank_whose_arguments_failed_guesses_what_its_peers_pick(picky):
    """_guess (a rank with a bad value still stops its peers' pass on their workspace) derives the shape and the
    executor as the peers' checks do: the biases, the backward and the routing scale included."""
    x, ids, weights, biased, shared, _ = biased_inputs(16, 4, 2)
    config = functional.MoKConfig()

    def guess(routed, backward, routing_scale="output"):
        return functional._guess(x, ids, routed, shared, None, None, config, None, "swiglu", None, routing_scale,
                                 backward)

    routed = make_inputs(16, 4, 2)[3]
    assert guess(routed, False)[1] is picky
    assert guess(routed, True)[1].name == "host"
    shape, executor = guess(biased, False, "input")
    assert executor.name == "host" and shape.biases and shape.routing_scale == "input"
    peers = validate.check_layer_args(x, ids, weights, biased, shared, None, 1, routing_scale="input")
    assert shape == peers._replace(expert_padding=config.expert_padding)


class FakeLayer:
    """A libmok layer as _libmok_executor sees it: its error record and close()."""

    def __init__(self, status: int):
        self.status, self.closed = status, False

    def error(self):
        return {"status": self.status, "rank": 1, "task": "combine", "task_index": 0, "wait": "", "pass": 3,
                "detail": "rank 0 stopped", "abort_rank": -1}

    def close(self):
        self.closed = True


def _state(layer):
    from mok._libmok_executor import _Layers

    state = _Layers(None, None)
    state.layers[(None, os.getpid())] = layer
    return state


def test_a_failure_in_the_record_is_raised_at_the_next_agreement_and_closes_the_layers():
    """The cuda executor's calls agree first; a failure one rank's record holds (seen a call before its peers see
    it) is raised at the next call's agreement on every rank, and every rank closes its layers there, together."""
    from mok._libmok_executor import _guard
    from mok.cuda import CudaExecutor

    failed = FakeLayer(5)
    state = _state(failed)
    with pytest.raises(RuntimeError, match="the pass"):  # the failing call raises, its layers stay
        with _guard(state, failed, "cuda", resync=False):
            raise RuntimeError("the pass")
    assert not failed.closed and state.layers
    workspace = SimpleNamespace(buffers=state)
    with pytest.raises(RuntimeError, match=r"an earlier pass of the cuda executor's group failed \(rank 1, "
                                           r"combine\): rank 0 stopped"):
        functional._agree_call(CudaExecutor(), workspace, mok.LOCAL, 1, 1.0, None, {}, 0)
    assert failed.closed and not state.layers
    healthy = FakeLayer(0)
    workspace = SimpleNamespace(buffers=_state(healthy))
    assert functional._agree_call(CudaExecutor(), workspace, mok.LOCAL, 1, 1.0, None, {}, 7)[0] == [7]
    assert not healthy.closed and workspace.buffers.layers


def _steps(rank, world):
    import torch.distributed as dist

    from mok.cuda import _Steps

    step, closed = _Steps(dist.group.WORLD, world, 30.0), []
    assert step.run("agree", lambda: rank) == rank

    def fails_on_rank_1():
        if rank == 1:
            raise ValueError("boom")
        return "made"

    try:
        step.run("make a thing", fails_on_rank_1, close=closed.append)
    except Exception as error:  # noqa: BLE001 - what each rank raised is the result
        return type(error).__name__, str(error), closed
    return None


def test_a_step_that_fails_on_one_rank_is_raised_on_every_rank_naming_it():
    """Making a cuda layer takes steps each rank takes alone (buffers, addresses, the layer): one failing on one rank
    is raised on all, the others undoing theirs, instead of leaving them in the next collective."""
    rank0, rank1 = run_group(2, _steps)
    assert rank0 == ("RuntimeError", "mok: rank 1 could not make a thing: ValueError: boom", ["made"])
    assert rank1 == ("ValueError", "boom", [])


def test_a_workspace_of_the_wrong_type_is_named_with_a_per_call_executor_too(picky, monkeypatch):
    """The agreement of an executor that reports failures (failure(workspace)) closes only a real workspace: a wrong
    `workspace` argument is the TypeError that names it."""
    monkeypatch.setattr(Picky, "failure", lambda self, workspace: None, raising=False)
    monkeypatch.setattr(Picky, "close_workspace", lambda self, workspace: workspace.buffers.close(), raising=False)
    x, ids, weights, routed, shared, _ = make_inputs(16, 4, 2)
    with pytest.raises(TypeError, match="workspace must be a Workspace from create_workspace/get_workspace, got str"):
        functional.forward(x, ids, weights, routed, shared, workspace="mine", need_context=False)


def _captured_calls(rank, world):
    """A forward eager, then the same forward as if its stream were being captured into a CUDA graph; then captured
    calls that would need a workspace no eager call made, and one mok.moe refuses before its op. Returns (captured ==
    eager, the agreements the captured calls made, their errors)."""
    from dist_utils import ep_group

    from mok import ep

    torch.manual_seed(rank)
    x, ids, weights, routed, shared, _ = make_inputs(16, 4, 2)

    def forward(tokens=16, config=None):
        return functional.forward(x[:tokens], ids[:tokens], weights[:tokens], routed, shared, group=ep_group(),
                                  config=config, backend="reference", need_context=False)[0]

    eager = forward()
    agreements, gather = [], ep.gather_objects
    ep.gather_objects = lambda *args: (agreements.append(args[-1]), gather(*args))[1]
    validate.capturing = lambda tensor: True
    captured = forward()
    errors = []
    for config in (functional.MoKConfig(expert_padding=64), functional.MoKConfig(wait_timeout_s=61.0)):
        try:
            forward(config=config)
        except ValueError as error:
            errors.append(str(error))
    try:  # mok.moe's own checks before the op: raised here alone too
        mok.moe(x, ids, weights, routed, shared, group=ep_group(), backend="reference", activation="relu")
    except ValueError as error:
        errors.append(str(error))
    return torch.equal(captured, eager), agreements, errors


def test_a_call_captured_in_a_cuda_graph_agrees_with_no_peer_and_needs_an_eager_call_first():
    """A replay repeats no host exchange (and an NCCL one would be captured), so a group's calls being captured skip
    the per-call agreement and run in the workspace an eager call made; a call whose workspace no eager call made is
    refused by name instead of allocating and exchanging inside the capture."""
    for same, agreements, errors in run_group(2, _captured_calls):
        assert same and agreements == []
        assert len(errors) == 3 and all("make one eager call first" in error for error in errors[:2]), errors
        assert "activation" in errors[2], errors


def test_a_captured_call_raises_its_own_error_and_its_record_alone():
    """While capturing, a rank's own bad argument and a failure its executor's record holds are raised on that rank
    without an exchange (the next eager call's agreement closes every rank's layers together)."""
    from mok.cuda import CudaExecutor

    with pytest.raises(ValueError, match="mine"):
        functional._captured_call(CudaExecutor(), None, ValueError("mine"))
    failed = FakeLayer(5)
    workspace = SimpleNamespace(buffers=_state(failed))
    with pytest.raises(RuntimeError, match=r"an earlier pass of the cuda executor's group failed"):
        functional._captured_call(CudaExecutor(), workspace, None)
    assert not failed.closed and workspace.buffers.layers  # left for the next eager call's agreement
    functional._captured_call(CudaExecutor(), SimpleNamespace(buffers=_state(FakeLayer(0))), None)


def test_a_libmok_layer_is_not_made_while_a_cuda_graph_is_captured(monkeypatch):
    """Making a libmok layer allocates (and in a group exchanges): inside a capture it is refused by name."""
    x, ids, weights, routed, shared, _ = make_inputs(16, 4, 2)
    workspace = functional.create_workspace(max_tokens=16, hidden=H, topk=2, num_local_experts=4, intermediate=INTER,
                                           shared_intermediate=I_SHARED, backend="host")
    monkeypatch.setattr(validate, "capturing_on", lambda device: True)
    with pytest.raises(ValueError, match="runs on a libmok layer an eager call made"):
        functional.forward(x, ids, weights, routed, shared, workspace=workspace, backend="host", need_context=False)
