"""The five stages in order, each a resumable step over the output folder.

`--stage NAME` runs one stage from the artifact of the one before it; `--all` runs the stages whose output is
missing or older than their input (what an interrupted build has left to do) and re-runs the rest only when
asked again with `--stage`. `build.json` records, per stage, its input's hash and its report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
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
    """Files of the earlier stages it reads (their content is part of its input's hash)."""
    writes: str
    """Its main artifact."""


STAGES: Registry[Stage] = Registry("build stage", "--stage")
for _stage in (
    Stage("decompose", decompose.run, (), decompose.SCENARIOS_FILE),
    Stage("documents", documents.run, (decompose.SCENARIOS_FILE, decompose.FACTS_FILE), documents.DOCUMENTS_FILE),
    Stage("integrate", integrate.run, (documents.DOCUMENTS_FILE,), integrate.TOOLS_FILE),
    Stage("scale", scale.run, (integrate.TOOLS_FILE, integrate.MAPPING_FILE), scale.TASKS_FILE),
    Stage("deploy", deploy.run, (scale.SCALED_TOOLS_FILE, scale.TASKS_FILE), deploy.MANIFEST),
):
    STAGES.register(_stage.name)(_stage)
ORDER = [name for name in STAGES]


def _input_hash(spec: BuildSpec, ws: Workspace, stage: Stage) -> str:
    parts: list[Any] = [spec.model_dump(mode="json")]
    for name in stage.reads:
        path = ws.path(name)
        parts.append(content_hash(path.read_bytes().decode("utf-8", "replace")) if path.is_file() else None)
    return content_hash(parts)


def llm_factory(spec: BuildSpec, ws: Workspace, ask=None) -> Callable[[str], Any]:
    """A StageLLM per stage (`ask`: a prompt -> reply function instead of spec.llm's backend, for tests)."""

    def make(stage: str):
        from toolrl.build.llm import StageLLM

        if spec.llm is None:
            raise ConfigError(f"stage {stage} needs a model: set llm (base_url + model, or path) in the spec")
        return StageLLM(spec.llm, ws, stage, ask)

    return make


def run_stage(spec: BuildSpec, ws: Workspace, name: str, ask=None) -> dict[str, Any]:
    stage = STAGES.lookup(name)
    started = time.perf_counter()
    log.info("stage %s: started", name)
    input_hash = _input_hash(spec, ws, stage)
    report = stage.run(spec, ws, llm_factory(spec, ws, ask))
    report = {**report, "input": input_hash, "seconds": round(time.perf_counter() - started, 2)}
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
        if ws.path(stage.writes).is_file() and done.get("input") == _input_hash(spec, ws, stage):
            log.info("stage %s: up to date, skipped", name)
            continue
        run_stage(spec, ws, name, ask)
        manifest = ws.read_json("build.json", {})
    return manifest
