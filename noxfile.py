"""Build and test matrix of libmok. `nox -l` lists the sessions; README.md says which to run.

The CUDA 13.0 toolchain comes from pinned PyPI wheels (tools/cuda_toolchain.py) unless CUDACXX names another
nvcc. Builds go under build/nox/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
BUILD = ROOT / "build" / "nox"
sys.path.insert(0, str(ROOT))
from tools.cuda_toolchain import toolchain_env  # noqa: E402

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests-3.11", "consumer", "lint"]

PYTHONS = ["3.11", "3.12", "3.13"]
TORCH = "torch==2.13.0"  # a CPU wheel of this release lies on the developers' and CI's disk for Python 3.11
BUILD_DEPS = ("scikit-build-core==0.11.6", "nanobind==2.9.2", "cmake==3.31.6", "ninja==1.13.0")
TEST_DEPS = ("pytest==8.4.2", "numpy==2.3.5")
# HuggingFace transformers, for tests/python/test_hf_*.py (mok against HF's own MoE blocks, mok.integrations).
TRANSFORMERS = "transformers==5.24.0"
# The PNG plots of python -m mok.tune --plots and python -m mok.bench --plot (tests/python/test_tune.py draws them).
MATPLOTLIB = "matplotlib==3.11.2"
# CUTLASS/CuTe C++ headers for tests/cpp/test_sf_layout_cute (core's device layouts against CuTe on the host).
# Installed --no-deps: only the headers are used, not the Python package's cuda-python/scipy dependencies.
CUTLASS = "nvidia-cutlass==4.2.0.0"
ARCHS = {"gpus": "90a;100a;103a", "blackwell": "100a;103a", "sm100a": "100a", "host": ""}


def cuda_env(session: nox.Session) -> dict[str, str]:
    """Environment that selects the pinned toolchain (or the caller's CUDACXX)."""
    env = toolchain_env(ROOT)
    session.log(f"CUDA compiler: {env['CUDACXX']}")
    return env


def cmake_build(session: nox.Session, name: str, build_type: str, archs: str, *extra: str) -> Path:
    """Configure, build and install libmok; returns the install prefix."""
    build, prefix = BUILD / name, BUILD / name / "install"
    # Explicit ON: a CI build for GPUs fails when nvcc is missing instead of turning host-only (AUTO's default).
    cuda = ["-DMOK_ENABLE_CUDA=OFF"] if not archs else ["-DMOK_ENABLE_CUDA=ON", f"-DMOK_CUDA_ARCHITECTURES={archs}"]
    session.run("cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", f"-DCMAKE_BUILD_TYPE={build_type}",
                f"-DCMAKE_INSTALL_PREFIX={prefix}", *cuda, *extra, external=True)
    session.run("cmake", "--build", str(build), external=True)
    session.run("cmake", "--install", str(build), external=True)
    return prefix


@nox.session(python="3.11")
@nox.parametrize("build_type", ["Release", "Debug"])
@nox.parametrize("archs", list(ARCHS))
def build(session: nox.Session, build_type: str, archs: str) -> None:
    """Configure, build and install libmok for one build type and arch list."""
    session.install(*BUILD_DEPS)
    session.env.update(cuda_env(session))
    prefix = cmake_build(session, f"build-{build_type}-{archs}", build_type, ARCHS[archs])
    session.log(f"installed into {prefix}")


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole pytest suite (C++ CTest suite included) against a freshly built libmok and wheel."""
    session.install(*BUILD_DEPS, *TEST_DEPS, TORCH, TRANSFORMERS, MATPLOTLIB)
    session.install("--no-deps", CUTLASS)
    session.env.update(cuda_env(session))
    prefix = cmake_build(session, "tests-libmok", "Release", ARCHS["gpus"], "-DMOK_BUILD_TESTS=ON")
    # The package against the libmok just built (test_wheel.py builds the bundling wheel too).
    session.install("--no-build-isolation", "--no-deps", str(ROOT / "python"),
                    env={"MOK_USE_INSTALLED": "ON", "CMAKE_PREFIX_PATH": str(prefix)})
    session.env.update({"MOK_PREFIX": str(prefix), "MOK_BUILD_DIR": str(BUILD / "tests-libmok")})
    # tests/packaging runs in the conda, nix and repro sessions, which install its tools.
    session.run("pytest", "-ra", *(session.posargs or ["tests", "--ignore=tests/packaging"]))


@nox.session(python="3.11")
def consumer(session: nox.Session) -> None:
    """The C++ example against the installed package, through CMake and through pkg-config."""
    session.install(*BUILD_DEPS)
    session.env.update(cuda_env(session))
    prefix = cmake_build(session, "consumer-libmok", "Release", ARCHS["sm100a"])
    out = BUILD / "consumer"
    session.run("cmake", "-S", str(ROOT / "examples" / "cpp"), "-B", str(out), "-G", "Ninja",
                f"-DCMAKE_PREFIX_PATH={prefix}", external=True)
    session.run("cmake", "--build", str(out), external=True)
    session.run(str(out / "mok_consumer"), external=True)
    env = {"PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    session.run("make", "-C", str(ROOT / "examples" / "cpp"), f"O={out}", env=env, external=True)
    session.run(str(out / "mok_consumer_pc"), external=True)
    # README.md's one-liner as a user types it: the program finds libmok.so.0.5 through mok.pc's rpath alone.
    main, line = ROOT / "examples" / "cpp" / "main.cpp", out / "mok_consumer_line"
    session.run("sh", "-c", f"c++ {main} -o {line} $(pkg-config --cflags --libs mok)", env=env, external=True)
    session.run(str(line), env={"LD_LIBRARY_PATH": None}, external=True)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff over Python, clang-format over C/C++/CUDA."""
    session.install("ruff==0.14.6", "clang-format==21.1.6")
    session.run("ruff", "check", "python", "tests", "tools", "noxfile.py")
    sources = [str(p) for d in ("kernel", "python/src", "examples", "tests/cpp", "tests/fuzz")
               for p in sorted((ROOT / d).rglob("*")) if p.suffix in {".c", ".h", ".hpp", ".cpp", ".cu", ".cuh"}]
    session.run("clang-format", "--dry-run", "--Werror", *sources)


@nox.session(python="3.11")
def fuzz(session: nox.Session) -> None:
    """The libFuzzer target over the C ABI for longer than the test suite's minute: 15 minutes, or posargs seconds.

    Needs clang-14 with libFuzzer (Debian: clang-14 libclang-rt-14-dev llvm-14); docs/testing.md says more.
    """
    session.install(*BUILD_DEPS, *TEST_DEPS)
    session.env.update(cuda_env(session))
    seconds = session.posargs[0] if session.posargs else "900"
    session.env.update({"MOK_FUZZ_SECONDS": seconds, "MOK_REQUIRE_FUZZ": "1"})
    session.run("pytest", "-ra", "-s", "tests/library/test_fuzz.py")


def run_module(session: nox.Session, module: str, *extra: str) -> None:
    """The mok package built from this tree, then `python -m <module>` with the session's posargs."""
    session.install(*BUILD_DEPS, TORCH, "numpy==2.3.5", *extra)
    session.env.update(cuda_env(session))
    # Offline, as every session but conda: without nvidia-cutlass here the CUDA device code is built without its
    # grouped GEMMs (minutes of nvcc each), instead of pyproject.toml's download of their headers.
    session.env["MOK_FETCH_CUTLASS"] = "OFF"
    session.install("--no-build-isolation", "--no-deps", str(ROOT / "python"))
    session.run("python", "-m", module, *session.posargs)


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """The main job: a real MoE layer forward and backward (host executor without a GPU)."""
    run_module(session, "mok.demo")


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """The layer's forward and backward per CPU backend, side by side (docs/performance.md); posargs go to it."""
    run_module(session, "mok.bench", MATPLOTLIB)


@nox.session(python="3.11")
def tune(session: nox.Session) -> None:
    """mok.perf's predictions and the autotuner (docs/performance.md); `nox -s tune -- --plots docs/images`."""
    run_module(session, "mok.tune", MATPLOTLIB)


if (ROOT / "tools" / "nox_packaging.py").exists():  # the packaging sessions: conda, nix, repro
    import tools.nox_packaging  # noqa: F401
