"""``molt-train [COMMAND] --help`` exits 0 and lists every flag of that command, for every command; and the installed
script does so too (a ``%`` in a help text once crashed ``molt-train rl --help`` with a traceback)."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from molt_train.cli import COMMANDS, main


def test_the_command_list():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--help"]) == 0
    for name in COMMANDS:
        assert f"  {name} " in out.getvalue()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_exits_0_and_lists_the_flags(command, monkeypatch):
    parsers: list[argparse.ArgumentParser] = []  # the parser the command built, to compare its flags with the text
    parse_args = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):
        parsers.append(self)
        return parse_args(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text, parser = out.getvalue(), parsers[-1]
    assert text.startswith(f"usage: molt-train {command}")
    flags = [f for a in parser._actions if a.help != argparse.SUPPRESS for f in a.option_strings]
    assert len(flags) > 2  # every command has flags of its own besides -h/--help
    missing = [flag for flag in flags if flag not in text]
    assert not missing, f"molt-train {command} --help does not mention {missing}"


def test_the_installed_script_prints_help():
    script = Path(sys.executable).with_name("molt-train")
    assert script.is_file(), f"{script} is missing; pip install -e . installs it"
    done = subprocess.run([str(script), "rl", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--algo.advantage.estimator" in done.stdout and "Traceback" not in done.stderr
