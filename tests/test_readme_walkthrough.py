"""The README as a new user follows it: its Quickstart, then its command
section, typed in order in an empty directory.

A README example's output comment is a promise to that user, so each
comment that shows output is checked against what the commands really print
when run in the README's order (the embedded default file in the working
directory, as the Quickstart says). The commands are read from the README
itself, so an edit of either the commands or the comments is checked."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CHOOSERS = ("GDS_URL", "DATASTORE_EMULATOR_HOST", "DATASTORE_PROJECT_ID", "GOOGLE_CLOUD_PROJECT")


def section(title: str) -> str:
    """The text of the README section headed ``## title``."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert match, f"README.md has no section {title!r}"
    return match.group(1)


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def walkthrough() -> list[tuple[str, str]]:
    """(kind, code) in README order: the Quickstart's Python and shell, then
    the command section's lines up to the first one that shows JSON output
    (the later lines need a cloud project or run a server)."""
    quick = section("Quickstart")
    steps = [("python", blocks(quick, "python")[0])]
    steps += [("sh", line) for line in blocks(quick, "sh")[0].splitlines() if line.strip()]
    for line in blocks(section("The `gds-counter` command"), "sh")[0].splitlines():
        steps.append(("sh", line))
        if "--json" in line:
            break
    return steps


def run_in(directory: Path, kind: str, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in CHOOSERS}
    if kind == "python":
        argv = [sys.executable, "-c", code]
    else:
        command = code.split("#", 1)[0].strip()
        argv = [str(Path(sys.executable).with_name("gds-counter")), *shlex.split(command)[1:]]
    done = subprocess.run(argv, cwd=directory, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{code!r} exited {done.returncode}: {done.stderr}"
    return done.stdout


def test_the_readme_walkthrough_prints_what_its_comments_show(tmp_path):
    steps = walkthrough()
    json_lines = [code for kind, code in steps if "--json" in code]
    assert json_lines, "the command section shows no --json example"
    for kind, code in steps:
        out = run_in(tmp_path, kind, code)
        if kind == "sh" and "--json" in code:
            shown = json.loads(code.split("#", 1)[1].strip())
            assert json.loads(out) == shown, (
                f"README shows {shown} for {code.split('#')[0].strip()!r} after the steps before it; "
                f"it prints {out.strip()}")
