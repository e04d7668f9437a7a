"""libmok installed the way nixpkgs installs it, which the flake's builds need but only the internal CI can
run: absolute lib and include dirs in two outputs ($out, $dev), then the pkg-config and CMake files moved
to $dev by the multiple-outputs hook. The C++ example must build from $dev through CMake and pkg-config."""

import os
import shutil
import subprocess

import source_tree
from source_tree import RECIPE_DIR


def _run(*cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_cpp_example_builds_from_split_outputs(tmp_path, cccl_dir):
    out, dev, build = tmp_path / "out", tmp_path / "dev", tmp_path / "build"
    _run(
        "cmake",
        "-S",
        source_tree.REPO,
        "-B",
        build,
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DMOK_ENABLE_CUDA=OFF",
        f"-DMOK_CCCL_INCLUDE_DIR={cccl_dir}",
        f"-DCMAKE_INSTALL_PREFIX={out}",
        f"-DCMAKE_INSTALL_LIBDIR={out}/lib",
        f"-DCMAKE_INSTALL_INCLUDEDIR={dev}/include",
    )
    _run("cmake", "--build", build, "--parallel", "2")
    _run("cmake", "--install", build)
    for d in ("lib/pkgconfig", "lib/cmake"):
        shutil.move(out / d, dev / d)
    example = tmp_path / "cpp"
    shutil.copytree(source_tree.REPO / "examples" / "cpp", example)
    stdout = _run(
        "bash",
        RECIPE_DIR / "test_consumer.sh",
        example,
        cwd=tmp_path,
        env={"PREFIX": str(dev), "PATH": os.environ["PATH"]},
    )
    assert stdout.count("libmok 0.5.0 (header 0.5.0)") == 2  # the CMake and the pkg-config build both ran
