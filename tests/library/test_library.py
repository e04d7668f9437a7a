"""libmok.so as built and installed: device code, exported symbols, layout, static cudart."""

from __future__ import annotations

import re

from buildutil import run


def test_cubins_for_every_blackwell_target(libmok, cuda_bin):
    listing = run(cuda_bin / "cuobjdump", "--list-elf", libmok).stdout
    archs = set(re.findall(r"\.(sm_\d+a?)\.cubin", listing))
    assert {"sm_100a", "sm_103a"} <= archs, listing


def test_only_mok_symbols_are_exported(libmok):
    out = run("nm", "-D", "--defined-only", libmok).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names, "libmok exports nothing"
    leaked = [n for n in names if not n.startswith("mok")]
    assert not leaked, f"symbols outside the C ABI are exported: {leaked[:20]}"
    assert "mokGetStatusString" in names and "mokGetVersion" in names


def test_soname_and_static_cudart(libmok):
    dynamic = run("readelf", "-d", libmok).stdout
    assert re.search(r"SONAME.*\[libmok\.so\.\d+\]", dynamic), dynamic
    needed = re.findall(r"NEEDED.*\[(.+?)\]", dynamic)
    assert not [n for n in needed if "cudart" in n or n.startswith("libcuda.")], needed


def test_install_layout(prefix):
    for rel in ("include/mok/mok.h", "include/mok/mok.hpp", "include/mok/mok_version.h",
                "lib/cmake/mok/mokConfig.cmake", "lib/cmake/mok/mokConfigVersion.cmake",
                "lib/cmake/mok/mokTargets.cmake", "lib/pkgconfig/mok.pc"):
        assert (prefix / rel).exists(), rel
