"""The self-test's stages on a GPU (docs/gpu.md, "On your first GPU"). Skipped where there is none, with the CUDA error
that says why; where there is one, each stage must give its documented verdict: the probe, the GEMM tile, one rank's
split pass and the cuda executor's layer (a group of virtual ranks on one GPU, one rank on every GPU, across runs and in
a benchmark line) pass (all but the probe on a GPU whose grouped GEMMs the build carries: compute capability 10.x with
100a or 103a built, the SM100 units, or 9.0 with 90a, the SM90 ones), and the command exits 0 on such a GPU."""

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

_built = set(_mok.cuda_architectures().split(";"))
_cc = tuple(_info["compute_capability"])
# This GPU runs the build's grouped GEMMs: its own target is built (100a for 10.0, 103a for 10.3, 90a for 9.0).
GEMMS_HERE = f"{_cc[0]}{_cc[1]}a" in _built and _cc[0] in (9, 10)
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


# The stages over the grouped GEMMs: the GEMM tile, one rank's split pass, the cuda executor's layer.
GEMM_STAGES = [(1, "padding rows untouched"), (2, "each pass twice with the same bits"),
                (3, "every rank within the bound"), (4, "within the bound"), (5, "the same bits each time"),
                (6, "TFLOP/s")]


@pytest.mark.parametrize("stage, passed", GEMM_STAGES)
def test_gemm_stages_pass(stage, passed):
    status, message, _ = run(stage)
    if not GEMMS_HERE:  # the architecture's own words, or (a build without its code) that it cannot load libmok's
        assert status == selftest.UNSUPPORTED, message
        assert "compute capability 10.x" in message or "cannot load libmok's device code" in message, message
        pytest.skip(f"this build's grouped GEMMs do not run on sm_{_cc[0]}{_cc[1]}: {message}")
    if status == selftest.NOT_COMPILED:
        pytest.skip(f"libmok has no grouped GEMM: {message}")
    assert status == selftest.SUCCESS, message
    assert passed in message, message


def test_command_line_on_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "mok.selftest"], capture_output=True, text=True, timeout=480)
    assert proc.returncode in (selftest.PASSED, selftest.UNSUPPORTED_GPU), proc.stdout + proc.stderr
    if GEMMS_HERE:
        assert proc.returncode == selftest.PASSED, proc.stdout
