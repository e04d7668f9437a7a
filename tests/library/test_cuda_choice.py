"""MOK_ENABLE_CUDA's choice at configure time (configure only, no build): AUTO, the default, gives a host-only
libmok and says so where no CUDA compiler is found; ON without one fails naming nvcc and the switch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from buildutil import ROOT, cccl_include_dir


def without_nvcc() -> tuple[dict[str, str], list[str]]:
    """An environment and CMake arguments under which no nvcc can be found: every PATH dir holding one is dropped
    and its prefix ignored by CMake's searches (which also look in the system prefixes, /usr/local among them)."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    nvcc_dirs = [d for d in dirs if (Path(d) / "nvcc").exists()]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUDA_PATH", "CUDAToolkit_ROOT")}
    env["PATH"] = os.pathsep.join(d for d in dirs if d not in nvcc_dirs)
    assert shutil.which("nvcc", path=env["PATH"]) is None
    ignored = sorted({str(Path(d).parent) for d in nvcc_dirs} | {"/usr/local"})
    return env, [f"-DCMAKE_IGNORE_PREFIX_PATH={';'.join(ignored)}"]


def configure(build: Path, *args: str, cccl: bool = True, env_extra: dict | None = None,
              ignore_extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env, ignore = without_nvcc()
    env.update(env_extra or {})
    ignore = [f"{ignore[0]};{';'.join(ignore_extra)}"] if ignore_extra else ignore
    given = [f"-DMOK_CCCL_INCLUDE_DIR={cccl_include_dir()}"] if cccl else []
    cmd = ["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", *given, *ignore, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def cache_entry(build: Path, name: str) -> str:
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split("=", 1)[1]
    raise AssertionError(f"{name} is not in {build}/CMakeCache.txt")


def test_auto_without_nvcc_builds_host_only(tmp_path):
    proc = configure(tmp_path / "b")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "no CUDA compiler found" in out and "building a host-only libmok" in out, out
    assert "-DMOK_ENABLE_CUDA=ON" in out, f"the message must name the switch:\n{out}"
    assert cache_entry(tmp_path / "b", "MOK_ENABLE_CUDA") == "AUTO"
    # The host-only library: no CUDA language enabled, and the build config the library reports says so.
    assert not list((tmp_path / "b" / "CMakeFiles").glob("*/CMakeCUDACompiler.cmake"))
    assert "MOK_WITH_CUDA=0" in (tmp_path / "b" / "build.ninja").read_text()


def test_explicit_on_without_nvcc_fails_naming_nvcc(tmp_path):
    proc = configure(tmp_path / "b", "-DMOK_ENABLE_CUDA=ON")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "MOK_ENABLE_CUDA=ON but no CUDA compiler is found: nvcc is not on PATH" in out, out
    assert "CUDACXX" in out and "-DMOK_ENABLE_CUDA=OFF" in out, out
    assert "Failed to find nvcc" not in out, out


def test_explicit_off_never_looks(tmp_path):
    proc = configure(tmp_path / "b", "-DMOK_ENABLE_CUDA=OFF")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "CUDA compiler" not in out, out
    assert "MOK_WITH_CUDA=0" in (tmp_path / "b" / "build.ninja").read_text()


def test_host_only_build_takes_cccl_from_the_wheel(tmp_path):
    """pip builds the package with nvidia-cuda-cccl in its build environment (python/pyproject.toml): without a
    CUDA toolkit and without MOK_CCCL_INCLUDE_DIR, CMake finds CCCL's headers in that wheel's place, through the
    Python that runs the build (here a site dir laid out as the wheel installs: nvidia/cu13/include/cccl)."""
    site = tmp_path / "site"
    (site / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "include" / "cccl").symlink_to(cccl_include_dir())
    no_toolkit = {"PYTHONPATH": str(site), "CUDA_HOME": "", "CONDA_PREFIX": ""}
    toolkit = str(cccl_include_dir().parent.parent)  # the pinned toolkit's prefix: not searched this time
    python = (f"-DPython_EXECUTABLE={sys.executable}", "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON")
    found = configure(tmp_path / "b", *python, cccl=False, env_extra=no_toolkit, ignore_extra=(toolkit,))
    assert found.returncode == 0, found.stdout + found.stderr
    assert cache_entry(tmp_path / "b", "MOK_CCCL_INCLUDE_DIR") == str(site / "nvidia" / "cu13" / "include" / "cccl")
    # Without the wheel the error names it and the switch.
    missing = configure(tmp_path / "c", *python, cccl=False,
                        env_extra={**no_toolkit, "PYTHONPATH": str(tmp_path / "empty")}, ignore_extra=(toolkit,))
    out = missing.stdout + missing.stderr
    assert missing.returncode != 0 and "nvidia-cuda-cccl==13.0.85" in out and "MOK_CCCL_INCLUDE_DIR" in out, out


def test_a_named_cutlass_dir_without_cutlass_fails_naming_it(tmp_path):
    """A package build names CUTLASS's headers (recipe/build_libmok.sh, nix/libmok.nix): a wrong directory must stop
    the configure, not leave libmok quietly without its grouped GEMMs (and so without the cuda executor)."""
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if not nvcc:
        pytest.skip("no nvcc (CUDACXX or PATH): the check runs in a CUDA configure")
    empty = tmp_path / "no-cutlass"
    empty.mkdir()
    proc = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "b"), "-G", "Ninja", "-DMOK_ENABLE_CUDA=ON",
                           f"-DCMAKE_CUDA_COMPILER={nvcc}", "-DMOK_CUDA_ARCHITECTURES=100a",
                           f"-DMOK_CCCL_INCLUDE_DIR={cccl_include_dir()}", f"-DMOK_CUTLASS_INCLUDE_DIR={empty}"],
                          capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    words = " ".join(out.split())  # CMake wraps its message's lines
    assert f"MOK_CUTLASS_INCLUDE_DIR ({empty}) holds no CUTLASS 4.2 headers" in words, out
