"""The self-test's stages on a GPU (docs/gpu.md, "On your first GPU"). Skipped where there is none, with the CUDA error
that says why; where there is one, each stage must give its documented verdict: the probe, the GEMM tile and one
rank's split pass pass (the last two on compute capability 10.x, the SM100 grouped GEMMs'), the later stages of the
split executor say they are not built, and the command exits 5 (nothing failed, stages not built) on a Blackwell
GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mok import _mok, selftest

_status, _detail, _info = _mok.device_info(0)
if not _mok.cuda_architectures():
    pytest.skip("libmok was built without CUDA (MOK_ENABLE_CUDA=OFF)", allow_module_level=True)
if _status != 0:
    pytest.skip(f"no GPU: {_detail}", allow_module_level=True)

BLACKWELL = _info["compute_capability"][0] == 10
TIMEOUT_MS = 60000


def run(stage: int):
    return _mok.selftest_run(stage, 0, TIMEOUT_MS, 0)


def test_probe_passes():
    status, message, seconds = run(0)
    if status == selftest.UNSUPPORTED and "cannot load libmok's device code" in message:
        pytest.skip(f"this libmok carries no code for this GPU: {message}")
    assert status == selftest.SUCCESS, message
    assert "error record in host-mapped memory read as the device wrote it" in message, message
    assert seconds < TIMEOUT_MS / 1000


def test_gemm_tile_matches_the_host():
    status, message, _ = run(1)
    if not BLACKWELL:
        assert status == selftest.UNSUPPORTED and "compute capability 10.x" in message, message
        pytest.skip(f"the SM100 grouped GEMM needs compute capability 10.x: {message}")
    if status == selftest.NOT_COMPILED:
        pytest.skip(f"libmok has no grouped GEMM: {message}")
    assert status == selftest.SUCCESS, message
    assert "padding rows untouched" in message, message


def test_one_rank_matches_the_host():
    status, message, _ = run(2)
    if not BLACKWELL:
        assert status == selftest.UNSUPPORTED and "compute capability 10.x" in message, message
        pytest.skip(f"the split pass's SM100 grouped GEMMs need compute capability 10.x: {message}")
    if status == selftest.NOT_COMPILED:
        pytest.skip(f"libmok has no grouped GEMM: {message}")
    assert status == selftest.SUCCESS, message
    assert "each pass twice with the same bits" in message, message


@pytest.mark.parametrize("stage", range(3, _mok.NUM_SELFTEST_STAGES))
def test_stages_of_the_split_executor_say_not_built(stage):
    status, message, _ = run(stage)
    assert status == selftest.NOT_COMPILED and "not built in this libmok (issue #12)" in message, message


def test_command_line_on_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "mok.selftest"], capture_output=True, text=True, timeout=480)
    assert proc.returncode in (selftest.NOT_BUILT, selftest.UNSUPPORTED_GPU), proc.stdout + proc.stderr
    if BLACKWELL:
        assert proc.returncode == selftest.NOT_BUILT, proc.stdout
