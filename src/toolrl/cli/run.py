"""`toolrl train`, `toolrl sft`, `toolrl report`, `toolrl export`, `toolrl serve`."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from toolrl.cli.app import (
    ConfigArg,
    ConfigOption,
    ResultsJson,
    ResumeOption,
    SetOption,
    _cell,
    _eval_table,
    _quiet_libraries,
    app,
    config_given,
    console,
    wall_s,
)
from toolrl.errors import ConfigError, ToolRLError
from toolrl.text import first_line

QuietOption = Annotated[bool, typer.Option("--quiet", help="Print only the end of the run.")]
JsonOption = Annotated[bool, typer.Option("--json", help="One JSON object of metrics per step on stdout.")]
TrustOption = Annotated[
    bool,
    typer.Option(
        "--trust-run",
        help="Resume a run made on another machine or by another user: it runs the code its config names.",
    ),
]


@app.command()
def train(
    config: ConfigArg = None,
    config_option: ConfigOption = None,
    set_: SetOption = None,
    resume: ResumeOption = None,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
    trust_run: TrustOption = False,
) -> None:
    """Train a model with RL (GRPO by default) on an environment's tasks. Progress: a bar on a terminal, one
    line per step otherwise (also in RUN/progress.log)."""
    _train(config_given(config, config_option), set_, resume, quiet, as_json, trust_run)


@app.command()
def sft(
    config: ConfigArg = None,
    config_option: ConfigOption = None,
    set_: SetOption = None,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Supervised warm start: fine-tune on trajectories from the `sft` section's source (the environment's
    reference policy, a teacher endpoint, a JSONL of conversations, or the policy's own successes), in the RL
    format. A run like `toolrl train` (evaluations, RUN/final) with the warm start alone; its lines are in
    RUN/sft.jsonl. Train from it with model.name: RUN/final, or set train.warm_start in an RL run."""
    _train(config_given(config, config_option), [*(set_ or []), "train.warm_start=true", "train.steps=0"], None, quiet,
           as_json, False)  # fmt: skip


def _train(config, set_, resume, quiet: bool, as_json: bool, trust_run: bool) -> None:
    from toolrl.config import resolve_config
    from toolrl.config.preflight import preflight
    from toolrl.runs.rundir import RunDir

    if resume is not None:
        if config is not None:
            raise ToolRLError("--resume continues a run with its own config.yaml; pass no config file")
        run = RunDir.existing(resume)
        if run.pointed("last") is None:
            raise ToolRLError(f"{run.path}: no checkpoint to resume from (no last/); train.save_every writes them")
        from toolrl.config.resolve import read
        from toolrl.runs.trust import check_trusted, code_to_run

        data = read(run.path / "config.yaml")
        for line in code_to_run(data):  # a run directory is data: what it makes toolrl run is said first
            console.print(f"resume will {line}", highlight=False, markup=False)
        status = run.read_status()
        check_trusted(run.path, status, trust_run)
        cfg = resolve_config(run.path / "config.yaml", set_)
        done = status.get("step")
        if status.get("state") == "finished" and isinstance(done, int) and cfg.train.steps <= done:
            raise ToolRLError(
                f"{run.path}: the run finished all its {done} steps; resume with --set train.steps=N (N > {done}) to "
                f"train further, or start a new run from its model (model.name: {run.path / 'final'})"
            )
    else:
        cfg = resolve_config(config, set_)
        run = None
    preflight(cfg)  # what can be checked before a model loads (and torch is imported), before the run directory
    from toolrl import distributed
    from toolrl.cli.progress import StepReporter, pick_mode
    from toolrl.train import Trainer, Workbench
    from toolrl.train.estimate import before_first_step

    _quiet_libraries()
    ctx = distributed.from_env()  # under torchrun: rank 0 writes the run directory and prints; the others work
    mode = pick_mode(quiet, as_json) if ctx.main else "silent"
    say = console.print if mode in ("bar", "lines") else (lambda *a, **k: None)
    run = (run or RunDir.create(cfg)) if ctx.main else None
    if run is not None:
        say(f"run directory: [bold]{run.path}[/]")
    try:
        with console.status(f"loading {cfg.model.name}") if mode == "bar" else nullcontext():
            bench = Workbench.load(cfg, log_dir=run.path / "tools" if run else None)
        log_file = run.path / "progress.log" if run else None
        with StepReporter(mode, cfg.train.steps, console, log_file) as report:
            try:
                trainer = Trainer(bench, run)
                trainer.on_note = report.note
                if cfg.train.steps or cfg.train.warm_start:  # before the first step: its cost, and a refusal
                    before_first_step(trainer, report.note)
                if resume is not None:
                    report.start(trainer.resume(resume))
                summary = trainer.train(report)
            finally:
                bench.close()
        distributed.close(ctx)
    except BaseException as exc:  # status.json says why a run failed or never started (the UI shows it)
        if run is not None and run.read_status().get("state") in (None, "running"):
            run.write_status(state="failed" if isinstance(exc, Exception) else "stopped", error=first_line(exc))
        raise
    if run is None:
        return
    columns_ = {k.replace("eval_", ""): summary[k] for k in ("eval_start", "eval_end") if k in summary}
    if columns_ and mode != "json":  # the results in every mode (--quiet: these lines only)
        t = cfg.eval.sampling.temperature
        how = "greedy" if t == 0 else f"sampled at temperature {t:g}"
        console.print(_eval_table(f"{cfg.env.name} test split ({cfg.eval.num_tasks} tasks, {how})", columns_))
    end = f"checkpoint: {summary['checkpoint']}   wall time {wall_s():.0f} s"
    memory = summary.get("memory", {})
    if memory.get("peak_gb"):  # as the OS reports the process (its max RSS); tool processes apart
        children = f" + {memory['children_peak_gb']:.1f} GB in tool processes" if memory.get("children_peak_gb") else ""
        end += f"   peak memory {memory['peak_gb']:.1f} GB (max RSS of this process{children})"
    if "stopped" in summary:  # RUN/STOP (the UI's stop button) ended it after a step
        end = f"stopped after step {summary['stopped']} (resume: toolrl train --resume {run.path})   " + end
    if mode == "json":
        print(json.dumps({"checkpoint": summary["checkpoint"], "wall_s": round(wall_s(), 1),
                          **{f"eval_{k}": v for k, v in columns_.items()}}))  # fmt: skip
    elif mode == "bar":
        console.print(end)
    else:
        print(end, flush=True)  # a whole line, whatever the width a pipe or log file gets


@app.command()
def export(
    checkpoint: Annotated[Path, typer.Argument(help="A run directory (its last checkpoint) or a checkpoint folder.")],
    out: Annotated[Path, typer.Argument(help="Folder to write the Hugging Face model to.")],
) -> None:
    """Write a checkpoint, sharded (torchrun) or not, as a plain Hugging Face model folder (LoRA merged)."""
    from toolrl.runs.export import export_checkpoint

    _quiet_libraries()
    console.print(f"exported: {export_checkpoint(checkpoint, out)}")


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory made by toolrl train.")],
    param_delta: Annotated[
        bool, typer.Option("--param-delta", help="Relative weight change per layer and module between two models.")
    ] = False,
    before: Annotated[str | None, typer.Option("--from", help="Model before (default: the run's model.name).")] = None,
    after: Annotated[str | None, typer.Option("--to", help="Model after (default: RUN/final).")] = None,
    as_json: ResultsJson = False,
) -> None:
    """Summarise a run (first, last and mean of its metrics; its evaluations) and (re)write its plot.png; with
    --param-delta, how much training changed each layer and module (param_delta.json and param_delta.png)."""
    from toolrl.runs.report import context_summary, split_records, summary_rows, write_plot
    from toolrl.runs.rundir import RunDir

    run = RunDir.existing(run_dir)
    if param_delta:
        _param_delta(run.path, before, after)
        return
    records = run.read_metrics()
    steps, evals = split_records(records)
    if as_json:  # the summary without the plot: a script reads numbers
        rows = {key: {"first": first, "last": last, "mean": mean} for key, first, last, mean in summary_rows(records)}
        print(json.dumps({"run": str(run.path), "steps": len(steps), "metrics": rows, "evaluations": evals,
                          "compactions": context_summary(run.path)}))  # fmt: skip
        return
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
    compactions = context_summary(run.path)
    if compactions:  # linked segments: where the trajectories' contexts were compacted (rollout.context)
        shown = Table(title="compactions (training records): where a segment closed and what the next kept")
        for column in ("strategy", "compactions", "trajectories", "at turn (mean, first-last)", "segment tokens",
                       "carried", "written"):  # fmt: skip
            shown.add_column(column, justify="left" if column == "strategy" else "right")
        for row in compactions:
            turns = f"{row['mean_turn']:.1f} ({row['first_turn']}-{row['last_turn']})"
            sizes = [f"{row[key]:.0f}" for key in ("mean_tokens", "mean_carried", "mean_written")]
            shown.add_row(row["strategy"], str(row["compactions"]), str(row["trajectories"]), turns, *sizes)
        console.print(shown)
    plot = write_plot(run.path)
    console.print(f"plot: {plot}" if plot else "no training steps logged yet: no plot")
    images = sorted((run.path / "images").rglob("*.png")) if (run.path / "images").is_dir() else []
    if images:  # a vision-language policy's trajectories: their images, as the records name them
        console.print(f"images of sampled trajectories: {len(images)} PNG files under {run.path / 'images'}")


def _param_delta(run_path: Path, before: str | None, after: str | None) -> None:
    import json

    from toolrl.config.resolve import read_checked
    from toolrl.train.param_delta import by_layer_and_module, load_weights, relative_changes, write_heatmap

    _quiet_libraries()
    before = before or read_checked(run_path / "config.yaml").model.name
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


@app.command()
def serve(
    run_dir: Annotated[
        Path | None, typer.Argument(help="A run directory (its last checkpoint) or a checkpoint; default: model.name.")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML config (model, rollout), without RUN_DIR; a YAML file as the argument too."),
    ] = None,
    set_: SetOption = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0: any free one).")] = 8000,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="Most tokens a reply may have (the ceiling on max_tokens; default: the context)."),
    ] = None,
    max_request_mb: Annotated[int | None, typer.Option(min=1, help="MB of keys and values a request (1024).")] = None,
    max_kv_mb: Annotated[int | None, typer.Option(min=1, help="MB of keys and values in flight (4096).")] = None,
) -> None:
    """Serve the policy (a trained checkpoint, or the configured model: the default model out of the box) as the
    gateway does during training: OpenAI's /v1/chat/completions and /v1/responses, Anthropic's /v1/messages, with
    tools, /v1/completions and /v1/models. Prints the base URLs and the key (TOOLRL_SERVE_KEY sets it)."""
    import logging
    import os

    from toolrl.chat import ChatFormat
    from toolrl.config import resolve_config
    from toolrl.gateway import Gateway
    from toolrl.gateway.budget import DEFAULT_REQUEST_MB, DEFAULT_TOTAL_MB, MB, KVBudget
    from toolrl.models import load_model, load_tokenizer, pick_device
    from toolrl.parsers import get_parser
    from toolrl.rollout import get_engine_factory

    if run_dir is not None and run_dir.suffix in (".yaml", ".yml") and run_dir.is_file():
        run_dir, config = None, config_given(run_dir, config)  # a config as the argument, as every command takes it
    _quiet_libraries()
    logging.getLogger("toolrl.gateway.requests").setLevel(logging.INFO)  # a line per request, -v or not
    with console.status("loading the model"):
        if run_dir is not None:
            from toolrl.runs.export import load_checkpoint

            cfg, model, served = load_checkpoint(run_dir, pick_device("auto"))
            device = next(model.parameters()).device
        else:
            cfg = resolve_config(config, set_)
            device = pick_device(cfg.device)
            served = cfg.model.name
            model = load_model(cfg.model.name, device, cfg.model.dtype, cfg.model.cpu_linear)
        model.eval()
        tokenizer = load_tokenizer(cfg.model.name)
        chat = ChatFormat(tokenizer)
        engine = get_engine_factory("hf")(model=model, chat=chat, device=device, seed=cfg.seed, config=cfg)
    syntax = get_parser(cfg.rollout.parser or "hermes")
    context = int(getattr(model.config, "max_position_embeddings", None) or 2**31)
    ceiling = min(max_new_tokens or context, context)
    max_request_mb, max_kv_mb = max_request_mb or DEFAULT_REQUEST_MB, max_kv_mb or DEFAULT_TOTAL_MB
    budget = KVBudget(engine.kv_bytes_per_token, max_request_mb * MB, max_kv_mb * MB)
    gateway = Gateway(engine, chat, syntax, str(served), key=os.environ.get("TOOLRL_SERVE_KEY") or None,
                      max_new_tokens=ceiling, context_length=context, port=port, budget=budget).start()  # fmt: skip
    console.print(f"serving {served} (calls parsed as {syntax.name})", highlight=False)
    console.print(f"a reply has at most {ceiling:,} tokens (--max-new-tokens; max_tokens asks for fewer); keys and "
                  f"values: {max_request_mb:,} MB a request, {max_kv_mb:,} MB in flight", highlight=False)  # fmt: skip
    console.print(f"OPENAI_BASE_URL={gateway.base_url()}", highlight=False, soft_wrap=True)
    console.print(f"OPENAI_API_KEY={gateway.key}", highlight=False, soft_wrap=True)
    console.print(f"ANTHROPIC_BASE_URL={gateway.anthropic_base_url()}", highlight=False, soft_wrap=True)
    console.print(f"ANTHROPIC_API_KEY={gateway.key}", highlight=False, soft_wrap=True)
    try:
        gateway.wait()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        gateway.stop()
        engine.close()
