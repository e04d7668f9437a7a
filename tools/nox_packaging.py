"""The packaging sessions, registered by noxfile.py importing this module:

    nox -s conda    the conda recipe: renders for every variant; its host-toolchain variant builds, passes its
                    package tests, rebuilds byte for byte and installs from a local channel
    nox -s nix      the Nix flake: parses, evaluates against a nixpkgs fixture, `nix flake check --no-build`;
                    libmok installed in nixpkgs' split-output layout serves the C++ example
    nox -s repro    two release builds (libmok host-only and CUDA sm_100a, the wheel) are byte-identical

All run offline, but for the conda session's download of the CUTLASS wheel the recipe names (from PyPI). Nix comes
from the system (apt-get install -y nix-bin); without it `nix` skips, saying so.
docs/packaging.md describes the checks and what only the internal CI (with network) runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import nox

from tools.cuda_toolchain import toolchain_env

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests" / "packaging"

RATTLER = ("py-rattler-build==0.73.0", "py-rattler==0.28.0")
BUILD = ("scikit-build-core==0.11.6", "nanobind==2.9.2", "cmake==3.31.6", "ninja==1.13.0")
PYTEST = "pytest==8.4.2"
TORCH = "torch==2.13.0"  # `import mok`, the mok package's test, imports torch
DIFFOSCOPE = "diffoscope==332"


def _pytest(session: nox.Session, *files: str) -> None:
    session.run("pytest", "-ra", *(str(TESTS / f) for f in files), *session.posargs)


@nox.session(python="3.11")
def conda(session: nox.Session) -> None:
    """The conda recipe, offline: render of every variant; host-toolchain build, tests, rebuild, install."""
    session.install(*RATTLER, *BUILD, PYTEST, TORCH)
    session.env.update(toolchain_env(ROOT))
    # The CUTLASS wheel the real recipe names, fetched from its URL (the one download of this session), for
    # test_conda_recipe to hold the recipe's sha256 and file name to.
    url = re.search(r"- url: (\S+)", (ROOT / "recipe" / "recipe.yaml").read_text()).group(1)
    wheels = Path(session.create_tmp()).resolve() / "cutlass"  # absolute: the test unpacks it elsewhere
    session.run("python", "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels), url)
    (wheel,) = wheels.glob("nvidia_cutlass-*.whl")
    session.env["MOK_CUTLASS_WHEEL"] = str(wheel)
    _pytest(session, "test_conda_recipe.py", "test_conda_build.py")


@nox.session(python="3.11")
def nix(session: nox.Session) -> None:
    """The Nix flake, offline: parse, evaluation against a nixpkgs fixture, flake check; split-output install."""
    session.install(*BUILD, PYTEST)
    session.env.update(toolchain_env(ROOT))
    _pytest(session, "test_nix.py", "test_split_install.py")


@nox.session(python="3.11")
def repro(session: nox.Session) -> None:
    """Byte-identical release builds of libmok.so (host-only, CUDA sm_100a) and of the wheel."""
    session.install(*BUILD, PYTEST, DIFFOSCOPE)
    session.env.update(toolchain_env(ROOT))
    _pytest(session, "test_repro.py")
