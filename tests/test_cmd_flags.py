"""Flags at the CLI's edge: each shared flag is declared once (commands/flags.py), and the
``python -m`` entry modules in commands/ answer a usage mistake with one line and exit 2."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.cli import build_parser
from scalerun.commands import flags
from scalerun.commands import rank_doctor as rank_entry
from scalerun.commands.doctor import options_from_args

SRC = str(Path(__file__).resolve().parents[1] / "src")
DECLARATIONS = {
    "--site": flags.add_site_argument,
    "--sysfs": flags.add_sysfs_argument,
    "--hyperthreads": flags.add_hyperthreads_argument,
}


def declared(declare) -> argparse.Action:
    parser = argparse.ArgumentParser()
    declare(parser)
    return parser._actions[-1]


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every ``scalerun`` subcommand's parser, and the doctor's rank entry point's."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {**sub.choices, "rank_doctor": rank_entry.build_parser()}


def action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


def shape(found: argparse.Action) -> tuple:
    return (found.dest, found.help, found.metavar, found.nargs, found.const, type(found).__name__)


@pytest.mark.parametrize("flag", ["--site", "--sysfs"])
def test_every_command_declares_the_flag_as_flags_py_does(flag: str) -> None:
    """All of them: a command that spells the flag itself shows up here."""
    wanted = declared(DECLARATIONS[flag])
    takers = {name: action(parser, flag) for name, parser in commands().items()}
    takers = {name: found for name, found in takers.items() if found is not None}
    assert set(takers) >= {"topo", "bind", "env", "doctor", "rank_doctor"}
    assert {name: shape(found) for name, found in takers.items()} == dict.fromkeys(takers, shape(wanted))
    assert all(found.default is None for found in takers.values())


def test_hyperthreads_is_one_declaration_for_topo_bind_and_launch() -> None:
    """``scalerun launch`` declares it with ``default=None`` ("not given": the plan's rule)."""
    wanted = declared(flags.add_hyperthreads_argument)
    parsers = commands()
    for name in ("topo", "bind"):
        found = action(parsers[name], "--hyperthreads")
        assert found is not None and (shape(found), found.default) == (shape(wanted), False), name
    for name in ("launch", "jobscript"):
        found = action(parsers[name], "--hyperthreads")
        assert found is not None and (shape(found), found.default) == (shape(wanted), None), name
    assert declared(lambda p: flags.add_hyperthreads_argument(p, default=None)).default is None


def test_help_names_the_variable_from_plan_variables() -> None:
    assert f"${variables.SYSFS}" in declared(flags.add_sysfs_argument).help
    assert f"${variables.SITE}" in declared(flags.add_site_argument).help


@pytest.mark.parametrize(("environ", "argv", "root"), [
    ({}, [], "/"),
    ({variables.SYSFS: "/fixtures/lumig"}, [], "/fixtures/lumig"),
    ({variables.SYSFS: "/fixtures/lumig"}, ["--sysfs", "/other"], "/other"),
])
def test_the_doctor_reads_sysfs_like_every_other_command(monkeypatch, environ, argv, root) -> None:
    """The flag, else $SCALERUN_SYSFS, else / (the doctor's flag used to default to / only)."""
    monkeypatch.delenv(variables.SYSFS, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert options_from_args(rank_entry.build_parser().parse_args(argv)).sysfs == root


def run_module(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


@pytest.mark.parametrize(("module", "argv", "message"), [
    ("scalerun.commands.rank_doctor", ["--iters", "many"], "argument --iters: invalid int value"),
    ("scalerun.commands.rank_doctor", ["--min-bytes", "3X"], "size '3X' is not a byte count"),
    ("scalerun.commands.rank_doctor", ["--warmup", "-1"], "--warmup -1 >= 0"),
    ("scalerun.commands.horovod_env", ["--bogus"], "unrecognized arguments: --bogus"),
    ("scalerun.commands.horovod_env", ["no-such-site"], "no-such-site"),
    ("scalerun.commands.node_sampler", ["--interval", "1"], "the following arguments are required: --out"),
])
def test_entry_modules_answer_a_mistake_with_one_line_and_exit_2(tmp_path, module, argv, message) -> None:
    done = run_module(module, *argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_run_dir_is_refused_in_one_line(tmp_path, monkeypatch, capsys, value) -> None:
    """``--run-dir "$UNSET"`` would put the run's files in the working folder, over a
    ``run.json`` there (issue 34): one line, exit 2, nothing written."""
    from scalerun.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["launch", "--run-dir", value, "train.py"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "argument --run-dir: is empty (an unset variable?)" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())
