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

It runs what libmok's cuda executor runs: BF16 and MXFP8 (forward and backward, expert biases too) on compute
capability 10.x and 9.0, the shapes mokLayerGetSizes accepts. With backend=None a layer it cannot run goes to
the next backend ("reference"); backend="cuda" raises the reason instead.

backend="sm100" is libmok's fused executor (mokExecutorSm100: core's whole pass as one persistent kernel, its tiles
1-CTA tcgen05 MMAs) over the same memory and calls, on compute capability 10.x; backend=None prefers "cuda".
"""

from __future__ import annotations

import torch

from mok import _lib, _mok, ep, functional, validate
from mok._libmok_executor import LibmokExecutor, _Layers, aligned, python_names

_ALIGN = 256  # libmok's device buffers: 256-byte aligned, as cudaMalloc gives them


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


class _Steps:
    """The steps of making a layer that each rank takes on its own: each one's outcome exchanged in a group (one
    small exchange), so that a rank's failure is raised on every rank, naming it."""

    def __init__(self, group, world: int, timeout_s: float):
        self.group, self.world, self.timeout_s = group, world, timeout_s

    def run(self, what: str, step, close=None):
        """step()'s result, once every rank's step succeeded; else this rank's error, or a RuntimeError naming the
        first rank that failed (`close` undoes this rank's result)."""
        result, error = None, None
        try:
            result = step()
        except Exception as failure:  # noqa: BLE001 - exchanged, then raised on every rank
            error = failure
        if self.world > 1:
            texts = ep.gather_objects(None if error is None else f"{type(error).__name__}: {error}", self.group,
                                      self.world, self.timeout_s, f"every rank to {what}")
            failed = [(rank, text) for rank, text in enumerate(texts) if text is not None]
            if failed and error is None:
                if close is not None:
                    close(result)
                rank, text = failed[0]
                raise RuntimeError(f"mok: rank {rank} could not {what}: {text}")
        if error is not None:
            raise error
        return result


class CudaExecutor(LibmokExecutor):
    """functional.Executor over libmok's cuda executor: CUDA tensors, one GPU per rank, NCCL process groups."""

    name = "cuda"
    executor = 3  # mokExecutorCuda
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
            self._backends[index] = _lib.gpu_backend(self.executor, self.name, index)
        return self._backends[index].available, self._backends[index].reason

    def refusal(self, shape, backward: bool, device: torch.device) -> str | None:
        """Why libmok's cuda executor cannot run a layer of `shape` (validate.LayerShape) on `device`, or None:
        libmok's own shape rules (mokLayerGetSizes). backward: the call keeps a context for a backward (or recomputes
        one); this executor runs every pass of the layers it accepts, so its answer is the same either way. device:
        any device mok.backends() reports the executor usable on."""
        key = (shape, _index(device))
        if key not in self._refusals:
            self._refusals[key] = self._refuse(shape)
        return self._refusals[key]

    def _refuse(self, shape) -> str | None:
        padding = shape.expert_padding  # a ring of one tile: libmok's minibatch rules hold for any padding
        config = dict(world=1, rank=0, experts_per_rank=shape.num_local_experts, hidden=shape.hidden,
                      intermediate=shape.intermediate, top_k=shape.topk, max_tokens=1,
                      shared_intermediate=shape.shared_intermediate, mxfp8=shape.mxfp8, expert_padding=padding,
                      minibatch=padding, macrobatch=padding, executor=self.name)
        try:
            _mok.layer_sizes(config)
        except (ValueError, RuntimeError) as error:  # mokInvalidArgument, mokUnsupported
            return python_names(str(error))
        return None

    def create_workspace(self, key, config) -> _Layers:
        return _Layers(key, config, idle=lambda: torch.cuda.synchronize(key.device))

    def _config(self, config, world: int, device: torch.device) -> dict:
        return {"executor": self.name}  # no worker fields: a pass is kernels on the stream, not libmok's workers

    def _memory(self, workspace, state, cfg, group, device, name_parts):
        """The layer over symmetric peer memory and a device workspace, made on `device` (libmok's layer keeps the
        device current at its creation). Made in steps that every rank takes together: the buffers; in a group, an
        exchange of whether every rank has them, the rendezvous, and the peers' addresses; the layer; and an
        exchange of whether every rank made it. A rank that fails a step (out of memory, its peer check) is named on
        every rank, instead of leaving its peers in the next collective."""
        peer_bytes, workspace_bytes = _mok.layer_sizes(cfg)
        rank, world = cfg["rank"], cfg["world"]
        step = _Steps(group, world, workspace.config.wait_timeout_s)
        with torch.cuda.device(device):
            memory, own = step.run("allocate its buffers", lambda: self._buffers(peer_bytes, workspace_bytes, world,
                                                                                device))
            if world == 1:
                bases, keep = [own[0]], ()
            else:
                from torch.distributed import _symmetric_memory as symmetric  # only for a group: not at import

                handle = symmetric.rendezvous(memory[1], group)  # collective: every rank has its buffer
                keep = (handle,)
                bases = step.run("address its peers", lambda: symmetric_bases(handle.buffer_ptrs, own[0], rank))
            layer = step.run(f"make its {self.name} layer", lambda: _mok.Layer(cfg, bases, own[1], workspace_bytes),
                             close=lambda made: made.close())
        return layer, (*memory, *keep)

    @staticmethod
    def _buffers(peer_bytes: int, workspace_bytes: int, world: int, device: torch.device):
        """(the workspace and peer tensors, (peer address, workspace address)): the peer buffer from symmetric
        memory in a group, a plain device buffer alone."""
        workspace, workspace_at = aligned(workspace_bytes, device, _ALIGN)
        if world == 1:
            peer, peer_at = aligned(peer_bytes, device, _ALIGN)
            return (workspace, peer), (peer_at, workspace_at)
        from torch.distributed import _symmetric_memory as symmetric

        peer = symmetric.empty(peer_bytes, dtype=torch.uint8, device=device)
        return (workspace, peer), (peer.data_ptr(), workspace_at)

    def _stream(self, device: torch.device) -> int:
        return torch.cuda.current_stream(device).cuda_stream


class FusedExecutor(CudaExecutor):
    """functional.Executor over libmok's fused executor (mokExecutorSm100): the cuda executor's layer and memory with
    core's whole pass as one kernel."""

    name = "sm100"
    executor = 1  # mokExecutorSm100

    def _config(self, config, world: int, device: torch.device) -> dict:
        sms = torch.cuda.get_device_properties(_index(device)).multi_processor_count
        return {"executor": self.name, **fused_workers(config, sms)}


# A GPU executor's choice of comm SMs where MoKConfig leaves them None (its docstring): forward, backward.
DEFAULT_COMM_SMS = (40, 28)


def fused_workers(config, sms: int) -> dict:
    """The fused executor's workers, a CTA each, on a device of `sms` SMs: fwd_num_comm_sms / bwd_num_comm_sms comm
    workers (None: DEFAULT_COMM_SMS) and one compute worker per other SM (at most libmok's 256). A comm count that
    leaves no SM to compute, or is above libmok's 64, is refused naming its field."""
    split = {}
    for name, default in zip(("fwd_num_comm_sms", "bwd_num_comm_sms"), DEFAULT_COMM_SMS, strict=True):
        value = getattr(config, name)
        split[name] = min(default, sms - 1) if value is None else value
        if not 1 <= split[name] < sms or split[name] > validate.MAX_COMM_WORKERS:
            raise ValueError(f"MoKConfig.{name} must be between 1 and {min(sms - 1, validate.MAX_COMM_WORKERS)} on "
                             f"backend 'sm100' (fewer than the device's {sms} SMs, at most libmok's "
                             f"{validate.MAX_COMM_WORKERS}), got {value}")
    forward = split["fwd_num_comm_sms"]
    return {"comm_workers": forward, "compute_workers": min(sms - forward, validate.MAX_COMPUTE_WORKERS),
            "backward_comm_workers": split["bwd_num_comm_sms"]}


# On CUDA tensors, ahead of the pure-PyTorch "reference", when libmok runs the executor on the device: the split
# executor first (its GEMMs on tensor cores), the fused one (its first form, not yet run on a GPU) when asked for or
# where the split one refuses a layer.
functional.register_backend(CudaExecutor(), priority=20)
functional.register_backend(FusedExecutor(), priority=15)
