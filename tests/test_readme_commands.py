"""The README's test commands and ``.ci/run`` say the same thing, so CI runs what a new user runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_block(after: str) -> list[str]:
    """The lines of the first ```bash block that follows the paragraph starting with ``after``."""
    text = (REPO / "README.md").read_text()
    start = text.index(after)
    match = re.compile(r"```bash\n(.*?)```", re.S).search(text, start)
    assert match, f"no bash block after {after!r} in README.md"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readme_test_commands():
    commands = readme_block("Tests —")
    assert commands[0].startswith("python3 -m venv "), commands  # a fresh venv, as a new user makes it
    assert any("python3 -m pytest" in line for line in commands), commands
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    # the README's lines, verbatim and in order, are the tail of .ci/run (after the shell's own set-up)
    assert ci[-len(commands) :] == commands, (ci, commands)
