"""backend="host": libmok's CPU executor (kernel/src/host) through its C ABI (_libmok_executor.py drives the layer).

Each rank is a process; the ranks' peer-visible memory is POSIX shared memory that libmok creates and maps under a
name made from the workspace's nonce (agreed when the workspace was made: no torch.distributed call after that),
and unlinks once every rank has mapped it. Every pass runs on the calling thread: libmok's stream argument is NULL
(_NO_STREAM) on the host executor.
"""

from __future__ import annotations

import os
import struct

import torch

from mok import _mok, functional, validate
from mok._libmok_executor import LibmokExecutor, _Layers, aligned


def _workers(config, world: int) -> dict:
    """The host executor's threads per rank: the config's, or by default one comm worker and the CPUs this
    process may run on shared among the group's ranks (all on this host: their memory is shared) for compute.
    fwd_num_comm_sms / bwd_num_comm_sms split those threads per pass (None: host_comm_workers); libmok's
    comm_workers is the forward's split, backward_comm_workers the backward's."""
    comm, total = config.host_comm_workers, _total_workers(config, world)
    split = {}
    for name in ("fwd_num_comm_sms", "bwd_num_comm_sms"):
        value = getattr(config, name)
        split[name] = comm if value is None else value
        if not split[name] < total:
            raise ValueError(f"MoKConfig.{name} must be fewer than the host executor's {total} workers "
                             f"(host_comm_workers + host_compute_workers) on backend 'host', got {value}")
        if split[name] > validate.MAX_COMM_WORKERS:
            raise ValueError(f"MoKConfig.{name} must be at most {validate.MAX_COMM_WORKERS} (libmok's comm workers) "
                             f"on backend 'host', got {value}")
    forward = split["fwd_num_comm_sms"]
    return {"comm_workers": forward, "compute_workers": min(total - forward, validate.MAX_COMPUTE_WORKERS),
            "backward_comm_workers": split["bwd_num_comm_sms"]}


def _total_workers(config, world: int) -> int:
    """host_comm_workers + host_compute_workers (None: the CPUs this process may run on / the group's ranks)."""
    compute = config.host_compute_workers
    if compute is None:
        compute = max(1, len(os.sched_getaffinity(0)) // world)
    return config.host_comm_workers + min(compute, validate.MAX_COMPUTE_WORKERS)


def _shm_name(workspace, state: _Layers, swiglu_limit, activation: str, alpha, routing_scale: str) -> str:
    """A name for this layer's shared memory that every rank derives alike: the workspace's agreed nonce, how many
    times its layers were closed after a failure, the clamp, the activation and the routing scale (one layer per
    clamp, activation and routing scale)."""
    clamp = "none" if swiglu_limit is None else struct.pack("<d", float(swiglu_limit)).hex()
    act = "silu" if activation == "swiglu" else "oai" + struct.pack("<d", float(alpha)).hex()
    scale = "-input" if routing_scale == "input" else ""
    return f"mok-{workspace.nonce}-{state.generation}-{clamp}-{act}{scale}"


_NO_STREAM = 0  # libmok's stream argument (NULL): the host executor runs every pass on the calling thread


class HostExecutor(LibmokExecutor):
    """functional.Executor over libmok's host executor: CPU tensors, gloo (or no) process groups."""

    name = "host"
    device_type = "cpu"

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def workers(self, config, world: int) -> int:
        """The threads per rank that fwd_num_comm_sms / bwd_num_comm_sms split ("auto": their GPU share)."""
        return _total_workers(config, world)

    def _config(self, config, world: int, device) -> dict:
        return _workers(config, world)

    def _memory(self, workspace, state, cfg, group, device, name_parts):
        """The layer over POSIX shared memory libmok maps under an agreed name, and its workspace in this process."""
        _, workspace_bytes = _mok.layer_sizes(cfg)
        memory, address = aligned(workspace_bytes, torch.device("cpu"), 64)  # libmok wants 64-byte alignment
        layer = _mok.Layer(cfg, _shm_name(workspace, state, *name_parts), address, workspace_bytes)
        return layer, memory

    def _stream(self, device: torch.device) -> int:
        return _NO_STREAM


# The default on CPU tensors: libmok's own executor, ahead of the pure-PyTorch "reference".
functional.register_backend(HostExecutor(), priority=10)
