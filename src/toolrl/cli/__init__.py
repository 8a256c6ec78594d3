"""The `toolrl` command line: train, eval, report, config show, model fetch, tools, env, retriever."""

from __future__ import annotations

import sys

from toolrl.cli import envs, inspect, run  # noqa: F401  (register the commands)
from toolrl.cli.app import app
from toolrl.errors import ToolRLError

__all__ = ["app", "main"]


def main() -> None:
    import click

    try:
        result = app(standalone_mode=False)
    except ToolRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    sys.exit(result if isinstance(result, int) else 0)
