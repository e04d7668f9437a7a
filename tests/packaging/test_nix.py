"""The Nix flake (nix/flake.nix, re-exported by the root flake.nix): every .nix file parses; both flakes
evaluate with nixpkgs overridden by nix_fixture/ (exactly the attributes the flake uses) and pass
`nix flake check --no-build`; the derivations carry the CUDA capabilities, CMake flags and outputs.

Needs the real nixpkgs, so runs only in the internal CI with network (docs/packaging.md): fetching the
pinned nixpkgs (which verifies flake.lock's narHash), `nix build .#libmok .#mok`, `nix flake check`."""

import base64
import json
import re

import nix_tools
import pytest
from source_tree import REPO

pytestmark = pytest.mark.skipif(not nix_tools.available(), reason="nix not installed (apt-get install -y nix-bin)")

NIX_FILES = sorted([*REPO.glob("nix/*.nix"), REPO / "flake.nix", *nix_tools.FIXTURE.glob("*.nix")])
CUDA_ARCHS = "100a;103a"

# What the tests read from the evaluated packages, in one evaluation.
SUMMARY = """pkgs: {
  libmok = {
    inherit (pkgs.libmok) outputs cmakeFlags doCheck fixtureStdenv preConfigure;
    inputs = map (d: d.name) (pkgs.libmok.nativeBuildInputs ++ pkgs.libmok.buildInputs);
    flags = pkgs.libmok.cudaPackages.flags;
    cuda = pkgs.libmok.cudaPackages.cudaMajorMinorVersion;
  };
  mok = {
    inherit (pkgs.mok) MOK_USE_INSTALLED pythonImportsCheck fixtureStdenv dontUseCmakeConfigure;
    buildInputs = map (d: d.name) pkgs.mok.buildInputs;
    dependencies = map (d: d.name) pkgs.mok.dependencies;
  };
  default = pkgs.default.name;
}"""


@pytest.fixture(scope="module")
def nix(tmp_path_factory):
    return nix_tools.Nix(tmp_path_factory.mktemp("nix"))


@pytest.mark.parametrize("path", NIX_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_parses(path):
    proc = nix_tools.parse(path)
    assert proc.returncode == 0, proc.stderr


def test_both_flakes_pin_the_same_nixpkgs():
    lock_files = [d / "flake.lock" for d in nix_tools.FLAKES.values()]
    locks = [json.loads(f.read_text())["nodes"]["nixpkgs"]["locked"] for f in lock_files]
    assert locks[0] == locks[1]
    assert locks[0]["type"] == "github" and locks[0]["narHash"].startswith("sha256-")
    for d in nix_tools.FLAKES.values():
        (url,) = re.findall(r'inputs\.nixpkgs\.url = "([^"]+)"', (d / "flake.nix").read_text())
        assert url == f"github:NixOS/nixpkgs/{locks[0]['rev']}", d


@pytest.mark.parametrize("name", nix_tools.FLAKES)
def test_flake_check_no_build(nix, name):
    nix.run("flake", "check", "--no-build", str(nix_tools.FLAKES[name]))


@pytest.fixture(scope="module", params=list(nix_tools.FLAKES))
def summary(nix, request):
    return nix.eval(nix_tools.FLAKES[request.param], f"packages.{nix_tools.SYSTEM}", SUMMARY)


def test_libmok_is_cuda_13_for_blackwell_only(summary):
    lib = summary["libmok"]
    assert lib["cuda"] == "13.0"
    assert lib["flags"]["cudaCapabilities"] == ["10.0a", "10.3a"]
    assert lib["flags"]["cudaForwardCompat"] is False
    assert f"-DCMAKE_CUDA_ARCHITECTURES:STRING={CUDA_ARCHS}" in lib["cmakeFlags"]
    assert f"-DMOK_CUDA_ARCHITECTURES:STRING={CUDA_ARCHS}" in lib["cmakeFlags"]
    assert "-DMOK_ENABLE_CUDA:BOOL=TRUE" in lib["cmakeFlags"]


def test_libmok_derivation_shape(summary):
    lib = summary["libmok"]
    assert lib["outputs"] == ["out", "dev"]
    assert lib["fixtureStdenv"] == "cudaPackages.backendStdenv"
    assert lib["doCheck"] is True and "-DMOK_BUILD_TESTS:BOOL=TRUE" in lib["cmakeFlags"]
    assert "auto-add-driver-runpath-hook-fixture" in lib["inputs"]
    assert "cuda_nvcc-13.0-fixture" in lib["inputs"]
    assert summary["default"] == "libmok-0.5.0"


def test_libmok_takes_cutlass_from_the_recipes_pinned_wheel(summary):
    """The same wheel as the conda recipe (its url and sha256, as an SRI hash), unpacked before CMake and named to it:
    without CUTLASS's headers libmok would carry no cuda executor."""
    recipe = (REPO / "recipe" / "recipe.yaml").read_text()
    url = re.search(r"- url: (\S+)", recipe).group(1)
    sha256 = re.search(r"sha256: ([0-9a-f]{64})", recipe).group(1)
    nix_file = (REPO / "nix" / "libmok.nix").read_text()
    assert f'url = "{url}";' in nix_file
    assert f'hash = "sha256-{base64.b64encode(bytes.fromhex(sha256)).decode()}";' in nix_file
    script = summary["libmok"]["preConfigure"]
    assert "cmake -E tar xf /nix/store/" in script and "fetchurl-fixture" in script
    assert '-DMOK_CUTLASS_INCLUDE_DIR=$PWD/cutlass-wheel/cutlass_library/source/include' in script


def test_mok_builds_against_libmok(summary):
    mok = summary["mok"]
    assert mok["fixtureStdenv"] == "buildPythonPackage"
    assert mok["MOK_USE_INSTALLED"] == "ON"
    assert mok["buildInputs"] == ["libmok-0.5.0"]
    assert {"torch-fixture", "numpy-fixture"} <= set(mok["dependencies"])
    assert mok["pythonImportsCheck"] == ["mok"]


def test_dev_shell_and_checks(nix):
    system = nix_tools.SYSTEM
    checks = nix.eval(REPO, f"checks.{system}", "builtins.attrNames")
    assert checks == ["consumer", "libmok", "python-tests"]
    shell = nix.eval(REPO, f"devShells.{system}.default", "s: map (d: d.name) s.packages")
    assert {"cmake-fixture", "ninja-fixture", "cuda_nvcc-13.0-fixture", "python3-env"} <= set(shell)
