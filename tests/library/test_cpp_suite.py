"""The C++ suite (tests/cpp, CTest): once as built by `nox -s tests`, once under ThreadSanitizer, once under
AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer.

The plain run uses MOK_BUILD_DIR when nox built it; run alone it builds a host-only copy under build/pytest/.
The sanitizer runs are always host-only builds (device code is not instrumented) that stop at the first report with
a distinct exit code, so any error or leak fails the test.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from buildutil import ROOT, cccl_include_dir


def build_tests(name: str, *options: str) -> Path:
    build = ROOT / "build" / "pytest" / name
    for cmd in (["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                 "-DMOK_ENABLE_CUDA=OFF", f"-DMOK_CCCL_INCLUDE_DIR={cccl_include_dir()}", "-DMOK_BUILD_TESTS=ON",
                 *options],
                ["cmake", "--build", build]):
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(map(str, cmd))}:\n{proc.stdout[-8000:]}\n{proc.stderr[-8000:]}"
    return build


def run_ctest(build: Path, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(["ctest", "--test-dir", str(build), "--output-on-failure", "--no-tests=error"],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, f"ctest failed:\n{proc.stdout[-12000:]}\n{proc.stderr[-4000:]}"
    assert "tests passed" in proc.stdout


def test_cpp_suite():
    build = Path(os.environ["MOK_BUILD_DIR"]) if os.environ.get("MOK_BUILD_DIR") else build_tests("ctest")
    run_ctest(build)


def test_cpp_suite_under_thread_sanitizer():
    build = build_tests("tsan", "-DMOK_SANITIZE=thread")
    run_ctest(build, {"TSAN_OPTIONS": "halt_on_error=1 abort_on_error=0 exitcode=66 second_deadlock_stack=1"})


# ASan's own exit code for errors and leaks, UBSan's through halt_on_error: a report cannot pass as a test failure
# the suite expected. fork-based tests (test_processes, test_kill) are covered too: the children inherit these.
ASAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1 halt_on_error=1 abort_on_error=0 exitcode=67 detect_stack_use_after_return=1 "
                    "strict_init_order=1 check_initialization_order=1 detect_invalid_pointer_pairs=0",
    "LSAN_OPTIONS": "exitcode=67",
    "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1 exitcode=68",
}


def test_cpp_suite_under_address_sanitizer():
    build = build_tests("asan", "-DMOK_SANITIZE=address")
    run_ctest(build, ASAN_ENV)


def test_orders_hold_when_the_compiler_may_fuse():
    """Every rounding of the layer is part of its contract (docs/semantics.md): an FMA-capable -march with
    -ffp-contract=fast must not fuse the combine's w_k * y_k + acc (libmok builds its core with -ffp-contract=off).
    test_orders compares the host executor bit for bit with an emulation of the documented order."""
    if "fma" not in Path("/proc/cpuinfo").read_text().split():
        pytest.skip("this CPU has no FMA instructions: nothing for the compiler to fuse")
    build = ROOT / "build" / "pytest" / "fma"
    for cmd in (["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DMOK_ENABLE_CUDA=OFF",
                 f"-DMOK_CCCL_INCLUDE_DIR={cccl_include_dir()}", "-DMOK_BUILD_TESTS=ON",
                 "-DCMAKE_CXX_FLAGS=-march=haswell -ffp-contract=fast"],
                ["cmake", "--build", build, "--target", "test_orders"],
                [build / "tests" / "cpp" / "test_orders"]):
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(map(str, cmd))}:\n{proc.stdout[-8000:]}\n{proc.stderr[-8000:]}"


def test_shared_memory_reserved_in_a_small_shm():
    """test_shared_memory's reserved_segment_survives_a_full_shm in a private 64 MiB /dev/shm (a mount namespace of
    its own, as Docker's default /dev/shm is): a segment created sparse dies with SIGBUS once /dev/shm is full."""
    build = Path(os.environ["MOK_BUILD_DIR"]) if os.environ.get("MOK_BUILD_DIR") else build_tests("ctest")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs over /dev/shm here (needs root): {probe.stderr.strip()}")
    test = build / "tests" / "cpp" / "test_shared_memory"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" "$1"',
                           str(test), "reserved_segment_survives_a_full_shm"], capture_output=True, text=True)
    print(proc.stdout[-4000:])
    assert proc.returncode == 0 and "[  OK  ] reserved_segment_survives_a_full_shm" in proc.stdout, (
        f"{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}")
