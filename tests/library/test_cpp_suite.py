"""The C++ suite (tests/cpp, CTest): once as built by `nox -s tests`, once under ThreadSanitizer.

The plain run uses MOK_BUILD_DIR when nox built it; run alone it builds a host-only copy under build/pytest/.
The TSan run is always a host-only build (device code is not instrumented) with halt_on_error, so any report fails.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
