"""libmok as the Python package sees it: version and the executors that can run here."""

from __future__ import annotations

from dataclasses import dataclass

from mok import _mok

SUCCESS = 0


def _version_string(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


libmok_version = _version_string(_mok.version())
__version__ = libmok_version


@dataclass(frozen=True)
class Backend:
    """One way to run the layer, and whether it can run on this machine (and if not, why)."""

    name: str
    compiled: bool
    available: bool
    device: str
    reason: str


def gpu_backend(executor: int, name: str, device: int = 0) -> Backend:
    """`executor` on CUDA device `device` as libmok sees it: mokExecutorCompiled, then the device, then
    mokExecutorSupportsDevice (what creating a layer asks)."""
    if not _mok.executor_compiled(executor):  # libmok runs no layer with it: the reason is libmok's
        return Backend(name, False, False, "cuda", _mok.executor_supports_device(executor, device)[1])
    status, detail, info = _mok.device_info(device)
    if status != SUCCESS:
        return Backend(name, True, False, "cuda", f"no GPU: {detail or _mok.status_string(status)}")
    status, detail, supported = _mok.executor_supports_device(executor, device)
    where = f"cuda:{device} ({info['name']}, sm_{info['compute_capability'][0]}{info['compute_capability'][1]})"
    return Backend(name, True, bool(supported), where, "" if supported else detail)


def backends() -> list[Backend]:
    """Every backend mok knows, in order of preference, with availability on this machine: compiled and available
    as libmok's mokExecutorCompiled and mokExecutorSupportsDevice say, which is what creating a layer does.

    Never raises for a missing GPU or driver: that is reported as `available=False` with the reason.
    """
    preferred = (3, 1, 2)  # mokExecutorCuda, mokExecutorSm100, mokExecutorPortable: as mok.functional prefers them
    gpu = [gpu_backend(e, _mok.executor_name(e)) for e in preferred]
    status, detail, supported = _mok.executor_supports_device(0, -1)
    host = Backend("host", _mok.executor_compiled(0), supported, "cpu", detail)
    reference = Backend("reference", True, True, "any", "")
    return [*gpu, host, reference]


def gpu_info() -> dict:
    """CUDA device 0 as libmok sees it; `device_count` 0 and `error` set when there is no usable GPU."""
    status, detail, info = _mok.device_info(0)
    return {**info, "error": "" if status == SUCCESS else detail}
