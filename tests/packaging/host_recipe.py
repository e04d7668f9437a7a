"""The test-only variant of recipe/recipe.yaml: the same outputs, scripts, file splits, run_exports and
package tests, built with this machine's own toolchain so that it needs no conda channel.

It differs from the real recipe in exactly these ways:
- every requirement that would come from a channel is dropped (compilers, cmake, CUDA packages,
  python, ...); the pins between the recipe's own outputs (pin_subpackage) stay;
- libmok is built host-only (MOK_ENABLE_CUDA=OFF) with CCCL from `cccl_dir`: the CUDA build is
  covered by the reproducibility test, and two CUDA builds would cost CI minutes for nothing new;
- `python` is the interpreter that runs the tests (it needs scikit-build-core, nanobind and torch),
  and the `python: imports` package test becomes the same import run by that interpreter.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import rattler_build as rb

REQUIREMENT_KINDS = ("build", "host", "run")


def _keep(spec: object) -> bool:
    # A pin between the recipe's own outputs resolves from the output dir; all else needs a channel.
    return isinstance(spec, str) and "pin_subpackage" in spec


def _strip_requirements(section: dict) -> None:
    requirements = section.get("requirements") or {}
    for kind in REQUIREMENT_KINDS:
        if kind in requirements:
            requirements[kind] = [s for s in requirements[kind] if _keep(s)]


def _set_script_env(output: dict, env: dict[str, str]) -> None:
    script = output.setdefault("build", {}).setdefault("script", {})
    script.setdefault("env", {}).update(env)


def _import_test(imports: list[str], python: str) -> dict:
    site = f"$PREFIX/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    lines = [f'PYTHONPATH="{site}" "{python}" -c "import {name}"' for name in imports]
    return {"script": lines}


def _host_tests(tests: list[dict], python: str) -> list[dict]:
    out = []
    for test in tests:
        if "python" in test:
            out.append(_import_test(test["python"]["imports"], python))
            continue
        _strip_requirements(test)
        out.append(test)
    return out


def write(recipe_dir: Path, source_dir: Path, dest: Path, cccl_dir: Path, python: str = sys.executable) -> Path:
    """Write the host variant of `recipe_dir`/recipe.yaml (building `source_dir`) into `dest`; return its path."""
    recipe = rb.Stage0Recipe.from_file(recipe_dir / "recipe.yaml").to_dict()
    recipe["source"] = [{"path": str(source_dir)}]
    for output in recipe["outputs"]:
        _strip_requirements(output)
        if "tests" in output:
            output["tests"] = _host_tests(output["tests"], python)
        if "staging" in output:
            _set_script_env(output, {"MOK_ENABLE_CUDA": "OFF", "MOK_CCCL_INCLUDE_DIR": str(cccl_dir)})
        elif output["package"]["name"] == "mok":
            _set_script_env(output, {"PYTHON": python})
    dest.mkdir(parents=True, exist_ok=True)
    for script in recipe_dir.glob("*.sh"):
        shutil.copy2(script, dest / script.name)
    return rb.Stage0Recipe.from_dict(recipe, recipe_dir=dest).recipe_path
