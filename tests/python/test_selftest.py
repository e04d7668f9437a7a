"""mok.selftest, the Python runner of libmok's staged self-test: its stopping rule, lines and exit codes over made-up
stage outcomes (the same rules as kernel/tools/selftest_runner.hpp, which tests/cpp/test_selftest checks), and the
real stages on this machine, where without a GPU no stage may pass."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from mok import _mok, selftest

NUM = _mok.NUM_SELFTEST_STAGES


def gpu_here() -> bool:
    return _mok.device_info(0)[0] == 0


def run_with(outcomes: dict[int, int], has_cuda: bool = True, stages=None):
    ran, out = [], io.StringIO()

    def stage(s: int) -> selftest.StageResult:
        ran.append(s)
        return selftest.StageResult(outcomes.get(s, selftest.SUCCESS), f"why {s}", 0.25)

    code, timed_out = selftest.run(list(range(NUM)) if stages is None else stages, stage, has_cuda, out)
    return code, timed_out, out.getvalue(), ran


def test_every_stage_passing_exits_0():
    code, _, out, ran = run_with({})
    assert code == selftest.PASSED and ran == list(range(NUM))
    assert "[1/7] probe: PASS (0.25 s): why 0\n" in out
    assert out.endswith("mok self-test: every stage passed (exit code 0)\n")


@pytest.mark.parametrize(("status", "code"), [(11, 1), (6, 1), (9, 1), (4, 2), (5, 3)])
def test_a_failure_stops_the_run_with_its_code(status, code):
    got, timed_out, out, ran = run_with({1: status, 3: selftest.NOT_COMPILED})
    assert got == code and ran == [0, 1]
    assert "[3/7] one_rank: NOT RUN: an earlier stage did not pass\n" in out
    assert timed_out == (status == selftest.TIMEOUT)


def test_stages_not_built_run_on_and_exit_5_or_4():
    code, _, out, ran = run_with({2: selftest.NOT_COMPILED, 4: selftest.NOT_COMPILED})
    assert code == selftest.NOT_BUILT and ran == list(range(NUM))
    assert "[3/7] one_rank: NOT BUILT (0.25 s): why 2\n" in out
    assert run_with(dict.fromkeys(range(NUM), selftest.NOT_COMPILED), has_cuda=False)[0] == selftest.NO_CUDA
    assert run_with({2: selftest.NOT_COMPILED, 5: 11})[0] == selftest.FAILED


def test_stage_names_are_libmoks():
    assert selftest.stage_names() == ["probe", "gemm_tile", "one_rank", "virtual_ranks", "every_gpu", "determinism",
                                      "benchmark"]
    with pytest.raises(ValueError, match="stage"):
        _mok.selftest_stage_name(NUM)


def test_bad_options_are_refused_by_libmok():
    status, message, _ = _mok.selftest_run(0, 0, 0, 1)
    assert status == 1 and "'options.timeout_ms' (0) must be in 1..600000" in message
    assert selftest.main(["--timeout-ms", "0"]) == selftest.USAGE
    assert selftest.main(["--stage", "nonsense"]) == selftest.USAGE


@pytest.mark.skipif(gpu_here(), reason="a GPU is here: tests/gpu checks the stages on it")
def test_no_stage_passes_without_a_gpu():
    cuda = bool(_mok.cuda_architectures())
    for stage in range(NUM):
        status, message, seconds = _mok.selftest_run(stage, 0, 10000, 0)
        assert status != selftest.SUCCESS, f"stage {stage} passed without a GPU: {message}"
        assert message and 0 <= seconds < 60
        if not cuda:
            assert status == selftest.NOT_COMPILED and "without CUDA" in message, message
        else:
            assert (status == selftest.NO_DEVICE and "cudaError" in message) or (
                stage > 0 and status == selftest.NOT_COMPILED and "CUTLASS" in message), message


@pytest.mark.skipif(gpu_here(), reason="a GPU is here: tests/gpu runs the command on it")
def test_command_line_without_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "mok.selftest", "--timeout-ms", "10000"], capture_output=True,
                          text=True, timeout=300)
    cuda = bool(_mok.cuda_architectures())
    assert proc.returncode == (selftest.NO_GPU if cuda else selftest.NO_CUDA), proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("mok self-test: libmok ") and len(lines) == NUM + 2, proc.stdout
    if cuda:  # the probe names the CUDA error that says why; nothing after it runs
        assert lines[1].startswith("[1/7] probe: NO GPU (") and "cudaError" in lines[1], lines[1]
        assert all(": NOT RUN: " in line for line in lines[2:-1]), proc.stdout
    assert lines[-1] == f"mok self-test: {selftest.EXIT_WORDS[proc.returncode]} (exit code {proc.returncode})"
