"""Running Nix (Debian's nix-bin 2.8 is enough) offline, against the test fixture in place of nixpkgs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from source_tree import REPO

FIXTURE = Path(__file__).parent / "nix_fixture"
FLAKES = {"root": REPO, "nix": REPO / "nix"}
SYSTEM = "x86_64-linux"


def available() -> bool:
    return shutil.which("nix") is not None and shutil.which("nix-instantiate") is not None


class Nix:
    """nix with its own store, home and caches under `state`, and nixpkgs overridden by the fixture."""

    def __init__(self, state: Path):
        for d in ("home", "cache", "tmp"):
            (state / d).mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(state / "home"),
            "XDG_CACHE_HOME": str(state / "cache"),
            "TMPDIR": str(state / "tmp"),
        }
        self.store = str(state / "store")

    def run(self, *args: str) -> str:
        cmd = [
            "nix",
            "--extra-experimental-features",
            "nix-command flakes",
            "--store",
            self.store,
            *args,
            "--override-input",
            "nixpkgs",
            f"path:{FIXTURE}",
            "--no-write-lock-file",
        ]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
        return proc.stdout

    def eval(self, flake: Path, attr: str, apply: str | None = None):
        extra = ["--apply", apply] if apply else []
        return json.loads(self.run("eval", "--json", f"{flake}#{attr}", *extra))


def parse(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nix-instantiate", "--parse", str(path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    )
