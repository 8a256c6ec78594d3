"""The five stages in order, each a resumable step over the output folder.

`--stage NAME` runs one stage from the artifact of the one before it; `--all` runs the stages whose output is
missing or older than their input (what an interrupted build has left to do) and re-runs the rest only when
asked again with `--stage`. `build.json` records, per stage, its input's hash, its output's hash and its report.
An artifact the builder did not write as it is (a hand-written `1_scenarios.jsonl`, an edited tool file) is
the user's: `--all` keeps it as that stage's output and builds the later stages on it; `--stage` sets it aside
as `NAME.by-hand.SUFFIX` before writing its own. Nothing a user wrote is lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.build import decompose, deploy, documents, integrate, scale
from toolrl.build.artifacts import Workspace, content_hash
from toolrl.build.spec import BuildSpec
from toolrl.errors import ConfigError
from toolrl.registry import Registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[BuildSpec, Workspace, Callable[[str], Any]], dict[str, Any]]
    reads: tuple[str, ...]
    """Every file of the earlier stages it reads (their content is part of its input's hash: one left out here
    would leave the stage "up to date" after what it reads changed)."""
    writes: str
    """Its main artifact."""
    uses: Callable[[BuildSpec], Any]
    """The part of the spec it reads: a change elsewhere leaves it up to date (its inputs' hashes carry a change
    upstream to it)."""
    also: tuple[str, ...] = ()
    """Its other artifacts (facts.json beside the scenarios): an edit of any of them is the user's too."""


def _generative(spec: BuildSpec) -> Any:
    return spec.llm.model_dump(mode="json") if spec.source == "tasks" and spec.llm else None


def _decompose_uses(spec: BuildSpec) -> Any:
    keys = ("source", "seed", "train_per_scenario", "test_per_scenario", "scenarios", "synthetic", "tables", "tasks")
    return [spec.model_dump(mode="json", include=set(keys)), _generative(spec)]


def _integrate_uses(spec: BuildSpec) -> Any:
    model = spec.llm.model_dump(mode="json") if spec.integrate.method == "llm" and spec.llm else None
    return [spec.integrate.model_dump(mode="json"), model]


def _deploy_uses(spec: BuildSpec) -> Any:
    model = spec.llm.model_dump(mode="json") if spec.deploy.method == "llm" and spec.llm else None
    return [spec.deploy.model_dump(mode="json"), spec.scale.noise, model]


STAGES: Registry[Stage] = Registry("build stage", "--stage")
SCENARIOS = decompose.SCENARIOS_FILE
for _stage in (
    Stage("decompose", decompose.run, (), decompose.SCENARIOS_FILE, _decompose_uses,
          (decompose.FACTS_FILE, "tables.json")),
    Stage("documents", documents.run, (decompose.SCENARIOS_FILE, decompose.FACTS_FILE), documents.DOCUMENTS_FILE,
          lambda spec: [spec.source, spec.seed, _generative(spec)]),
    Stage("integrate", integrate.run, (documents.DOCUMENTS_FILE, decompose.FACTS_FILE), integrate.TOOLS_FILE,
          _integrate_uses, (integrate.MAPPING_FILE,)),
    Stage("scale", scale.run, (SCENARIOS, integrate.TOOLS_FILE, integrate.MAPPING_FILE), scale.TASKS_FILE,
          lambda spec: [spec.seed, spec.scale.model_dump(mode="json")], (scale.SCALED_TOOLS_FILE,)),
    Stage("deploy", deploy.run, (scale.SCALED_TOOLS_FILE, scale.TASKS_FILE, decompose.FACTS_FILE), deploy.MANIFEST,
          _deploy_uses, ("deploy/tools.jsonl", "deploy/tasks.jsonl", "deploy/tools/*.py")),
):  # fmt: skip
    STAGES.register(_stage.name)(_stage)
ORDER = [name for name in STAGES]


def _file_hash(path) -> str | None:
    return content_hash(path.read_bytes().decode("utf-8", "replace")) if path.is_file() else None


def source_files(spec: BuildSpec) -> list[Path]:
    """The user's files the first stage reads (tables, a tasks or decompositions file)."""
    from toolrl.build.formats import resolve

    files = [Path(table.path).expanduser() for table in spec.tables]
    return files + ([resolve(spec.tasks.path)] if spec.tasks is not None else [])


def _input_hash(spec: BuildSpec, ws: Workspace, stage: Stage) -> str:
    """The part of the spec the stage uses, the artifacts it reads and, for the first stage, the user's files (an
    edited table makes the build stale)."""
    parts: list[Any] = [stage.name, stage.uses(spec)]
    parts += [_file_hash(ws.path(name)) for name in stage.reads]
    if not stage.reads:
        parts += [_file_hash(path) for path in source_files(spec)]
    return content_hash(parts)


def llm_factory(spec: BuildSpec, ws: Workspace, ask=None) -> Callable[[str], Any]:
    """A StageLLM per stage (`ask`: a prompt -> reply function instead of spec.llm's backend, for tests)."""

    def make(stage: str):
        from toolrl.build.llm import StageLLM

        if spec.llm is None:
            raise ConfigError(f"stage {stage} needs a model: set llm (base_url + model, or path) in the spec")
        return StageLLM(spec.llm, ws, stage, ask)

    return make


def _output_hash(ws: Workspace, stage: Stage) -> str | None:
    return _file_hash(ws.path(stage.writes))


def _other_outputs(ws: Workspace, stage: Stage) -> dict[str, str | None]:
    """Each other artifact's hash (a pattern: each file it matches, less those set aside)."""
    names: list[str] = []
    for name in stage.also:
        if "*" in name:
            found = sorted(p.relative_to(ws.root).as_posix() for p in ws.root.glob(name))
            names += [n for n in found if ".by-hand." not in n]
        else:
            names.append(name)
    return {name: _file_hash(ws.path(name)) for name in names}


def edited(ws: Workspace, stage: Stage, done: dict[str, Any]) -> list[str]:
    """The stage's artifacts that are there and that this builder did not write as they are: written or edited by
    hand (a build made before outputs were recorded counts as the builder's)."""
    output = _output_hash(ws, stage)
    if "running" in done:  # a stage killed after writing its artifacts: the builder's, unfinished
        return []
    kept = done.get("edited", [stage.writes]) if done.get("kept") == "by hand" else []
    names = []
    if output is not None and (not done or stage.writes in kept or done.get("output", output) != output):
        names.append(stage.writes)
    recorded = done.get("outputs") or {}
    for name, now in _other_outputs(ws, stage).items():
        if now is not None and (name in kept or (name in recorded and recorded[name] != now)):
            names.append(name)
    return names


def by_hand(ws: Workspace, stage: Stage, done: dict[str, Any]) -> bool:
    """Any of the stage's artifacts was written or edited by hand (`edited`)."""
    return bool(edited(ws, stage, done))


def keep_by_hand(spec: BuildSpec, ws: Workspace, stage: Stage) -> dict[str, Any]:
    """Take a hand-written artifact as the stage's output: recorded, never overwritten by --all."""
    done = ws.read_json("build.json", {}).get(stage.name, {})
    names = edited(ws, stage, done)
    log.info("stage %s: %s written by hand: kept as the stage's output", stage.name, ", ".join(names))
    report = {"kept": "by hand", "edited": names, "input": _input_hash(spec, ws, stage)}
    report |= {"output": _output_hash(ws, stage), "outputs": _other_outputs(ws, stage)}
    ws.record(stage.name, report)
    return report


def _set_aside(ws: Workspace, stage: Stage, names: list[str]) -> None:
    """Before `--stage` replaces hand-written artifacts: keep each beside, as NAME.by-hand.SUFFIX."""
    for name in names:
        path = ws.path(name)
        kept = path.with_name(f"{path.stem}.by-hand{path.suffix}")
        path.replace(kept)
        log.warning("stage %s: %s was written by hand; kept as %s before the stage writes its own", stage.name,
                    name, kept.name)  # fmt: skip


def run_stage(spec: BuildSpec, ws: Workspace, name: str, ask=None) -> dict[str, Any]:
    stage = STAGES.lookup(name)
    _set_aside(ws, stage, edited(ws, stage, ws.read_json("build.json", {}).get(name, {})))
    started = time.perf_counter()
    log.info("stage %s: started", name)
    input_hash = _input_hash(spec, ws, stage)
    ws.record(name, {"running": input_hash})  # until its report replaces this, its artifact is unfinished
    report = stage.run(spec, ws, llm_factory(spec, ws, ask))
    report = {**report, "input": input_hash, "seconds": round(time.perf_counter() - started, 2)}
    report["output"] = _output_hash(ws, stage)
    report["outputs"] = _other_outputs(ws, stage)
    ws.record(name, report)
    log.info("stage %s: done in %.1f s: %s", name, report["seconds"], _brief(report))
    return report


def _brief(report: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in report.items() if isinstance(v, int | float) and k != "seconds")


def build(spec: BuildSpec, ws: Workspace, stages: list[str] | None = None, ask=None) -> dict[str, Any]:
    """Run `stages` (one or more names) or, with None, every stage whose artifact is missing or whose input
    changed since it ran; returns build.json."""
    ws.write_json("spec.json", spec.model_dump(mode="json"))
    if stages is not None:
        for name in stages:
            run_stage(spec, ws, name, ask)
        return ws.read_json("build.json", {})
    manifest = ws.read_json("build.json", {})
    for name in ORDER:
        stage = STAGES.lookup(name)
        done = manifest.get(name, {})
        if by_hand(ws, stage, done):  # a user's own artifact: the stages after it build on it
            keep_by_hand(spec, ws, stage)
        elif ws.path(stage.writes).is_file() and done.get("input") == _input_hash(spec, ws, stage):
            log.info("stage %s: up to date, skipped", name)
            continue
        else:
            run_stage(spec, ws, name, ask)
        manifest = ws.read_json("build.json", {})
    return manifest
