"""The `toolrl` command line's application, its command groups, and what the commands share."""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

PIPE_WIDTH = 1000
"""Width of what the commands print into a pipe or a file: rich's default there (80 columns) cut a table's names
("referen…"); a reader of a log or a script wants them whole."""

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="RL post-training of language models on tool use.",
)
config_app = typer.Typer(no_args_is_help=True, help="Inspect configs.")
model_app = typer.Typer(no_args_is_help=True, help="Manage models.")
tools_app = typer.Typer(no_args_is_help=True, help="Inspect and try the tools of a tool config file.")
retriever_app = typer.Typer(no_args_is_help=True, help="A local retriever with Search-R1's /retrieve interface.")
env_app = typer.Typer(no_args_is_help=True, help="Environments: list them, write a new one, build one.")
app.add_typer(retriever_app, name="retriever")
app.add_typer(env_app, name="env")
app.add_typer(tools_app, name="tools")
app.add_typer(config_app, name="config")
app.add_typer(model_app, name="model")
console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)

SetOption = Annotated[list[str] | None, typer.Option("--set", help="Override a config key: section.key=value.")]
ConfigArg = Annotated[Path | None, typer.Argument(help="YAML config file; the packaged default when omitted.")]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="The YAML config file, as the CONFIG argument (either way).")
]


def config_given(argument: Path | None, option: Path | None) -> Path | None:
    """The config file a command was given: as its argument or with --config, the same (both: they must agree)."""
    from toolrl.errors import ToolRLError

    if argument is not None and option is not None and argument != option:
        raise ToolRLError(f"config given twice, {argument} and --config {option}: give one (an argument or --config)")
    return argument if argument is not None else option


VERBOSE = {"on": False}
STARTED = time.monotonic()
"""When the command started (this module is imported first): its wall time counts loading and imports too (an
evaluation that took 88 s had printed 'wall time 12 s', the time after its model loaded)."""


def wall_s() -> float:
    return time.monotonic() - STARTED


@app.callback()
def _options(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show third-party warnings and libraries' info logs.")
    ] = False,
) -> None:
    """Start-up, before any command: third-party warnings (transformers' and torch's FutureWarning and
    DeprecationWarning lines, a flood on every forward pass) are filtered once here, unless -v."""
    VERBOSE["on"] = verbose
    if not verbose:
        for category in (FutureWarning, DeprecationWarning, UserWarning):
            warnings.filterwarnings("ignore", category=category, module=r"(torch|transformers|peft|accelerate)\b")
        warnings.filterwarnings("ignore", category=FutureWarning)  # attributed to torch's module call wrapper


def _quiet_libraries() -> None:
    """Libraries' logs at warning level (info with -v); transformers' at error level without progress bars, set
    through the environment when it is not imported yet (`toolrl ui` never imports it)."""
    verbose = VERBOSE["on"]
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if verbose:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()


def _cell(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "n/a"  # an environment that declares no success criterion
    return f"{value:.1%}" if percent else f"{value:.2f}"


def _eval_table(title: str, columns: dict[str, dict[str, float]]) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    rows = [("success", "success rate"), ("tool_calls", "tool calls / task"), ("turns", "turns / task")]
    if any(c.get("segments", 1.0) > 1.0 for c in columns.values()):  # compacted (rollout.context)
        rows += [("segments", "segments / task"), ("stop/length", "stopped by a token limit")]
    passes = sorted({k for c in columns.values() for k in c if k.startswith(("pass@", "pass^"))},
                    key=lambda k: (int(k[5:]), k[4]))  # fmt: skip
    rows += [(key, f"{key} ({'any' if key[4] == '@' else 'all'} of {key[5:]} succeed)") for key in passes]
    percent = {"success", "stop/length", *passes}
    for key, label in rows:
        table.add_row(label, *(_cell(c.get(key), percent=key in percent) for c in columns.values()))
    return table


ResultsJson = Annotated[bool, typer.Option("--json", help="The results as one JSON object on stdout, nothing else.")]
ResultsQuiet = Annotated[bool, typer.Option("--quiet", help="The results alone: no progress lines.")]
ResumeOption = Annotated[
    Path | None, typer.Option("--resume", help="Continue the run in this directory from its last checkpoint.")
]
