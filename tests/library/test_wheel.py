"""The wheel builds in-tree (bundling libmok) and against an installed libmok, and each one imports."""

from __future__ import annotations

import os
import site
import sys
import zipfile
from pathlib import Path

import pytest
from buildutil import ROOT, run


def build_wheel(out: Path, env: dict[str, str]) -> Path:
    """A wheel from a build dir of its own (a reused one would carry the other mode's CMake cache)."""
    run(sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out,
        f"--config-settings=build-dir={out.parent / 'build'}", ROOT / "python", env={**os.environ, **env})
    (wheel,) = out.glob("mok-*.whl")
    return wheel


def import_in_fresh_env(wheel: Path, tmp: Path, ld_path: str = "") -> str:
    """Install `wheel` into a new venv and import it from outside the source tree. The venv sees this
    interpreter's packages (torch) after its own, through a .pth file, so the wheel's mok comes first."""
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "pip", "install", "--no-deps", "--no-index", "--quiet", wheel)
    (own,) = (venv / "lib").glob("python3.*/site-packages")
    (own / "parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")  # after pip: it must not see them
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MOK_NO_EXTENSION")}
    if ld_path:
        env["LD_LIBRARY_PATH"] = ld_path
    code = "import mok; print(mok.__version__, [b.name for b in mok.backends() if b.available], mok.__file__)"
    out = run(venv / "bin" / "python", "-c", code, cwd=tmp, env=env).stdout
    assert str(venv) in out, f"imported a mok other than the wheel's: {out}"
    return out


@pytest.mark.parametrize("mode", ["bundled", "installed"])
def test_wheel(mode, prefix, cuda_bin, tmp_path):
    # The bundling is tested here; the CUTLASS GEMM units (minutes each) are compiled and checked once, in the
    # libmok that test_library reads.
    env = {"CUDACXX": str(cuda_bin / "nvcc"), "MOK_BUILD_GEMMS": "OFF"}
    if mode == "installed":
        env.update(MOK_USE_INSTALLED="ON", CMAKE_PREFIX_PATH=str(prefix))
    wheel = build_wheel(tmp_path / "dist", env)
    names = zipfile.ZipFile(wheel).namelist()
    bundled = [n for n in names if Path(n).name.startswith("libmok.so")]
    if mode == "bundled":
        assert bundled == ["mok/libmok.so.0.5"], names  # named by its SONAME, which carries the minor while major is 0
    else:
        assert not bundled, f"a wheel built against an installed libmok must not carry one: {bundled}"
    out = import_in_fresh_env(wheel, tmp_path, "" if mode == "bundled" else str(prefix / "lib"))
    assert out.startswith("0.5.0 ") and "'host'" in out, out
