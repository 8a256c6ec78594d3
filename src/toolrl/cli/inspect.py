"""`toolrl config show`, `toolrl model fetch`, `toolrl tools list|call`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from toolrl.cli.app import (
    ConfigArg,
    ConfigOption,
    SetOption,
    _quiet_libraries,
    config_app,
    config_given,
    console,
    model_app,
    tools_app,
)


@config_app.command("show")
def config_show(config: ConfigArg = None, config_option: ConfigOption = None, set_: SetOption = None) -> None:
    """Print the resolved config (file, then overrides, validated)."""
    from toolrl.config import config_to_yaml, resolve_config

    typer.echo(config_to_yaml(resolve_config(config_given(config, config_option), set_)), nl=False)


@model_app.command("fetch")
def model_fetch(name: Annotated[str, typer.Argument(help="Model name.")] = "smollm2-135m-instruct") -> None:
    """Resolve a model to a local folder (converting an embedded model once) and print the folder."""
    import time

    from rich.console import Console

    from toolrl.home import toolrl_home
    from toolrl.models.resolve import EMBEDDED, resolve_model

    _quiet_libraries()
    if name in EMBEDDED and not (toolrl_home() / "models" / name / "config.json").is_file():
        started = time.perf_counter()  # the one slow case: the GGUF converted to a safetensors folder, once
        err = Console(stderr=True)  # stdout is the folder alone: scripts read it with $(toolrl model fetch)
        with err.status(f"converting {name} from its GGUF file (once)"):
            folder = resolve_model(name)
        err.print(f"converted {name} in {time.perf_counter() - started:.0f} s", highlight=False)
    else:
        folder = resolve_model(name)
    typer.echo(str(folder))


ToolsConfigArg = Annotated[
    Path | None, typer.Argument(help="Tool config file (mcpServers style, YAML or JSON); or give it with --config.")
]
ToolsConfigOption = Annotated[
    Path | None, typer.Option("--config", help="The tool config file, as the CONFIG argument.")
]


def _tools_config(argument: Path | None, option: Path | None) -> Path:
    found = config_given(argument, option)
    if found is None:
        raise typer.BadParameter("give the tool config file: toolrl tools list FILE (or --config FILE)")
    return found


@tools_app.command("list")
def tools_list(
    config: ToolsConfigArg = None,
    config_option: ToolsConfigOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The tools (OpenAI schemas) and servers' status as one JSON object.")
    ] = False,
) -> None:
    """List the tools with their parameters, and each server's status."""
    from toolrl.tools.toolset import Toolset

    config = _tools_config(config, config_option)
    toolset = Toolset.load(config)
    try:
        if as_json:
            print(json.dumps({"tools": [t.to_openai() for t in toolset.tools], "servers": toolset.status}))
            if any(status != "ok" for status in toolset.status.values()):
                raise typer.Exit(1)
            return
        table = Table(title=str(config))
        for column in ("tool", "parameters", "description"):
            table.add_column(column)
        for tool in toolset.tools:
            props = tool.parameters.get("properties", {})
            required = set(tool.parameters.get("required", []))
            params = ", ".join(f"{k}{'' if k in required else '?'}: {v.get('type', 'any')}" for k, v in props.items())
            table.add_row(tool.name, params, tool.description)
        console.print(table)
        for server, status in toolset.status.items():
            console.print(f"server {server}: {status}", highlight=False)
        failed = [server for server, status in toolset.status.items() if status != "ok"]
    finally:
        toolset.close()
    if failed:  # a script checking a tool file must see that some of its servers are down
        console.print(f"{len(failed)} of {len(toolset.status)} servers failed: {', '.join(failed)}", highlight=False)
        raise typer.Exit(1)


@tools_app.command("call")
def tools_call(
    config: Annotated[Path | None, typer.Argument(help="Tool config file (or --config FILE before NAME).")] = None,
    name: Annotated[str | None, typer.Argument(help="server.tool, or a short name that only one server has.")] = None,
    arguments: Annotated[str | None, typer.Argument(help="Arguments as a JSON object (default {}).")] = None,
    config_option: ToolsConfigOption = None,
) -> None:
    """Call one tool by hand, through the same executor a rollout uses, and print the observation:
    `toolrl tools call FILE NAME ARGUMENTS`, or `toolrl tools call --config FILE NAME ARGUMENTS`."""
    import asyncio

    from toolrl.errors import ToolError
    from toolrl.tools import ToolCall, ToolExecutor, ToolPolicy
    from toolrl.tools.toolset import Toolset

    if config_option is not None:  # the file given as --config: the words after it are NAME and ARGUMENTS
        if arguments is not None:
            raise typer.BadParameter("give the tool config once: FILE NAME ARGUMENTS, or --config FILE NAME ARGUMENTS")
        config, name, arguments = config_option, None if config is None else str(config), name
    if config is None or name is None:
        raise typer.BadParameter(
            "give the tool config file and the tool's name: toolrl tools call FILE NAME [ARGUMENTS]"
        )
    arguments = "{}" if arguments is None else arguments

    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ToolError(f"arguments must be a JSON object: {exc.msg} at char {exc.pos}") from None
    if not isinstance(args, dict):
        raise ToolError("arguments must be a JSON object, like '{\"a\": 1}'")
    toolset = Toolset.load(config)
    try:
        executor = ToolExecutor(toolset.tools, policies=toolset.policies(ToolPolicy()), log_dir=toolset.log_dir)
        result = asyncio.run(executor.invoke(ToolCall(toolset.resolve(name), args)))
    finally:
        toolset.close()
    typer.echo(result.content)
    typer.echo(f"({result.outcome}, {result.latency_s:.3f} s)", err=True)
    if result.error:
        raise typer.Exit(1)
