"""Packaging checks: conda recipe, Nix flake, byte-identical builds. Each skips, naming what is missing,
when its tool is absent; CI installs them (docs/packaging.md, "Checks")."""

import sys
from pathlib import Path

# The helpers next to the tests (source_tree, conda_tools, ...) import as plain modules.
sys.path.insert(0, str(Path(__file__).parent))

import os
import shutil

import pytest


def _nvcc() -> Path | None:
    found = os.environ.get("CUDACXX") or shutil.which("nvcc")
    return Path(found).resolve() if found else None


@pytest.fixture(scope="session")
def nvcc() -> Path:
    """nvcc 13.0, for the CUDA build of the reproducibility check (CUDACXX or PATH)."""
    path = _nvcc()
    if path is None:
        pytest.skip("nvcc not found (set CUDACXX, or run tools/cuda_toolchain.py): CUDA build not checked")
    return path


@pytest.fixture(scope="session")
def cccl_dir() -> Path:
    """CCCL's include dir, which a host-only libmok build needs: MOK_CCCL_INCLUDE_DIR, else the CUDA toolkit's."""
    candidates = [os.environ.get("MOK_CCCL_INCLUDE_DIR")]
    if _nvcc():
        candidates.append(str(_nvcc().parent.parent / "include" / "cccl"))
    candidates += [os.environ.get("CUDA_HOME", "") + "/include/cccl", "/usr/local/cuda/include/cccl"]
    for c in filter(None, candidates):
        if (Path(c) / "cuda" / "atomic").is_file():
            return Path(c)
    pytest.skip("CCCL not found: set MOK_CCCL_INCLUDE_DIR (pip install nvidia-cuda-cccl==13.0.85 provides it)")
