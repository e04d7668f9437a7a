"""The installed `mok` package on a machine with no GPU: imports, reports, never crashes."""

from __future__ import annotations

import pytest

import mok
from mok import _mok


def test_version_matches_libmok():
    assert mok.__version__ == mok.libmok_version == "0.5.0"
    assert _mok.version() == _mok.HEADER_VERSION


def test_backends_report_missing_gpu_without_raising():
    by_name = {b.name: b for b in mok.backends()}
    assert by_name["host"].compiled and by_name["host"].available and by_name["reference"].available
    portable = by_name["portable"]  # not written, whatever device code is built in
    assert not portable.compiled and not portable.available, portable
    assert "executor 'portable' runs no layer" in portable.reason, portable.reason
    # The split executor: compiled where the package's libmok has the grouped GEMMs; the fused one where it also has a
    # Blackwell target (the default targets do); either way not usable without a GPU, and the reason says why.
    for name in ("cuda", "sm100"):
        gpu = by_name[name]
        assert not gpu.available, gpu
        assert ("no GPU" in gpu.reason) if gpu.compiled else (f"executor '{name}' runs no layer" in gpu.reason), gpu
    assert not by_name["sm100"].compiled or by_name["cuda"].compiled


def test_backends_tell_the_story_of_functional_backends():
    # mok.backends() (libmok's capability queries) and mok.functional.backends() (what a call can select) name
    # the same runnable backends, most preferred first.
    # A registered GPU backend libmok cannot run here is listed, and not available.
    by_name = {b.name: b for b in mok.backends()}
    registered = mok.functional.backends()
    assert set(registered) <= set(by_name), (mok.backends(), registered)
    available = [b.name for b in mok.backends() if b.available]
    assert available == [name for name in registered if by_name[name].available], (mok.backends(), registered)


def test_every_status_has_a_string():
    strings = [_mok.status_string(s) for s in range(_mok.NUM_STATUS)]
    assert all(s.startswith("mok") for s in strings), strings
    assert len(set(strings)) == _mok.NUM_STATUS, "two statuses share a string"
    assert _mok.status_string(_mok.NUM_STATUS) == "unknown mokStatus_t value"


def test_executor_names_and_bad_executor():
    assert [_mok.executor_name(e) for e in range(_mok.NUM_EXECUTORS)] == ["host", "sm100", "portable", "cuda"]
    with pytest.raises(ValueError, match="executor"):
        _mok.executor_compiled(_mok.NUM_EXECUTORS)


def test_device_query_on_a_bad_device_names_the_argument():
    status, detail, info = _mok.device_info(-5)
    assert status != 0
    assert ("device" in detail) or ("cuda" in detail.lower()), detail
    assert info["device"] == -1
