"""The installed `mok` package on a machine with no GPU: imports, reports, never crashes."""

from __future__ import annotations

import pytest

import mok
from mok import _mok


def test_version_matches_libmok():
    assert mok.__version__ == mok.libmok_version == "0.1.0"
    assert _mok.version() == _mok.HEADER_VERSION


def test_backends_report_missing_gpu_without_raising():
    by_name = {b.name: b for b in mok.backends()}
    assert by_name["host"].available and by_name["reference"].available
    sm100 = by_name["sm100"]
    assert sm100.compiled, "the sm100 executor's device code is built into the wheel"
    gpu = mok._lib.gpu_info()
    if gpu["device_count"] == 0:
        assert not sm100.available
        assert sm100.reason.startswith("no GPU:") and sm100.reason != "no GPU: "
    else:  # pragma: no cover - GPU machines
        assert sm100.available == (gpu["compute_capability"][0] == 10)


def test_every_status_has_a_string():
    strings = [_mok.status_string(s) for s in range(_mok.NUM_STATUS)]
    assert all(s.startswith("mok") for s in strings), strings
    assert len(set(strings)) == _mok.NUM_STATUS, "two statuses share a string"
    assert _mok.status_string(_mok.NUM_STATUS) == "unknown mokStatus_t value"


def test_executor_names_and_bad_executor():
    assert [_mok.executor_name(e) for e in range(_mok.NUM_EXECUTORS)] == ["host", "sm100", "portable"]
    with pytest.raises(ValueError, match="executor"):
        _mok.executor_compiled(_mok.NUM_EXECUTORS)


def test_device_query_on_a_bad_device_names_the_argument():
    status, detail, info = _mok.device_info(-5)
    assert status != 0
    assert ("device" in detail) or ("cuda" in detail.lower()), detail
    assert info["device"] == -1
