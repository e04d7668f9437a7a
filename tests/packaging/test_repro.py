"""Release builds are byte-identical across two source copies at paths of different lengths, built one after
the other with SOURCE_DATE_EPOCH from the last commit: libmok.so host-only, libmok.so with CUDA for one
architecture (sm_100a: the device-code path, at half the compile time of both), and the wheel (host-only;
it bundles the same libmok). A difference prints the diffoscope report, or a section diff without it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import repro_diff
import source_tree

VERSION = "0.5.0"


def _run(*cmd, env=None, cwd=None):
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """Two copies of the working tree, at paths of different lengths."""
    base = tmp_path_factory.mktemp("repro")
    return [source_tree.copy(base / "a" / "src"), source_tree.copy(base / "second-copy" / "source")]


@pytest.fixture(scope="module")
def env():
    return {**os.environ, "SOURCE_DATE_EPOCH": source_tree.source_date_epoch()}


def _assert_identical(a: Path, b: Path):
    assert repro_diff.sha256(a) == repro_diff.sha256(b), f"{a} and {b} differ:\n{repro_diff.explain(a, b)}"


def _build_libmok(src: Path, env, *cmake_args) -> Path:
    build = src.parent / "build-libmok"
    _run("cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", *cmake_args, env=env)
    _run("cmake", "--build", build, "--parallel", "2", env=env)
    return build / "kernel" / f"libmok.so.{VERSION}"


def test_no_anonymous_namespaces_in_cuda_sources():
    # nvcc names an anonymous namespace after the absolute path of its file (-frandom-seed does not help):
    # every kernel in one would change with the checkout's location. Use a named namespace or `static`.
    offenders = [
        str(p.relative_to(source_tree.REPO))
        for p in sorted((source_tree.REPO / "kernel").rglob("*.cu*"))
        if re.search(r"\bnamespace\s*\{", p.read_text())
    ]
    assert not offenders, f"anonymous namespaces in CUDA sources (not reproducible): {offenders}"


def test_libmok_host_only(copies, env, cccl_dir):
    args = ["-DMOK_ENABLE_CUDA=OFF", f"-DMOK_CCCL_INCLUDE_DIR={cccl_dir}"]
    _assert_identical(*(_build_libmok(src, env, *args) for src in copies))


def test_libmok_cuda_sm100a(copies, env, nvcc, tmp_path):
    args = ["-DMOK_ENABLE_CUDA=ON", "-DMOK_CUDA_ARCHITECTURES=100a", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    # Fresh build dirs: the host-only test may have configured the same copies.
    libs = []
    for i, src in enumerate(copies):
        build = tmp_path / f"cuda-{i}" / ("b" * (i + 1))
        _run("cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", *args, env=env)
        _run("cmake", "--build", build, "--parallel", "2", env=env)
        libs.append(build / "kernel" / f"libmok.so.{VERSION}")
    _assert_identical(*libs)


def test_wheel(copies, env, cccl_dir):
    pytest.importorskip("scikit_build_core", reason="the wheel is built with this Python: needs scikit-build-core")
    pytest.importorskip("nanobind", reason="the wheel is built with this Python: needs nanobind")
    wheels = []
    for src in copies:
        out = src.parent / "dist"
        _run(
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            out,
            src / "python",
            f"-Cbuild-dir={src.parent / 'build-wheel'}",
            f"-Ccmake.define.MOK_CCCL_INCLUDE_DIR={cccl_dir}",
            env={**env, "MOK_ENABLE_CUDA": "OFF"},
        )
        (wheel,) = out.glob("mok-*.whl")
        wheels.append(wheel)
    _assert_identical(*wheels)
