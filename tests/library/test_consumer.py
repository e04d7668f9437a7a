"""A C++ trainer's program builds and runs against the installed libmok, outside the source tree."""

from __future__ import annotations

import os
import shutil

import pytest
from buildutil import ROOT, have, run


def check_output(text: str) -> None:
    assert "libmok 0.1.0 (header 0.1.0)" in text, text
    assert "executor host     compiled=1 usable=1" in text, text
    assert "CUDA architectures: 100a;103a" in text, text
    # No GPU executor runs a layer yet, whatever device code is built in (docs/c-api.md, Executors).
    assert "executor sm100    compiled=0 usable=0  mokNotCompiled" in text, text
    # The two-rank training step on the host executor, checked against the example's float64 reference.
    assert "every result matches the float64 reference" in text, text


def test_cmake_find_package(prefix, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "examples" / "cpp", src)
    run("cmake", "-S", src, "-B", tmp_path / "b", "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}")
    run("cmake", "--build", tmp_path / "b")
    check_output(run(tmp_path / "b" / "mok_consumer").stdout)


@pytest.mark.skipif(not have("pkg-config"), reason="pkg-config is not installed")
def test_pkg_config(prefix, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "examples" / "cpp", src)
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    run("make", "-C", src, f"O={tmp_path}", env=env)
    check_output(run(tmp_path / "mok_consumer_pc").stdout)


def test_host_only_build(host_only_prefix, tmp_path):
    """MOK_ENABLE_CUDA=OFF: the C ABI and the host executor, and the GPU executor reported as not compiled."""
    run("cmake", "-S", ROOT / "examples" / "cpp", "-B", tmp_path / "b", "-G", "Ninja",
        f"-DCMAKE_PREFIX_PATH={host_only_prefix}")
    run("cmake", "--build", tmp_path / "b")
    text = run(tmp_path / "b" / "mok_consumer").stdout
    assert "executor host     compiled=1 usable=1" in text, text
    assert "CUDA architectures: (none)" in text, text
    assert "executor sm100    compiled=0 usable=0  mokNotCompiled" in text, text
    assert "every result matches the float64 reference" in text, text
