"""Install the pinned CUDA 13.0 toolchain from PyPI wheels and print its root.

    python tools/cuda_toolchain.py [DIR]     # default: .toolchain/cuda-13.0 in the repository

The wheels unpack to DIR/nvidia/cu13 (bin/nvcc, include/, lib/); nvcc.profile links from lib64, so a lib64 link
is added. Point CMake at it with CUDACXX=<root>/bin/nvcc (the nox sessions do this unless CUDACXX is already set).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# CUDA 13.0 as one toolkit. cuobjdump and nvdisasm have no 13.0.x wheels; 13.2.51 (their oldest) read 13.0 binaries.
PINS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-cuobjdump==13.2.51",
    "nvidia-cuda-nvdisasm==13.2.51",
)


def ensure(target: Path) -> Path:
    root = target / "nvidia" / "cu13"
    stamp = target / "pins.txt"
    wanted = "\n".join(PINS) + "\n"
    if not (stamp.exists() and stamp.read_text() == wanted and (root / "bin" / "nvcc").exists()):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade",
             "--target", str(target), *PINS],
            check=True,
        )
        stamp.write_text(wanted)
    # The links a toolkit has and the wheels lack: nvcc.profile links from lib64, and CMake's
    # FindCUDAToolkit requires the unversioned libcudart.so (libmok itself links cudart statically).
    for link, to in ((root / "lib64", "lib"), (root / "lib" / "libcudart.so", "libcudart.so.13")):
        if not link.is_symlink():
            link.symlink_to(to)
    return root


def toolchain_env(repo: Path) -> dict[str, str]:
    """CUDACXX and MOK_CUDA_BIN (its bin dir: cuobjdump) for the caller's CUDACXX, else the pinned toolchain."""
    if os.environ.get("CUDACXX"):
        nvcc = Path(os.environ["CUDACXX"])
    else:
        nvcc = ensure(repo / ".toolchain" / "cuda-13.0") / "bin" / "nvcc"
    return {"CUDACXX": str(nvcc), "MOK_CUDA_BIN": str(nvcc.parent)}


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else repo / ".toolchain" / "cuda-13.0"
    print(ensure(target.resolve()))


if __name__ == "__main__":
    main()
