"""``molt-env [COMMAND [SUBCOMMAND]] --help`` exits 0 and lists the flags of that command, for every command."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from env_registry.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) for the parser and, recursively, every subcommand; a positional with choices (``token mint``)
    is a subcommand path too."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))
        elif not action.option_strings and action.choices and path:
            for choice in action.choices:
                yield (*path, choice), parser


COMMANDS = list(_commands(build_parser()))


def test_every_command_is_covered():
    names = {path[0] for path, _ in COMMANDS if path}
    assert {"list", "info", "check", "init", "build", "publish", "serve", "search", "install", "yank"} <= names
    assert ("token", "mint") in {path for path, _ in COMMANDS}


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(p) or "molt-env" for p, _ in COMMANDS])
def test_help_exits_0_and_lists_the_flags(path, parser):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0
    text = out.getvalue()
    assert text.startswith(f"usage: {parser.prog}")
    shown = [action for action in parser._actions if action.help != argparse.SUPPRESS]  # internal flags stay hidden
    flags = [flag for action in shown for flag in action.option_strings]
    missing = [flag for flag in flags if flag not in text]
    assert not missing, f"molt-env {' '.join(path)} --help does not mention {missing}"


def test_the_installed_script_prints_help():
    script = Path(sys.executable).with_name("molt-env")  # the console script of this venv
    assert script.is_file(), f"{script} is missing; pip install -e . installs it"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "publish" in done.stdout and "install" in done.stdout
