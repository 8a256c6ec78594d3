"""The `toolrl` command line: train, eval, report, export, ui, list, config show, model fetch, tools, env,
retriever."""

from __future__ import annotations

import os
import sys

from toolrl.cli import envs, inspect, registries, run, ui  # noqa: F401  (register the commands)
from toolrl.cli.app import app
from toolrl.errors import ToolRLError

__all__ = ["app", "main"]


def main() -> None:
    import click

    try:
        result = app(standalone_mode=False)
    except ToolRLError as exc:
        print(f"error: {_rank()}{exc}", file=sys.stderr)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
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


def _rank() -> str:
    """'rank R of N: ' under torchrun, '' in one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return f"rank {os.environ.get('RANK', '?')} of {world}: " if world > 1 else ""
