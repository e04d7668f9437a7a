"""The test-only variant of the recipe (host_recipe.py: host toolchain, no channel requirements) builds all
three outputs with their package tests, rebuilds byte for byte, and installs from an indexed local channel
into a fresh prefix where the C++ example builds and runs."""

import contextlib
import os
import subprocess

import pytest

rb = pytest.importorskip("rattler_build", reason="py-rattler-build missing: pip install py-rattler-build==0.73.0")
pytest.importorskip("scikit_build_core", reason="the mok output is built with this Python: needs scikit-build-core")
pytest.importorskip("nanobind", reason="the mok output is built with this Python: needs nanobind")
pytest.importorskip("torch", reason="the mok package test imports mok with this Python: needs torch")

import conda_tools  # noqa: E402
import host_recipe  # noqa: E402
import source_tree  # noqa: E402

NAMES = ("libmok", "libmok-dev", "mok")


@pytest.fixture(scope="module")
def packages(tmp_path_factory, cccl_dir):
    """name -> .conda file of the host variant, built once (package tests run as part of the build)."""
    base = tmp_path_factory.mktemp("conda")
    src = source_tree.copy(base / "src")
    recipe = host_recipe.write(conda_tools.RECIPE_DIR, src, base / "recipe", cccl_dir)
    built = conda_tools.build(recipe, base / "out")
    return {rb.Package.from_file(p).name: p for p in built}


def test_three_outputs_built(packages):
    assert sorted(packages) == sorted(NAMES)


def test_outputs_split_the_install(packages):
    lib, dev, py = (set(rb.Package.from_file(packages[n]).files) for n in NAMES)
    # the SONAME carries the minor while major is 0; the self-test comes with the library it tests
    assert lib == {"lib/libmok.so.0.5", "lib/libmok.so.0.5.0", "bin/mok_selftest"}
    assert {
        "include/mok/mok.h",
        "include/mok/mok_version.h",
        "lib/libmok.so",
        "lib/cmake/mok/mokConfig.cmake",
        "lib/pkgconfig/mok.pc",
    } <= dev
    assert not any(f.startswith("lib/libmok.so.") for f in dev)
    assert any(f.endswith(".so") and "/mok/_mok" in f for f in py)
    assert not any("libmok.so" in f for f in py), "mok must link libmok from libmok, not bundle a copy"
    assert not any(f.endswith("direct_url.json") for f in py), "a build path leaked into the package"


def test_pins_between_outputs(packages):
    from rattler.package import RunExportsJson

    lib, dev, py = (rb.Package.from_file(packages[n]) for n in NAMES)
    assert RunExportsJson.from_package_archive(packages["libmok"]).weak == ["libmok >=0.5.0,<0.6.0a0"]
    assert "__cuda >=13" in lib.constrains
    assert dev.depends == [f"libmok ==0.5.0 {lib.build_string}"]
    assert "libmok >=0.5.0,<0.6.0a0" in py.depends  # libmok-dev's run_exports


@pytest.mark.parametrize("name", NAMES)
def test_rebuild_is_identical(packages, name, tmp_path):
    with contextlib.chdir(tmp_path):  # rattler-build leaves its staging_* caches in the working directory
        result = rb.Package.from_file(packages[name]).rebuild(test="skip", output_dir=tmp_path)
    assert result.is_identical, f"{name}: {result.original_sha256} != {result.rebuilt_sha256}"


def test_cpp_example_builds_from_installed_channel(packages, tmp_path):
    channel = conda_tools.make_channel(list(packages.values()), tmp_path / "channel")
    prefix = tmp_path / "prefix"
    installed = conda_tools.install(channel, ["libmok-dev"], prefix, tmp_path / "pkgs")
    assert installed == ["libmok", "libmok-dev"]
    example = tmp_path / "cpp"
    subprocess.run(["cp", "-r", str(source_tree.REPO / "examples" / "cpp"), str(example)], check=True)
    run = subprocess.run(
        ["bash", str(conda_tools.RECIPE_DIR / "test_consumer.sh"), str(example)],
        cwd=tmp_path,
        env={"PREFIX": str(prefix), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("libmok 0.5.0 (header 0.5.0)") == 2  # CMake and pkg-config builds both ran
