"""Every command of the CLI, used wrongly, answers with one line on stderr that names what is wrong and what to
do (with "did you mean" for a near miss), exit code 2, and no traceback. The commands are walked from the
application itself, so a command added later is covered."""

import sys

import pytest
import typer

from toolrl.cli import app, main


def commands(command=None, path=()):
    command = command or typer.main.get_command(app)
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield path, command
        return
    for name, sub in subcommands.items():
        yield from commands(sub, (*path, name))


COMMANDS = dict(commands())


def misuses():
    """(argv, why) pairs: an unknown option for every command; an option that needs a value given none; no
    arguments where the command requires some (never a bare call of a command that would then run)."""
    for path, command in COMMANDS.items():
        name = " ".join(path)
        yield [*path, "--no-such-option"], f"{name}: unknown option"
        valued = [p.opts[0] for p in command.params if p.param_type_name == "option" and not p.is_flag]
        if valued:
            yield [*path, valued[0]], f"{name}: {valued[0]} without its value"
        if any(p.required for p in command.params):
            yield list(path), f"{name}: a required argument missing"


def run(argv, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["toolrl", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    out = capsys.readouterr()
    return exited.value.code, out.out, out.err


def test_every_command_is_covered():
    assert {"train", "eval", "sft", "serve", "ui", "env build", "env check", "tools call", "model fetch"} <= {
        " ".join(p) for p in COMMANDS
    }


@pytest.mark.parametrize("argv", [argv for argv, _ in misuses()], ids=[why for _, why in misuses()])
def test_bad_usage_of_any_command_is_one_line_and_exit_code_2(argv, monkeypatch, capsys):
    code, out, err = run(argv, monkeypatch, capsys)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err + out and "╭" not in err + out
    if "--no-such-option" in argv:
        assert "--no-such-option" in lines[0] and "--help" in lines[0]  # names it, says where to look


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["trian"], "'train'"),  # a command
        (["env", "bulid"], "'build'"),  # a subcommand
        (["eval", "--temprature", "0"], "'--temperature'"),  # an option
        (["config", "show", "--set", "train.stepz=3"], "'steps'"),  # a config key
        (["config", "show", "--set", "env.name=calculater"], "'calculator'"),  # an environment
        (["config", "show", "--set", "train.advantage=grpoo"], "'grpo'"),  # an estimator
        (["config", "show", "--set", "train.loss=ppo_clipp"], "'ppo_clip'"),  # a loss
        (["list", "parsr"], "'parser'"),  # a registry
    ],
)
def test_a_near_miss_gets_did_you_mean(argv, suggestion, monkeypatch, capsys):
    code, _, err = run(argv, monkeypatch, capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "did you mean" in line.lower() and suggestion in line, line


def test_a_far_miss_gets_no_guess_but_the_known_names(monkeypatch, capsys):
    code, _, err = run(["config", "show", "--set", "env.name=zzzzzz"], monkeypatch, capsys)
    (line,) = err.strip().splitlines()
    assert code == 2 and "did you mean" not in line and "known: " in line and "calculator" in line
