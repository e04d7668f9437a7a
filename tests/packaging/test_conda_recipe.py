"""The real recipe (recipe/recipe.yaml with recipe/variants.yaml) renders for every variant, and each output
carries the requirements, pins, run_exports and arch flags that conda-forge's CUDA conventions ask for.
Rendering needs no channel; building the real recipe does (CI with network, see docs/packaging.md)."""

import base64
import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

rb = pytest.importorskip("rattler_build", reason="py-rattler-build missing: pip install py-rattler-build==0.73.0")

from conda_tools import RECIPE_DIR, render  # noqa: E402

PYTHONS = ["3.11", "3.12", "3.13"]
CUDA_ARCHS = "100a;103a"


@pytest.fixture(scope="module")
def rendered():
    return render()


def _outputs(rendered, name):
    return [v.recipe for v in rendered if v.recipe.package.name == name]


def test_every_variant_renders(rendered):
    pythons = sorted(r.used_variant["python"] for r in _outputs(rendered, "mok"))
    assert pythons == PYTHONS
    builds = {r.build.string for r in _outputs(rendered, "mok")}
    assert {b[:5] for b in builds} == {"py311", "py312", "py313"}
    # The C++ packages do not depend on Python: one build each, whatever the Python variant.
    for name in ("libmok", "libmok-dev"):
        assert len({r.build.string for r in _outputs(rendered, name)}) == 1, name


def test_one_staged_build_with_cuda_13_toolchain(rendered):
    (staging,) = {s.name: s for r in _outputs(rendered, "libmok") for s in r.staging_caches}.values()
    req = staging.requirements
    assert "cuda-nvcc_linux-64 13.0.*" in req.build  # compiler('cuda') at cuda_compiler_version 13.0
    assert {"gcc_linux-64 14.*", "gxx_linux-64 14.*", "sysroot_linux-64 2.28.*", "cmake >=3.25"} <= set(req.build)
    assert "cuda-version ==13.0" in req.host
    assert "cuda-cudart-dev" in req.host
    assert staging.build.script["env"]["MOK_CUDA_ARCHITECTURES"] == CUDA_ARCHS
    assert staging.build.script["file"] == "build_libmok.sh"


def test_build_script_passes_the_arch_list_explicitly():
    # conda's nvcc activation exports CUDAARCHS; an explicit CMAKE_CUDA_ARCHITECTURES overrides it.
    script = (RECIPE_DIR / "build_libmok.sh").read_text()
    for flag in ("CMAKE_CUDA_ARCHITECTURES", "MOK_CUDA_ARCHITECTURES"):
        assert re.search(rf'-D{flag}="\$MOK_CUDA_ARCHITECTURES"', script), flag
    assert "-DCMAKE_BUILD_TYPE=Release" in script


def test_libmok_pins_itself_and_needs_a_cuda_13_driver(rendered):
    for r in _outputs(rendered, "libmok"):
        req = r.requirements.to_dict()
        (pin,) = req["run_exports"]["weak"]
        # the SONAME carries the minor while the major is 0 (libmok.so.0.5): dependents are pinned to it
        assert pin["pin_subpackage"]["name"] == "libmok" and pin["pin_subpackage"]["upper_bound"] == "x.x"
        assert "__cuda >=13" in req["run_constraints"]
        assert "cuda-version >=13.0,<14" in req["run_constraints"]
        assert r.build.to_dict()["files"] == ["lib/libmok.so.*", "bin/mok_selftest"]  # the self-test comes along


def test_libmok_dev_carries_headers_and_consumer_test(rendered):
    for r in _outputs(rendered, "libmok-dev"):
        req = r.requirements.to_dict()
        assert req["run"] == [{"pin_subpackage": {"name": "libmok", "exact": True}}]
        pin = req["run_exports"]["weak"][0]["pin_subpackage"]
        assert pin["name"] == "libmok" and pin["upper_bound"] == "x.x"  # the SONAME's minor, as libmok's own
        files = r.build.to_dict()["files"]
        assert {"include/mok/**", "lib/libmok.so", "lib/cmake/mok/**", "lib/pkgconfig/mok.pc"} == set(files)
        (test,) = r.to_dict()["tests"]
        assert test["files"]["source"] == ["examples/cpp/"]
        assert "test_consumer.sh examples/cpp" in test["script"]


def test_mok_builds_against_libmok_dev_per_python(rendered):
    for r in _outputs(rendered, "mok"):
        host = r.requirements.host
        assert {"pin_subpackage": {"name": "libmok-dev", "exact": True}} in host
        assert "python" in host and "cuda-version ==13.0" in host
        assert "python" in r.requirements.run
        (test,) = r.to_dict()["tests"]
        assert test["python"]["imports"] == ["mok"]


def test_mok_links_the_installed_libmok():
    script = (RECIPE_DIR / "build_mok.sh").read_text()
    assert "-Ccmake.define.MOK_USE_INSTALLED=ON" in script


def test_cutlass_headers_come_from_the_pinned_wheel(tmp_path):
    """The recipe's second source is nvidia-cutlass's wheel, kept whole: what its URL serves (`nox -s conda` fetches
    it) has the recipe's sha256 and name, the version the tests' CUTLASS pin in noxfile.py names, and unpacks (cmake
    -E tar, as build_libmok.sh does) into the header tree the script names to CMake."""
    recipe = rb.Stage0Recipe.from_file(RECIPE_DIR / "recipe.yaml").to_dict()
    (cutlass,) = [s for s in recipe["source"] if "url" in s]
    name = cutlass["file_name"]
    (url,) = cutlass["url"] if isinstance(cutlass["url"], list) else [cutlass["url"]]
    assert url.endswith("/" + name) and cutlass["target_directory"] == "cutlass"
    script = (RECIPE_DIR / "build_libmok.sh").read_text()
    assert f'CUTLASS_WHEEL="$SRC_DIR/cutlass/{name}"' in script
    assert '-DMOK_CUTLASS_INCLUDE_DIR="$MOK_CUTLASS_INCLUDE_DIR"' in script
    if not os.environ.get("MOK_CUTLASS_WHEEL"):
        pytest.skip("MOK_CUTLASS_WHEEL unset: `nox -s conda` downloads the recipe's wheel and names it")
    wheel = Path(os.environ["MOK_CUTLASS_WHEEL"]).resolve()  # unpacked from another directory below
    assert Path(wheel).name == name
    pin = re.search(r'CUTLASS = "nvidia-cutlass==([0-9.]+)"', (RECIPE_DIR.parent / "noxfile.py").read_text()).group(1)
    assert name == f"nvidia_cutlass-{pin}-py3-none-any.whl"
    assert hashlib.sha256(Path(wheel).read_bytes()).hexdigest() == cutlass["sha256"]
    subprocess.run(["cmake", "-E", "tar", "xf", str(wheel)], cwd=tmp_path, check=True)
    include = tmp_path / "cutlass_library" / "source" / "include"
    assert (include / "cutlass" / "gemm" / "collective" / "collective_builder.hpp").is_file()
    assert f'MOK_CUTLASS_INCLUDE_DIR="$PWD/cutlass-wheel/{include.relative_to(tmp_path)}"' in script


def test_the_wheel_build_fetches_the_recipes_cutlass_wheel(tmp_path):
    """The pip wheel's build (MOK_FETCH_CUTLASS, on in pyproject.toml) downloads the very wheel the recipe and the Nix
    flake pin, checks its sha256, and unpacks its header tree; a file of another sha256 is refused by name and not
    kept. Served here from the conda session's download (a file:// URL): the session makes no second download."""
    recipe = rb.Stage0Recipe.from_file(RECIPE_DIR / "recipe.yaml").to_dict()
    (cutlass,) = [s for s in recipe["source"] if "url" in s]
    (url,) = cutlass["url"] if isinstance(cutlass["url"], list) else [cutlass["url"]]
    root = RECIPE_DIR.parent
    script = root / "cmake" / "MokFetchCutlass.cmake"
    pins = dict(re.findall(r'set\(MOK_CUTLASS_WHEEL_(URL|SHA256)\s+"([^"]+)"\)', script.read_text()))
    assert pins == {"URL": url, "SHA256": cutlass["sha256"]}
    nix = (root / "nix" / "libmok.nix").read_text()
    sri = "sha256-" + base64.b64encode(bytes.fromhex(cutlass["sha256"])).decode()
    assert f'url = "{url}";' in nix and f'hash = "{sri}";' in nix
    assert 'MOK_FETCH_CUTLASS = { env = "MOK_FETCH_CUTLASS", default = "ON" }' in \
        (root / "python" / "pyproject.toml").read_text()
    if not os.environ.get("MOK_CUTLASS_WHEEL"):
        pytest.skip("MOK_CUTLASS_WHEEL unset: `nox -s conda` downloads the recipe's wheel and names it")
    wheel = Path(os.environ["MOK_CUTLASS_WHEEL"]).resolve()

    def fetch(source: Path, into: Path):
        return subprocess.run(["cmake", f"-DMOK_CUTLASS_FETCH_DIR={into}", f"-DMOK_CUTLASS_URL={source.as_uri()}",
                               "-P", str(script)], capture_output=True, text=True)

    done = fetch(wheel, tmp_path / "good")
    include = tmp_path / "good" / "cutlass_library" / "source" / "include"
    assert done.returncode == 0 and done.stderr.strip() == str(include), done.stderr
    assert (include / "cutlass" / "gemm" / "collective" / "collective_builder.hpp").is_file()
    assert not list((tmp_path / "good").glob("*.whl"))  # only the headers are kept
    other = tmp_path / "other.whl"
    other.write_bytes(wheel.read_bytes()[:-1])
    refused = fetch(other, tmp_path / "bad")
    assert refused.returncode != 0 and "not the pinned " + cutlass["sha256"][:16] in refused.stderr.replace("\n  ", " ")
    assert not (tmp_path / "bad" / "cutlass_library").exists() and not list((tmp_path / "bad").glob("*.whl"))
