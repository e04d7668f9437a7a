"""The staged self-test a user runs first on a GPU: `python -m mok.selftest` (docs/gpu.md, "On your first GPU").

The stages are libmok's (mokSelftestRun, the same code `mok_selftest` runs); this module is only the runner, line for
line the C++ one (kernel/tools/selftest_runner.hpp): the same stages, output and exit codes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from mok import _mok

SUCCESS, NOT_COMPILED, NO_DEVICE, UNSUPPORTED, TIMEOUT = 0, 3, 4, 5, 9

# Exit codes: the first stage that stops the run decides 1, 2 or 3; else a stage not built decides 4 or 5.
PASSED, FAILED, NO_GPU, UNSUPPORTED_GPU, NO_CUDA, NOT_BUILT, USAGE = 0, 1, 2, 3, 4, 5, 64
EXIT_WORDS = {
    PASSED: "every stage passed",
    FAILED: "a stage failed",
    NO_GPU: "no usable GPU or driver",
    UNSUPPORTED_GPU: "this GPU cannot run this libmok's device code",
    NO_CUDA: "this libmok was built without CUDA",
    NOT_BUILT: "no stage failed, but some are not built in this libmok",
}
VERDICTS = {SUCCESS: "PASS", NOT_COMPILED: "NOT BUILT", NO_DEVICE: "NO GPU", UNSUPPORTED: "UNSUPPORTED"}


@dataclass(frozen=True)
class StageResult:
    status: int
    message: str
    seconds: float


def stage_names() -> list[str]:
    return [_mok.selftest_stage_name(s) for s in range(_mok.NUM_SELFTEST_STAGES)]


def run(stages: Sequence[int], run_stage: Callable[[int], StageResult], has_cuda: bool,
        out: TextIO) -> tuple[int, bool]:
    """Runs `stages` in order, stopping at the first that neither passes nor is not built; (exit code, timed out)."""
    code, not_built, timed_out, count = PASSED, False, False, _mok.NUM_SELFTEST_STAGES
    for stage in stages:
        name = _mok.selftest_stage_name(stage)
        if code != PASSED:
            print(f"[{stage + 1}/{count}] {name}: NOT RUN: an earlier stage did not pass", file=out)
            continue
        r = run_stage(stage)
        print(f"[{stage + 1}/{count}] {name}: {VERDICTS.get(r.status, 'FAIL')} ({r.seconds:.2f} s): {r.message}",
              file=out, flush=True)
        not_built = not_built or r.status == NOT_COMPILED
        if r.status not in (SUCCESS, NOT_COMPILED):
            code = {NO_DEVICE: NO_GPU, UNSUPPORTED: UNSUPPORTED_GPU}.get(r.status, FAILED)
        timed_out = timed_out or r.status == TIMEOUT
    if code == PASSED and not_built:
        code = NOT_BUILT if has_cuda else NO_CUDA
    print(f"mok self-test: {EXIT_WORDS[code]} (exit code {code})", file=out, flush=True)
    return code, timed_out


def _use_nccl_wheel() -> None:
    """NCCL for the probe's report: the pinned wheel's library (torch's dependency), unless MOK_NCCL_LIBRARY is set."""
    if os.environ.get("MOK_NCCL_LIBRARY"):
        return
    try:
        import nvidia.nccl
    except ImportError:
        return
    for base in nvidia.nccl.__path__:
        lib = os.path.join(base, "lib", "libnccl.so.2")
        if os.path.exists(lib):
            os.environ["MOK_NCCL_LIBRARY"] = lib
            return


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mok.selftest", description="The staged self-test of libmok on a GPU.")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--timeout-ms", type=int, default=60000, help="the bound of each wait for the GPU, 1..600000")
    p.add_argument("--seed", type=int, default=0, help="the random inputs' seed (0: a fresh one, reported)")
    p.add_argument("--stage", action="append", choices=stage_names(), help="run only these stages (repeatable)")
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else USAGE
    if args.device < 0 or not 1 <= args.timeout_ms <= 600000 or not 0 <= args.seed < 2**62:
        print("mok.selftest: --device >= 0, --timeout-ms in 1..600000, --seed in 0..2^62", file=sys.stderr)
        return USAGE
    _use_nccl_wheel()
    names = stage_names()
    stages = [names.index(s) for s in args.stage] if args.stage else list(range(len(names)))
    code = _mok.version()
    archs = _mok.cuda_architectures()
    print(f"mok self-test: libmok {code // 10000}.{code // 100 % 100}.{code % 100} "
          f"(CUDA architectures: {archs or 'none'}), device {args.device}, timeout {args.timeout_ms} ms per wait",
          file=out)

    def run_stage(stage: int) -> StageResult:
        return StageResult(*_mok.selftest_run(stage, args.device, args.timeout_ms, args.seed))

    code, timed_out = run(stages, run_stage, bool(archs), out)
    if timed_out:  # the GPU may still run that stage's kernel: leave without the runtime's teardown
        out.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
