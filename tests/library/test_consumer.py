"""A C++ trainer's program builds and runs against the installed libmok, outside the source tree."""

from __future__ import annotations

import os
import shutil

import pytest
from buildutil import ROOT, have, run


def check_output(text: str) -> None:
    assert "libmok 0.5.0 (header 0.5.0)" in text, text
    assert "executor host     compiled=1 usable=1" in text, text
    assert "CUDA architectures: 90a;100a;103a" in text, text
    # The fused executor is compiled with a Blackwell target and not usable without a GPU; the portable one is not
    # written (docs/c-api.md, Executors).
    assert "executor sm100    compiled=1 usable=0" in text, text
    assert "executor portable compiled=0 usable=0  mokNotCompiled" in text, text
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
    check_output(run(tmp_path / "mok_consumer_pc", env=without_library_path()).stdout)


def without_library_path() -> dict[str, str]:
    """The environment without LD_LIBRARY_PATH: a consumer finds libmok.so.0.5 through its own rpath or not at all."""
    return {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}


@pytest.mark.skipif(not have("pkg-config"), reason="pkg-config is not installed")
def test_readme_pkg_config_line_runs(host_only_prefix, tmp_path):
    """README.md's one-liner, as written there, gives a program that finds libmok.so.0.5 at run time: mok.pc's Libs
    carry the rpath (without it the loader fails with "libmok.so.0.5: cannot open shared object file")."""
    readme = (ROOT / "README.md").read_text()
    line = "c++ main.cpp $(pkg-config --cflags --libs mok)"
    assert f"\n{line}\n" in readme, "README.md's pkg-config line changed: update this test with it"
    shutil.copy(ROOT / "examples" / "cpp" / "main.cpp", tmp_path)
    env = {**without_library_path(), "PKG_CONFIG_PATH": str(host_only_prefix / "lib" / "pkgconfig")}
    run("sh", "-c", line, cwd=tmp_path, env=env)
    text = run(tmp_path / "a.out", env=without_library_path()).stdout
    assert "executor host     compiled=1 usable=1" in text, text
    assert "every result matches the float64 reference" in text, text


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
