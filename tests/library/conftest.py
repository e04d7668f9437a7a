"""Fixtures for the build, install and packaging-of-libmok tests.

They use the install prefix that `nox -s tests` made (MOK_PREFIX), or, run alone, build libmok once per session
under build/pytest/.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from buildutil import ROOT, cccl_include_dir, cuda_bin_dir, run


@pytest.fixture(scope="session")
def cuda_bin() -> Path:
    return cuda_bin_dir()


@pytest.fixture(scope="session")
def prefix(cuda_bin: Path) -> Path:
    """An install prefix of a Release libmok built for the default targets (90a;100a;103a)."""
    if os.environ.get("MOK_PREFIX"):
        return Path(os.environ["MOK_PREFIX"])
    build = ROOT / "build" / "pytest" / "libmok"
    install = build / "install"
    env = {**os.environ, "CUDACXX": str(cuda_bin / "nvcc")}
    run("cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DMOK_ENABLE_CUDA=ON",
        f"-DCMAKE_INSTALL_PREFIX={install}", env=env)
    run("cmake", "--build", build, env=env)
    run("cmake", "--install", build, env=env)
    return install


@pytest.fixture(scope="session")
def host_only_prefix() -> Path:
    """An install prefix of a libmok built with MOK_ENABLE_CUDA=OFF (of CUDA, only CCCL's headers are used)."""
    build = ROOT / "build" / "pytest" / "libmok-host-only"
    install = build / "install"
    run("cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DMOK_ENABLE_CUDA=OFF",
        f"-DMOK_CCCL_INCLUDE_DIR={cccl_include_dir()}", f"-DCMAKE_INSTALL_PREFIX={install}")
    run("cmake", "--build", build)
    run("cmake", "--install", build)
    return install


@pytest.fixture(scope="session")
def libmok(prefix: Path) -> Path:
    lib = prefix / "lib" / "libmok.so"
    assert lib.exists(), f"{lib} missing from the install prefix"
    return lib.resolve()
