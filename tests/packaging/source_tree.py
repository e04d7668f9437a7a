"""The checkout as a build sees it: its files copied elsewhere, and the time of its last commit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE_DIR = REPO / "recipe"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def copy(dest: Path) -> Path:
    """Copy the tracked and the untracked-but-not-ignored files (the working tree, not HEAD) into `dest`."""
    for name in _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0"):
        src = REPO / name
        if name and src.is_file():  # a deleted but still tracked file is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def source_date_epoch() -> str:
    """SOURCE_DATE_EPOCH of a release build: the committer time of the last commit."""
    return _git("log", "-1", "--format=%ct").strip()
