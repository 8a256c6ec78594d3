"""The `toolrl` command line: train, eval, report, export, ui, list, config show, model fetch, tools, env,
retriever."""

from __future__ import annotations

import os
import sys

from toolrl.cli import envs, evaluation, inspect, registries, run, ui  # noqa: F401  (register the commands)
from toolrl.cli.app import app
from toolrl.errors import ToolRLError

__all__ = ["app", "main"]


def main() -> None:
    try:
        result = command()(standalone_mode=False)
    except ToolRLError as exc:
        print(f"error: {_rank()}{exc}", file=sys.stderr)
        sys.exit(2)
    except _click_errors() as exc:  # a usage error (exit 2) or a command's own: one line, no traceback
        print(f"error: {usage_line(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except _click_aborts():
        sys.exit(130)
    except Exception as exc:
        if not _rank():
            raise
        # under torchrun: one line per rank that names it (the others stop at the collective timeout or when
        # the connection to it closes), the traceback in a file
        import tempfile
        import traceback
        from pathlib import Path

        from toolrl.text import first_line

        path = Path(tempfile.gettempdir()) / f"toolrl-rank-{os.environ.get('RANK', '?')}.traceback"
        path.write_text(traceback.format_exc())
        print(f"error: {_rank()}{type(exc).__name__}: {first_line(exc)} (traceback: {path})", file=sys.stderr)
        sys.exit(1)
    sys.exit(result if isinstance(result, int) else 0)


def command():
    """The click command typer builds from `app`, its help showing values as they are typed (cli/help.py)."""
    import typer

    from toolrl.cli.help import as_typed

    return as_typed(typer.main.get_command(app))


def _click_modules() -> list:
    """click, and the copy of it typer bundles (typer >= 0.24 raises its own click's exceptions)."""
    import click

    modules = [click.exceptions]
    try:
        from typer._click import exceptions as bundled
    except ImportError:
        return modules
    return [*modules, bundled]


def _click_errors() -> tuple[type[Exception], ...]:
    return tuple(m.ClickException for m in _click_modules())


def _click_aborts() -> tuple[type[BaseException], ...]:
    import click
    import typer

    return click.exceptions.Abort, typer.Abort


def usage_line(exc) -> str:
    """A click error as one line: its message (click's own "did you mean" included), and for a usage error the
    command's help to read."""
    from toolrl.cli.help import value_error
    from toolrl.text import did_you_mean, one_line

    message = value_error(exc) or one_line(exc.format_message(), 400)
    possibilities = getattr(exc, "possibilities", None)  # NoSuchOption: the command's options close to it
    if possibilities:
        message = f"No such option: {exc.option_name}{did_you_mean(exc.option_name, possibilities)}"
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and exc.exit_code == 2:
        message += f" (see: {ctx.command_path} --help)"
    return message


def _rank() -> str:
    """'rank R of N: ' under torchrun, '' in one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return f"rank {os.environ.get('RANK', '?')} of {world}: " if world > 1 else ""
