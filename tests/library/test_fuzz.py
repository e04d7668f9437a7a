"""A bounded run of the libFuzzer target over the layer's C ABI (tests/fuzz/fuzz_layer.cpp).

Builds the target with clang (ASan + UBSan, enum check included; MOK_BUILD_FUZZ) under build/pytest/fuzz, replays
the seed corpus tests/fuzz/corpus (regress-* files included) and fuzzes for MOK_FUZZ_SECONDS (60 by default; `nox
-s fuzz` runs 15 minutes). Fails on any crash, sanitizer report, leak, hang (-timeout) or out-of-memory, showing the
finding and the artifact libFuzzer kept. Without clang the test skips, saying why, unless MOK_REQUIRE_FUZZ=1 (CI).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from buildutil import ROOT, cccl_include_dir, run

CORPUS = ROOT / "tests" / "fuzz" / "corpus"
PER_INPUT_TIMEOUT_S = 10  # an input makes at most ~10 calls with 200 ms waits: seconds, even on 2 busy cores
SANITIZERS = {
    "ASAN_OPTIONS": "detect_leaks=1 halt_on_error=1 abort_on_error=0 detect_stack_use_after_return=1",
    "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1",
}


def clang() -> tuple[str, str] | None:
    """clang and clang++ with libFuzzer: MOK_FUZZ_CLANG (the C++ driver), or Debian's clang-14."""
    for cxx in (os.environ.get("MOK_FUZZ_CLANG"), "clang++-14", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx.replace("clang++", "clang"), cxx
    return None


def build_fuzzer() -> Path:
    compilers = clang()
    if compilers is None:
        reason = "clang++-14 not found (apt-get install clang-14 libclang-rt-14-dev llvm-14): the C ABI is not fuzzed"
        if os.environ.get("MOK_REQUIRE_FUZZ") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    build = ROOT / "build" / "pytest" / "fuzz"
    run("cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
        f"-DCMAKE_C_COMPILER={compilers[0]}", f"-DCMAKE_CXX_COMPILER={compilers[1]}", "-DMOK_ENABLE_CUDA=OFF",
        f"-DMOK_CCCL_INCLUDE_DIR={cccl_include_dir()}", "-DMOK_BUILD_FUZZ=ON", "-DMOK_INSTALL=OFF")
    run("cmake", "--build", build, "--target", "fuzz_layer")
    return build / "tests" / "fuzz" / "fuzz_layer"


def test_fuzz_layer_c_abi(tmp_path: Path):
    fuzzer = build_fuzzer()
    seconds = int(os.environ.get("MOK_FUZZ_SECONDS", "60"))
    seeds = sorted(CORPUS.iterdir())
    assert len(seeds) >= 30, f"the seed corpus {CORPUS} has {len(seeds)} files: run tests/fuzz/make_corpus.py"
    found, artifacts = tmp_path / "corpus", fuzzer.parent / "artifacts"  # artifacts outlive the test, for replay
    found.mkdir()
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir()
    # New inputs go to the first directory (tmp); the committed seeds are only read.
    cmd = [str(fuzzer), f"-max_total_time={seconds}", f"-timeout={PER_INPUT_TIMEOUT_S}", "-rss_limit_mb=4096",
           "-print_final_stats=1", f"-artifact_prefix={artifacts}/", str(found), str(CORPUS)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **SANITIZERS})
    try:
        output, _ = proc.communicate(timeout=seconds + 600)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the fuzzer ran past {seconds + 600} s:\n{output[-6000:]}")
    lines = output.splitlines()
    stats = [line for line in lines if line.startswith(("stat::", "Done ", "INFO: seed corpus"))]
    print("\n".join(stats))
    kept = sorted(p.name for p in artifacts.iterdir())
    findings = [line for line in lines if "FINDING" in line or "ERROR:" in line or "runtime error" in line
                or "SUMMARY:" in line or line.startswith("==") and "deadly signal" in line]
    leftovers = sorted(Path("/dev/shm").glob(f"mokfuzz-{proc.pid}-*"))
    for p in leftovers:
        p.unlink()
    assert proc.returncode == 0 and not kept and not findings, (
        f"fuzz_layer found something (exit {proc.returncode}); artifacts {kept}; replay one with "
        f"MOK_FUZZ_VERBOSE=1 {fuzzer} <artifact> to see the calls:\n" + "\n".join(findings[:20])
        + "\n---\n" + output[-8000:])
    assert not leftovers, f"shared-memory segments left behind: {leftovers}"
    assert any(line.startswith("Done ") for line in lines), output[-4000:]
    replayed = re.search(r"INFO: seed corpus: files: (\d+)", output)  # libFuzzer drops empty and duplicate files
    assert replayed and int(replayed.group(1)) >= 30, "the seed corpus was not replayed:\n" + output[-4000:]
