"""docs/api.md's command-line section agrees with the argument parsers, and quotes a real bad-argument run."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from hypergrid.__main__ import _COMMANDS, main

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECTION = (ROOT / "docs" / "api.md").read_text().split("## Command line", 1)[1]


def _help(command: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    return out.getvalue()


def _bullet(command: str) -> str:
    """The section's bullet for ``command``: from its synopsis to the next bullet."""
    found = re.search(rf"^- `python -m hypergrid {command}\b.*?(?=^- |^\S)", SECTION, re.M | re.S)
    assert found, f"docs/api.md's command-line section has no bullet for {command!r}"
    return " ".join(found.group(0).split())


@pytest.mark.parametrize("command", sorted(_COMMANDS))
def test_every_subcommand_has_its_parsers_full_synopsis(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = " ".join(_help(command, monkeypatch).split("\n\n")[0].split())
    synopsis = usage.removeprefix("usage: ").replace(" [-h]", "")
    assert f"`{synopsis}`" in _bullet(command), f"docs/api.md should give `{synopsis}`"


@pytest.mark.parametrize("command", sorted(_COMMANDS))
def test_every_flag_the_page_names_exists(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    options = set(re.findall(r"^\s+(--[a-z][a-z-]*)", _help(command, monkeypatch), re.M))
    named = set(re.findall(r"(--[a-z][a-z-]*)", _bullet(command)))
    assert named <= options, f"docs/api.md names {sorted(named - options)} for {command}, which it does not have"
    assert options - {"--help"} <= named


def test_the_quoted_bad_argument_output_is_what_the_command_prints() -> None:
    block = re.search(r"```text\n\$ (python -m hypergrid [^\n]*)\n(.*?)```", SECTION, re.S)
    assert block, "docs/api.md should quote a bad-argument run as a text block starting with `$ python -m ...`"
    command, quoted = block.group(1), block.group(2)
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, *shlex.split(command)[1:]]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "exit with status 2" in SECTION
    assert done.stdout + done.stderr == quoted
