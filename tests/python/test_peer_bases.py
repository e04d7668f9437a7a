"""mok._mok.Layer over the caller's peer memory (peer_bases: every rank's buffer by address, as the cuda executor takes
device pointers) and the config's executor by name (mokExecutorName). On the host executor a layer over peer_bases
gives the bits of one over libmok's shared memory, a group of ranks as threads included; a list that does not hold
one address per rank, and an executor name libmok does not have, are ValueErrors naming them; the cuda executor is
sized through the same call and refused at creation where no GPU runs it, naming 'config.executor'."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from backends import needs_host

pytestmark = needs_host

E, H, I, K, T = 2, 32, 16, 2, 12


def config(world: int, rank: int, **extra) -> dict:
    return dict(world=world, rank=rank, experts_per_rank=E, hidden=H, intermediate=I, top_k=K, max_tokens=T,
                expert_padding=8, minibatch=16, macrobatch=32, comm_workers=1, compute_workers=1, timeout_ms=20000,
                **extra)


def aligned(nbytes: int) -> tuple[torch.Tensor, int]:
    """A host buffer and its first 64-byte aligned address (the tensor keeps the memory alive)."""
    memory = torch.empty(nbytes + 64, dtype=torch.uint8)
    return memory, memory.data_ptr() + (-memory.data_ptr() % 64)


class Rank:
    """One rank's inputs (drawn from its seed, ids over every rank's experts) and its layer's outputs."""

    def __init__(self, world: int, rank: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(-1, world * E, (T, K), dtype=torch.int32, generator=g)
        self.x = torch.randn(T, H, generator=g).bfloat16()
        self.weights = torch.rand(T, K, generator=g) + 0.05
        self.experts = {n: (torch.randn(E, I, H, generator=g) * 0.3).bfloat16() for n in ("gate", "up")}
        self.experts["down"] = (torch.randn(E, H, I, generator=g) * 0.3).bfloat16()
        self.out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)

    def run(self, layer) -> None:
        layer.build_schedule(self.ids.data_ptr(), False, T)
        layer.forward({n: t.data_ptr() for n, t in self.experts.items()}, self.x.data_ptr(), self.weights.data_ptr(),
                      self.out.data_ptr())


def run_group(world: int, seed: int, make_layer) -> list[Rank]:
    """Each rank on its own thread (a host pass waits for its peers); make_layer(rank, keep) builds its layer."""
    ranks = [Rank(world, r, seed + r) for r in range(world)]
    errors, keep = [], []

    def body(r: int) -> None:
        try:
            layer = make_layer(r, keep)
            ranks[r].run(layer)
            layer.close()
        except Exception as error:  # noqa: BLE001 - reported below, with its rank
            errors.append((r, error))

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return ranks


@pytest.mark.parametrize("world", [1, 3])
def test_peer_bases_give_the_shared_memory_layers_bits(world):
    from mok import _mok

    peer_bytes, workspace_bytes = _mok.layer_sizes(config(world, 0))
    peers = [aligned(peer_bytes) for _ in range(world)]
    bases = [address for _, address in peers]
    workspaces = [aligned(workspace_bytes) for _ in range(world)]
    name = f"mok-test-peers-{os.getpid()}-{os.urandom(4).hex()}"

    def over_bases(r, keep):
        return _mok.Layer(config(world, r), bases, workspaces[r][1], workspace_bytes)

    def over_shm(r, keep):
        memory, address = aligned(workspace_bytes)
        keep.append(memory)
        return _mok.Layer(config(world, r), name, address, workspace_bytes)

    ours, theirs = run_group(world, 40 + world, over_bases), run_group(world, 40 + world, over_shm)
    for r in range(world):
        assert not bool(ours[r].out.isnan().any()), f"rank {r}: the forward left outputs unwritten"
        assert torch.equal(ours[r].out.view(torch.int16), theirs[r].out.view(torch.int16)), f"rank {r} differs"


def test_peer_bases_hold_one_address_per_rank():
    from mok import _mok

    peer_bytes, workspace_bytes = _mok.layer_sizes(config(2, 0))
    (peer, base), (work, address) = aligned(peer_bytes), aligned(workspace_bytes)
    for bases in ([base], [base, base, base], []):
        with pytest.raises(ValueError, match=rf"peer_bases: {len(bases)} addresses for config 'world' 2"):
            _mok.Layer(config(2, 0), bases, address, workspace_bytes)
    del peer, work


def test_the_executor_by_name():
    from mok import _mok

    assert _mok.layer_sizes(config(1, 0, executor="host")) == _mok.layer_sizes(config(1, 0))
    with pytest.raises(ValueError, match=r"config: 'executor' must be one of \"host\", \"sm100\", .*\"cuda\""):
        _mok.layer_sizes(config(1, 0, executor="gpu"))
    with pytest.raises(ValueError, match="config: 'executor'"):
        _mok.layer_sizes(config(1, 0, executor=3))
    if not _mok.executor_compiled(3):  # mokExecutorCuda: a build without CUDA or CUTLASS
        with pytest.raises(RuntimeError, match="mokNotCompiled"):
            _mok.layer_sizes(config(1, 0, executor="cuda"))
        return
    host_peer, host_workspace = _mok.layer_sizes(config(1, 0))
    peer, workspace = _mok.layer_sizes(config(1, 0, executor="cuda"))
    assert peer == host_peer and workspace > host_workspace  # core's layout, then the split executor's own
    status, _, _ = _mok.device_info(0)
    if status == 0:
        pytest.skip("a GPU is here: tests/gpu runs the cuda executor on it")
    (_, base), (_, address) = aligned(peer), aligned(workspace)
    with pytest.raises(RuntimeError, match=r"argument 'config.executor' \(cuda\)"):
        _mok.Layer(config(1, 0, executor="cuda"), [base], address, workspace)
