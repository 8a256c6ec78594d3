"""`toolrl eval`: the evaluation harness (success, tool use, breakdowns, pass@k and pass^k over trials)."""

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
    ResultsQuiet,
    SetOption,
    _eval_table,
    _quiet_libraries,
    app,
    config_given,
    console,
    wall_s,
)


@app.command("eval")
def eval_(
    config: ConfigArg = None,
    model: Annotated[str, typer.Option(help="Embedded model name, local folder or cached hub id.")] = "",
    config_option: ConfigOption = None,
    set_: SetOption = None,
    num_tasks: Annotated[int | None, typer.Option(min=1, help="Test tasks to run.")] = None,
    temperature: Annotated[float | None, typer.Option(min=0, help="Sampling temperature; 0 is greedy.")] = None,
    trials: Annotated[
        int | None, typer.Option(min=1, max=64, help="Samples per task (eval.trials): pass@k and pass^k up to it.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for summary.json and trajectories.jsonl (every trajectory).")
    ] = None,
    policy: Annotated[
        str,
        typer.Option(help="Who plays: model, or reference (the env's reference calls) or idle (no call), no model."),
    ] = "model",
    quiet: ResultsQuiet = False,
    as_json: ResultsJson = False,
) -> None:
    """Evaluate a model on the environment's test split: success, tool use, and where the tasks say more,
    success per category and per request, Solve-P/R/F1. A served model: --set rollout.engine=openai.
    --policy reference or idle plays the environment's checks instead (toolrl env check runs both)."""
    from toolrl.config import resolve_config
    from toolrl.train import Workbench
    from toolrl.train.evaluate import breakdown, summarize

    cfg = resolve_config(config_given(config, config_option), set_)
    if trials is not None:
        cfg.eval.trials = trials
    temp = cfg.eval.sampling.temperature if temperature is None else temperature
    if cfg.eval.trials > 1 and temp == 0 and policy == "model":
        console.print(f"note: {cfg.eval.trials} trials at temperature 0 repeat one trajectory per task: pass@k and "
                      "pass^k equal the success rate (--temperature above 0)", highlight=False)  # fmt: skip
    _quiet_libraries()
    show = not (quiet or as_json)
    with console.status("evaluating") if show and console.is_terminal else nullcontext() as status:
        bench = Workbench.load(cfg, model_name=model or None, policy=policy)
        if show:
            bench.note = lambda line: console.print(line, highlight=False, markup=False)
        try:
            tasks, left = bench.eval_tasks(num_tasks)
            if left and not as_json:
                console.print(f"{len(left)} of {len(tasks) + len(left)} tasks have no reference: left out")

            def progress(line: str) -> None:  # on a terminal the spinner's text, else a line every ~10 s
                if status is not None:
                    status.update(line)
                elif show:
                    console.print(line, highlight=False, markup=False)

            trajs = bench.evaluation(temperature=temperature, tasks=tasks, progress=progress)
            success = bench.env.rubric.success
            stats, details = summarize(trajs, success), breakdown(trajs, success)
            records = [traj.to_record(bench.tokenizer, success) for traj in trajs]
        finally:
            bench.close()
    shown_temp: float | None = temp if policy == "model" else None  # a scripted policy samples nothing
    tasks_run = len({t.task.id for t in trajs})
    summary = {"model": model or cfg.model.name, "policy": policy, "temperature": shown_temp, "tasks": tasks_run,
               "trials": cfg.eval.trials, "trajectories": len(trajs)}  # fmt: skip
    summary |= {"left_out": len(left), **stats, **details}
    if out is not None:
        _write_eval(out, summary, trajs, records, len(trajs) * cfg.rollout.max_images)
    if as_json:
        print(json.dumps({**summary, "wall_s": round(wall_s(), 1)}))
        return
    trials_shown = f" x {cfg.eval.trials} trials" if cfg.eval.trials > 1 else ""
    sampled = f", temperature {temp:g}" if policy == "model" else ""
    title = f"{cfg.env.name} test split, {summary['tasks']} tasks{trials_shown}{sampled}"
    player = model or cfg.model.name if policy == "model" else f"{policy} policy"
    console.print(_eval_table(title, {player: stats}))
    for key in [k for k in ("by_env", "by_category", "by_request", "by_kind") if k in details]:
        label = {"by_env": "environment", "by_kind": "kind of request"}.get(key, key.removeprefix("by_"))
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
        console.print(f"wrote {out / 'summary.json'} and {out / 'trajectories.jsonl'}")
    console.print(f"wall time {wall_s():.0f} s")


def _write_eval(out: Path, summary: dict, trajs, records: list[dict], max_images: int) -> None:
    """An evaluation's summary.json and trajectories.jsonl (and a vision policy's images) in `out`."""
    from toolrl.runs.journal import write_images

    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_images(out, "eval", trajs, records, max_images)
    with (out / "trajectories.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
