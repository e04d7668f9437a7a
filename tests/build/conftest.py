"""Fixtures for the build, install and packaging-of-libmok tests.

They use the install prefix and build dir that `nox -s tests` made (MOK_PREFIX, MOK_BUILD_DIR), or, run alone,
build libmok once per session under build/pytest/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def run(*cmd: str | Path, **kw) -> subprocess.CompletedProcess:
    """Run a command; on failure show its output in the assertion."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def cuda_bin() -> Path:
    """The bin dir of the pinned CUDA toolchain (nvcc, cuobjdump)."""
    if os.environ.get("MOK_CUDA_BIN"):
        return Path(os.environ["MOK_CUDA_BIN"])
    from tools.cuda_toolchain import ensure

    return ensure(ROOT / ".toolchain" / "cuda-13.0") / "bin"


@pytest.fixture(scope="session")
def prefix(cuda_bin: Path) -> Path:
    """An install prefix of a Release libmok built for 100a;103a."""
    if os.environ.get("MOK_PREFIX"):
        return Path(os.environ["MOK_PREFIX"])
    build = ROOT / "build" / "pytest" / "libmok"
    install = build / "install"
    env = {**os.environ, "CUDACXX": str(cuda_bin / "nvcc")}
    run("cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_INSTALL_PREFIX={install}", env=env)
    run("cmake", "--build", build, env=env)
    run("cmake", "--install", build, env=env)
    return install


@pytest.fixture(scope="session")
def libmok(prefix: Path) -> Path:
    lib = prefix / "lib" / "libmok.so"
    assert lib.exists(), f"{lib} missing from the install prefix"
    return lib.resolve()


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
