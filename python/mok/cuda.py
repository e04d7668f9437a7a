"""backend="cuda": libmok's cuda executor (kernel/src/cuda, the split executor) on CUDA tensors, through its C ABI
(_libmok_executor.py drives the layer). Written for a GPU and never run on one: docs/gpu.md says what to run first.

Each rank is a process with one GPU. The ranks' peer-visible memory is PyTorch symmetric memory: each rank's peer
buffer from torch.distributed._symmetric_memory.empty, every rank's address from one rendezvous over the
expert-parallel group when the layer is made (a group of one: a plain device buffer). The workspace is a device
buffer of this process. Every call is enqueued on the current CUDA stream of the tensors' device and not waited
for: a pass's fault (a peer that died, ids the device-side schedule refused) shows in libmok's error record and the
layer's next call raises it, as an asynchronous CUDA error does.

Since a call returns before its pass has run, a rank that cannot enter a call cannot stop its peers' pass the way
the host executor's does (stop_group makes a blocked call return): every call agrees with the group first
(agrees_per_call), as the reference executor's do.

It runs what libmok's cuda executor runs: no expert biases, MXFP8 layers only forward (no backward yet) and only on
compute capability 10.x, and the shapes mokLayerGetSizes accepts. With backend=None a layer it cannot run goes to
the next backend ("reference"); backend="cuda" raises the reason instead.
"""

from __future__ import annotations

import torch

from mok import _lib, _mok, ep, functional
from mok._libmok_executor import LibmokExecutor, _Layers, python_names

_CUDA = 3  # mokExecutorCuda
_ALIGN = 256  # libmok's device buffers: 256-byte aligned, as cudaMalloc gives them


def _aligned(nbytes: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """A device buffer of at least `nbytes` and the address in it that starts the aligned part."""
    memory = torch.empty(nbytes + _ALIGN, dtype=torch.uint8, device=device)
    return memory, memory.data_ptr() + (-memory.data_ptr() % _ALIGN)


def _peer_bases(nbytes: int, group, device: torch.device) -> tuple[list[int], tuple]:
    """Every rank's peer buffer, in group rank order, and what keeps this rank's alive: a device buffer in a group of
    one; symmetric memory (one collective rendezvous) otherwise."""
    rank, world = ep.group_rank_and_size(group)
    if world == 1:
        memory, base = _aligned(nbytes, device)
        return [base], (memory,)
    from torch.distributed import _symmetric_memory as symmetric

    memory = symmetric.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symmetric.rendezvous(memory, group)
    return symmetric_bases(handle.buffer_ptrs, memory.data_ptr(), rank), (memory, handle)


def symmetric_bases(allocations: list[int], own: int, rank: int) -> list[int]:
    """Every rank's buffer from the ranks' symmetric allocations (a rendezvous's buffer_ptrs, in rank order) and the
    own buffer's address: the same offset into each allocation (every rank allocated alike)."""
    offset = own - allocations[rank]
    bases = [base + offset for base in allocations]
    misaligned = [r for r, base in enumerate(bases) if base % _ALIGN]
    if misaligned:
        raise RuntimeError(f"mok: PyTorch symmetric memory gave rank(s) {misaligned} a buffer not aligned to "
                           f"{_ALIGN} bytes; libmok's cuda executor needs that alignment")
    return bases


def _index(device: torch.device) -> int:
    """The device's index ("cuda": the current device; 0 where PyTorch has no CUDA, for libmok to say why)."""
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


class CudaExecutor(LibmokExecutor):
    """functional.Executor over libmok's cuda executor: CUDA tensors, one GPU per rank, NCCL process groups."""

    name = "cuda"
    device_type = "cuda"
    agrees_per_call = True  # see the module's docstring

    def __init__(self):
        self._backends: dict[int, _lib.Backend] = {}  # device index -> libmok's answer, asked once
        self._refusals: dict = {}  # (shape, backward, device index) -> refusal, asked once

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda" and self.usable(device)[0]

    def usable(self, device: torch.device) -> tuple[bool, str]:
        """(whether libmok runs its cuda executor on this device, why not), as mok.backends() reports it."""
        index = _index(device)
        if index not in self._backends:
            self._backends[index] = _lib.gpu_backend(_CUDA, self.name, index)
        return self._backends[index].available, self._backends[index].reason

    def refusal(self, shape, backward: bool, device: torch.device) -> str | None:
        """Why libmok's cuda executor cannot run a layer of `shape` (validate.LayerShape) on `device`, or None: what
        it does not compute yet, then libmok's own shape rules (mokLayerGetSizes). backward: the call keeps a
        context for a backward (or recomputes one)."""
        key = (shape, backward, _index(device))
        if key not in self._refusals:
            self._refusals[key] = self._refuse(shape, backward, key[2])
        return self._refusals[key]

    def _refuse(self, shape, backward: bool, index: int) -> str | None:
        if shape.biases:
            return "libmok's cuda executor adds no expert bias yet (its grouped GEMMs take none)"
        if shape.mxfp8 and backward:
            return "libmok's cuda executor runs no MXFP8 backward yet (only the forward: need_context=False)"
        if shape.mxfp8 and torch.cuda.is_available() and torch.cuda.get_device_capability(index)[0] != 10:
            major, minor = torch.cuda.get_device_capability(index)
            return (f"libmok's cuda executor runs MXFP8 on compute capability 10.x only (a block-scaled MMA); cuda:"
                    f"{index} is {major}.{minor}")
        padding = shape.expert_padding  # a ring of one tile: libmok's minibatch rules hold for any padding
        config = dict(world=1, rank=0, experts_per_rank=shape.num_local_experts, hidden=shape.hidden,
                      intermediate=shape.intermediate, top_k=shape.topk, max_tokens=1,
                      shared_intermediate=shape.shared_intermediate, mxfp8=shape.mxfp8, expert_padding=padding,
                      minibatch=padding, macrobatch=padding, executor="cuda")
        try:
            _mok.layer_sizes(config)
        except (ValueError, RuntimeError) as error:  # mokInvalidArgument, mokUnsupported
            return python_names(str(error))
        return None

    def create_workspace(self, key, config) -> _Layers:
        return _Layers(key, config, idle=lambda: torch.cuda.synchronize(key.device))

    def _config(self, config, world: int) -> dict:
        return {"executor": "cuda"}  # no worker fields: a pass is kernels on the stream, not libmok's threads

    def _memory(self, workspace, state, cfg, group, device, name_parts):
        """The layer over symmetric peer memory and a device workspace, made on `device` (libmok's layer keeps the
        device current at its creation). Every rank learns whether every rank made its layer: one failing alone
        (its peer check, say) would otherwise leave the others' passes waiting for it."""
        peer_bytes, workspace_bytes = _mok.layer_sizes(cfg)
        with torch.cuda.device(device):
            bases, peers = _peer_bases(peer_bytes, group, device)
            memory, address = _aligned(workspace_bytes, device)
            layer, error = None, None
            try:
                layer = _mok.Layer(cfg, bases, address, workspace_bytes)
            except (ValueError, RuntimeError) as failure:
                error = failure
        if cfg["world"] > 1:
            errors = ep.gather_objects(None if error is None else str(error), group, cfg["world"],
                                       workspace.config.wait_timeout_s, "every rank to make its cuda layer")
            failed = [(rank, text) for rank, text in enumerate(errors) if text is not None]
            if failed and error is None:
                layer.close()
                rank, text = failed[0]
                raise RuntimeError(f"mok: rank {rank} could not make its cuda layer: {text}")
        if error is not None:
            raise error
        return layer, (memory, *peers)

    def _stream(self, device: torch.device) -> int:
        return torch.cuda.current_stream(device).cuda_stream


# On CUDA tensors, ahead of the pure-PyTorch "reference", when libmok runs its cuda executor on the device.
functional.register_backend(CudaExecutor(), priority=20)
