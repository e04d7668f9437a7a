"""Helpers of the build tests: the repository root, running commands, the pinned CUDA toolchain."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*cmd: str | Path, **kw) -> subprocess.CompletedProcess:
    """Run a command; on failure show its output in the assertion."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def cuda_bin_dir() -> Path:
    """The bin dir of the pinned CUDA toolchain (nvcc, cuobjdump): MOK_CUDA_BIN, or installed from PyPI."""
    if os.environ.get("MOK_CUDA_BIN"):
        return Path(os.environ["MOK_CUDA_BIN"])
    sys.path.insert(0, str(ROOT))
    from tools.cuda_toolchain import toolchain_env

    return Path(toolchain_env(ROOT)["MOK_CUDA_BIN"])


def cccl_include_dir() -> Path:
    return cuda_bin_dir().parent / "include" / "cccl"
