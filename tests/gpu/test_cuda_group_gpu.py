"""backend="cuda" in a group of GPUs: every GPU of the machine a rank (a process), the group "cpu:gloo,cuda:nccl", the
peers over PyTorch symmetric memory. Each rank runs mok.moe forward and backward on its GPU, and the same layer on CPU
copies through the host executor over the same group's gloo side; the two must agree within the split pass's bound.
Skipped, with the reason, on a machine with fewer than two GPUs or where libmok's cuda executor does not run. Never
run here: no machine of ours has a GPU."""

from __future__ import annotations

import os
import socket

import pytest
import torch

if torch.cuda.device_count() < 2:
    pytest.skip(f"a group needs two GPUs or more; PyTorch sees {torch.cuda.device_count()} (torch "
                f"{torch.__version__}, CUDA {torch.version.cuda or 'none'})", allow_module_level=True)

from mok.cuda import CudaExecutor  # noqa: E402

_usable = [CudaExecutor().usable(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
_unusable = [(i, reason) for i, (usable, reason) in enumerate(_usable) if not usable]
if _unusable:
    pytest.skip(f"libmok's cuda executor does not run on every GPU: {_unusable}", allow_module_level=True)

TOLERANCE = 1.0 / 128  # libmok's kSplitOrderTolerance, as in test_cuda_backend_gpu.py
TOKENS, EXPERTS_PER_RANK, K, H, INTER, I_SHARED = 64, 2, 2, 256, 128, 64
NAMES = ["out", "x", "topk_weights", "gate", "up", "down", "shared_gate", "shared_up", "shared_down"]


def _problem(world: int, seed: int):
    """The whole group's inputs (every rank draws the same): each rank's tokens, all experts."""
    generator = torch.Generator().manual_seed(seed)

    def bf16(*shape, fan_in=1):
        return (torch.randn(*shape, generator=generator) / fan_in ** 0.5).to(torch.bfloat16)

    experts = world * EXPERTS_PER_RANK
    ids = torch.randint(0, experts, (world * TOKENS, K), generator=generator)
    ids = torch.where(torch.rand(world * TOKENS, K, generator=generator) < 0.2, -1, ids)
    weights = torch.rand(world * TOKENS, K, generator=generator) + 0.1
    routed = [bf16(experts, INTER, H, fan_in=H), bf16(experts, INTER, H, fan_in=H), bf16(experts, H, INTER,
                                                                                          fan_in=INTER)]
    shared = [bf16(I_SHARED, H, fan_in=H), bf16(I_SHARED, H, fan_in=H), bf16(H, I_SHARED, fan_in=I_SHARED)]
    return bf16(world * TOKENS, H), ids, weights, routed, shared, bf16(world * TOKENS, H)


def _layer(rank: int, world: int, device: str, backend: str, seed: int) -> list[torch.Tensor]:
    """This rank's (out, every gradient) of mok.moe on `device` through `backend`, by autograd."""
    import torch.distributed as dist

    import mok
    from mok.experts import RoutedExperts, SharedExpert

    x, ids, weights, routed, shared, dout = _problem(world, seed)
    tokens, experts = slice(rank * TOKENS, (rank + 1) * TOKENS), slice(rank * EXPERTS_PER_RANK,
                                                                       (rank + 1) * EXPERTS_PER_RANK)
    leaves = [t.to(device).clone().requires_grad_(True)
              for t in (x[tokens], weights[tokens], *(w[experts] for w in routed), *shared)]
    out = mok.moe(leaves[0], ids[tokens].to(device), leaves[1], RoutedExperts(*leaves[2:5]),
                  SharedExpert(*leaves[5:8]), group=dist.group.WORLD, backend=backend)
    out.backward(dout[tokens].to(device))
    return [out.detach().cpu().float()] + [leaf.grad.cpu().float() for leaf in leaves]


def _compared(rank: int, world: int, seed: int) -> dict:
    return {"got": _layer(rank, world, f"cuda:{rank}", "cuda", seed), "want": _layer(rank, world, "cpu", "host", seed)}


def _replayed(rank: int, world: int, seed: int) -> dict:
    """This rank's forward captured into a CUDA graph after an eager call (every rank captures together; the group's
    per-call agreement stands aside), replayed on new inputs copied into the captured ones, and an eager call on
    those inputs."""
    import torch.distributed as dist

    import mok
    from mok.experts import RoutedExperts, SharedExpert

    tokens, experts = slice(rank * TOKENS, (rank + 1) * TOKENS), slice(rank * EXPERTS_PER_RANK,
                                                                       (rank + 1) * EXPERTS_PER_RANK)
    x, ids, weights, routed, shared, _ = _problem(world, seed)
    x, ids, weights = (t[tokens].to(f"cuda:{rank}") for t in (x, ids, weights))
    routed = RoutedExperts(*(w[experts].to(f"cuda:{rank}") for w in routed))
    shared = SharedExpert(*(w.to(f"cuda:{rank}") for w in shared))

    def forward():
        return mok.moe(x, ids, weights, routed, shared, group=dist.group.WORLD, backend="cuda")

    with torch.no_grad():
        first = forward()  # warm-up: the workspace, its layer and the group's agreement
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = forward()
        fresh = _problem(world, seed + 100)  # new routes too: each replay builds the schedule on the device
        for static, new in zip((x, ids, weights), fresh[:3], strict=True):
            static.copy_(new[tokens])
        graph.replay()
        eager = forward()
    return {"same": torch.equal(captured, eager), "moved": not torch.equal(captured, first)}


def _rank(rank: int, world: int, port: int, seed: int, results: str, work) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=world)
    try:
        torch.save(work(rank, world, seed), os.path.join(results, f"rank{rank}.pt"))
    finally:
        import mok

        mok.clear_workspaces()  # every rank together, before the group goes (docs/gpu.md: closing a workspace)
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_group_of_gpus_matches_the_host_executor(seed, tmp_path):
    world = torch.cuda.device_count()
    torch.multiprocessing.spawn(_rank, args=(world, _free_port(), seed, str(tmp_path), _compared), nprocs=world,
                                join=True)
    for rank in range(world):
        saved = torch.load(tmp_path / f"rank{rank}.pt")
        errors = {name: float((g - w).norm() / w.norm())
                  for name, g, w in zip(NAMES, saved["got"], saved["want"], strict=True)}
        assert all(error <= TOLERANCE for error in errors.values()), (rank, errors)


def test_a_group_of_gpus_replays_its_forward_from_a_cuda_graph(tmp_path):
    """A forward captured on every rank of the group replays with the eager call's bits for new inputs: the barriers'
    epochs and the group's state live in the workspace, and the captured calls exchange nothing on the host."""
    world = torch.cuda.device_count()
    torch.multiprocessing.spawn(_rank, args=(world, _free_port(), 3, str(tmp_path), _replayed), nprocs=world,
                                join=True)
    for rank in range(world):
        saved = torch.load(tmp_path / f"rank{rank}.pt")
        assert saved["same"] and saved["moved"], (rank, saved)
