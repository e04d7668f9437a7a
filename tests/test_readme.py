"""The README's two set-up commands are the ones CI and nox run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md must open with a bash block holding the two set-up commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_two_commands():
    main_job, tests = readme_commands()
    assert "nox -s demo" in main_job
    assert "nox -s tests-3.11" in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci, ".ci/run must run the README's test command verbatim"


def test_nox_sessions_named_in_readme_exist():
    noxfile = (ROOT / "noxfile.py").read_text() + "".join(
        p.read_text() for p in (ROOT / "tools").glob("nox_*.py"))
    for name in re.findall(r"nox -s ([\w\- .]+)", "\n".join(readme_commands())):
        for session in name.split():
            base = session.split("-")[0]
            assert re.search(rf"def {base}\(", noxfile), f"nox session {session} not defined"
